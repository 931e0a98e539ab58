"""Every matrix cell ends in a row: a crash (in the reference run too) is a kill, a patch
that no longer applies is a harness error, an isolated cell past its watchdog is a
timeout -- and the matrix goes on. The isolated (CUDA) path runs here on the CPU with a
stand-in for the cell's process."""
from __future__ import annotations

import collections
import dataclasses
import json
import sys

import pytest

import matrix.run as mx
from harness.trials import reference
from mutations import BY_NAME

GOOD = "copy-done-not-recorded"
STALE = dataclasses.replace(BY_NAME["stash-drops-accept-lens"],
                            edits=(("a line a local change removed", "pass"),))


@pytest.fixture
def small_matrix(monkeypatch):
    """Two probes on one seed each: the fixed code's half of the matrix stays cheap."""
    monkeypatch.setattr(mx, "PROBES", {k: dataclasses.replace(mx.PROBES[k], seeds=(0,))
                                       for k in ("seed-eager", "grammar-ngram")})


@pytest.fixture
def fake_probes(monkeypatch):
    """Every probe, for cells whose processes are stand-ins anyway."""
    monkeypatch.setattr(mx, "PROBES", dict(mx.PROBES))


def _rows(res):
    return {r["name"]: r for r in res["mutations"]}


def test_a_crash_in_both_runs_is_a_kill_and_the_matrix_goes_on(small_matrix, monkeypatch):
    from impl.grammar import GrammarBackend

    def broken(self, schema):
        raise RuntimeError("grammar compiler gone")

    # A bug present in the reference run too (it compiles the same grammars).
    monkeypatch.setattr(GrammarBackend, "grammar_for_json_schema", broken)
    # A reference an earlier test on this worker computed with the grammar intact would be
    # reused (the break is not part of its key), and the crash would be the trial's.
    monkeypatch.setattr(reference, "_REFERENCE_CACHE", collections.OrderedDict())
    res = mx.run_matrix("sim", mutations=[BY_NAME["grammar-mask-not-applied"], BY_NAME[GOOD]])
    fixed = {f["probe"]: f for f in res["fixed"]}
    assert fixed["seed-eager"]["finding"] is None
    assert fixed["grammar-ngram"]["oracle"] == "crash"
    assert "synchronous reference run" in fixed["grammar-ngram"]["finding"]
    rows = _rows(res)
    assert rows["grammar-mask-not-applied"]["status"] == "killed"
    assert rows["grammar-mask-not-applied"]["caught_by"] == "crash"
    assert rows[GOOD]["status"] == "killed"


def test_a_stale_mutation_is_a_harness_error_row(small_matrix):
    res = mx.run_matrix("sim", mutations=[STALE, BY_NAME[GOOD]])
    rows = _rows(res)
    assert rows[STALE.name]["status"] == "harness-error" and not rows[STALE.name]["killed"]
    assert "occurs 0 times" in rows[STALE.name]["detail"]
    assert rows[GOOD]["status"] == "killed"
    assert res["harness_errors"] == 1 and not mx.matrix_ok(res)
    line = mx.problem_line(res)
    assert "\n" not in line and f"{STALE.name} (harness-error)" in line
    assert "ERROR" in mx.format_matrix(res)


# --- isolated cells (one process each, as on CUDA) ----------------------------------------

def _fake_cells(monkeypatch, behaviour, commands=None):
    """A child runs ``behaviour[name]`` (python code; ``FIRST``: is it the child's first
    cell?) for a cell instead of the cell; the others report a clean probe / a killed
    mutation, in the children's line protocol."""
    def command(cells, backend, target="impl"):
        if commands is not None:
            commands.append([n for _, n in cells])
        code = ["import json, os, sys"]
        for i, (kind, name) in enumerate(cells):
            if name in behaviour:
                code.append(f"FIRST = {i == 0}")  # the child's first cell?
                code.append(behaviour[name])
                continue
            row = ({"probe": name, "finding": None, "oracle": None, "status": "clean"}
                   if kind == "probe" else
                   {"name": name, "summary": "", "source": "", "killed": True,
                    "status": "killed", "caught_by": "stale-value", "probe": "seed-eager",
                    "detail": "seed 0: ...", "seconds": 0.01})
            line = json.dumps({"cell": [kind, name], "row": row})
            code.append(f"print({json.dumps(line)}, flush=True)")
        return [sys.executable, "-c", "\n".join(code)]
    monkeypatch.setattr(mx, "_cell_command", command)


def test_isolated_cells_report_harness_errors_and_watchdog_exits(fake_probes, monkeypatch):
    from harness.runtime.cuda import WATCHDOG_EXIT
    err = json.dumps({"cell": ["mutation", "stash-drops-accept-lens"],
                      "error": "mutation x: snippet occurs 0 times"})
    _fake_cells(monkeypatch, {
        "stash-drops-accept-lens": f"print({json.dumps(err)}, flush=True)",
        "merge-order-swapped": f"import os; os._exit({WATCHDOG_EXIT})",
        "grammar-ngram": f"import os; os._exit({WATCHDOG_EXIT})",
    })
    names = ["stash-drops-accept-lens", "merge-order-swapped", GOOD]
    res = mx.run_matrix("sim", mutations=[BY_NAME[n] for n in names], isolate=True)
    rows = _rows(res)
    assert rows["stash-drops-accept-lens"]["status"] == "harness-error"
    assert "occurs 0 times" in rows["stash-drops-accept-lens"]["detail"]
    assert rows["merge-order-swapped"]["status"] == "timeout"
    assert not rows["merge-order-swapped"]["killed"]
    assert rows[GOOD]["status"] == "killed"
    fixed = {f["probe"]: f for f in res["fixed"]}
    assert fixed["grammar-ngram"]["status"] == "timeout"
    assert res["harness_errors"] == 1 and res["timeouts"] == 2 and not mx.matrix_ok(res)


def test_an_isolated_cell_that_hangs_is_killed_and_is_a_timeout_row(fake_probes, monkeypatch):
    monkeypatch.setenv("SPECRACE_WATCHDOG_S", "0.2")
    monkeypatch.setattr(mx, "CELL_GRACE_S", 0.3)
    _fake_cells(monkeypatch, {GOOD: "import time; time.sleep(60)"})
    res = mx.run_matrix("sim", mutations=[BY_NAME[GOOD]], isolate=True)
    row = _rows(res)[GOOD]
    assert row["status"] == "timeout" and "0.2 s" in row["detail"]


def test_cuda_cells_share_one_process_until_one_takes_it_down(fake_probes, monkeypatch):
    """On CUDA every cell runs in one child; a cell that aborts the child (a device-side
    assert makes even a free abort) is killed by the crash oracle, and the cells after it
    go on in a fresh child; one that leaves CUDA poisoned ends its child cleanly
    (POISONED) and the rest continue likewise."""
    commands = []
    names = ["stash-drops-accept-lens", "merge-order-swapped", GOOD]
    _fake_cells(monkeypatch, {
        "merge-order-swapped": "sys.stderr.write('CUDA error: device-side assert triggered\\n'); "
                               "os.abort()",
    }, commands)
    monkeypatch.setattr(mx, "probes_for", lambda target: {})
    res = mx.run_matrix("cuda", mutations=[BY_NAME[n] for n in names])
    rows = _rows(res)
    assert rows["merge-order-swapped"]["status"] == "killed"
    assert rows["merge-order-swapped"]["caught_by"] == "crash"
    assert "device-side assert" in rows["merge-order-swapped"]["detail"]
    assert rows["stash-drops-accept-lens"]["status"] == rows[GOOD]["status"] == "killed"
    # one child; the death confirmed alone (cells ran before it in that child); then a
    # fresh child for the rest
    assert commands == [names, ["merge-order-swapped"], [GOOD]]


def test_a_late_death_is_not_blamed_on_the_cell_it_happened_in(fake_probes, monkeypatch):
    """An earlier cell's device error can abort the child later, in another cell (a
    destructor at a garbage collection): a death after other cells ran in the child is
    the cell's only if it dies alone too -- here it does not, and its own verdict (a
    stale value) is the row."""
    names = ["stash-drops-accept-lens", "merge-order-swapped", GOOD]
    survived = json.dumps({"cell": ["mutation", "merge-order-swapped"],
                           "row": {"name": "merge-order-swapped", "killed": False,
                                   "status": "survived", "caught_by": None, "probe": None,
                                   "detail": "", "seconds": 0.1, "summary": "",
                                   "source": ""}})
    _fake_cells(monkeypatch, {
        "merge-order-swapped": f"print({json.dumps(survived)}, flush=True) if FIRST "
                               f"else os.abort()"})
    monkeypatch.setattr(mx, "probes_for", lambda target: {})
    res = mx.run_matrix("cuda", mutations=[BY_NAME[n] for n in names])
    rows = _rows(res)
    assert rows["merge-order-swapped"]["status"] == "survived"  # not a crash kill
    assert rows["stash-drops-accept-lens"]["status"] == rows[GOOD]["status"] == "killed"


def test_a_cell_that_poisons_cuda_ends_its_child_and_the_rest_go_on(fake_probes, monkeypatch):
    commands = []
    names = ["stash-drops-accept-lens", "merge-order-swapped", GOOD]
    line = json.dumps({"cell": ["mutation", "merge-order-swapped"],
                       "row": {"name": "merge-order-swapped", "killed": True,
                               "status": "killed", "caught_by": "crash", "probe": None,
                               "detail": "device-side assert", "seconds": 0.1,
                               "summary": "", "source": ""}})
    _fake_cells(monkeypatch, {"merge-order-swapped":
                              f"print({json.dumps(line)}, flush=True); os._exit({mx.POISONED})"},
                commands)
    monkeypatch.setattr(mx, "probes_for", lambda target: {})
    res = mx.run_matrix("cuda", mutations=[BY_NAME[n] for n in names])
    assert all(r["status"] == "killed" for r in res["mutations"])
    assert commands == [names, [GOOD]]


def test_a_real_child_runs_its_cells_in_one_process():
    import subprocess
    p = subprocess.run([sys.executable, "-m", "matrix.run", "sim", "impl",
                        "mutation:copy-done-not-recorded", "mutation:merge-order-swapped"],
                       capture_output=True, text=True, timeout=300)
    rows = [json.loads(ln) for ln in p.stdout.splitlines()]
    assert p.returncode == 0, p.stderr
    assert [r["cell"][1] for r in rows] == ["copy-done-not-recorded", "merge-order-swapped"]
    assert all(r["row"]["status"] == "killed" for r in rows)


def test_an_equivalent_mutation_is_shown_by_its_probes_never_taken_on_trust():
    """A seeded bug declared equivalent still runs every probe: surviving them is its
    row (not counted, named with the reason); a kill turns the declaration into a
    harness error -- the reason was wrong."""
    import dataclasses
    from matrix.table import assemble, cell_failed, matrix_ok
    from mutations import BY_NAME
    harmless = dataclasses.replace(BY_NAME["stash-drops-accept-lens"], name="harmless",
                                   probes=("seed-eager",), equivalent="said harmless",
                                   edits=(("        self.accept_lens_buf[future_indices] = "
                                           "payload.accept_lens\n",
                                           "        self.accept_lens_buf[future_indices] = "
                                           "payload.accept_lens  # unchanged\n"),))
    harmful = dataclasses.replace(BY_NAME["stash-drops-accept-lens"], probes=("seed-eager",),
                                  equivalent="said harmless")
    quiet = mx.mutation_row(harmless, "sim")
    assert quiet["status"] == "equivalent" and quiet["detail"] == "said harmless"
    assert not cell_failed(("mutation", "harmless"), quiet)
    loud = mx.mutation_row(harmful, "sim")
    assert loud["status"] == "harness-error" and "declared equivalent" in loud["detail"]
    res = assemble("sim", "impl", [("mutation", "harmless")], [quiet], 0.0)
    assert res["total"] == 0 and res["equivalent"][0]["name"] == "harmless" and matrix_ok(res)
