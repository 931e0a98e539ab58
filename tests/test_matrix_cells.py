"""Every matrix cell ends in a row: a crash (in the reference run too) is a kill, a patch
that no longer applies is a harness error, an isolated cell past its watchdog is a
timeout -- and the matrix goes on. The isolated (CUDA) path runs here on the CPU with a
stand-in for the cell's process."""
from __future__ import annotations

import dataclasses
import json
import sys

import pytest

import scenarios.matrix as mx
from scenarios.mutations import BY_NAME

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
    assert "snippet occurs 0 times" in rows[STALE.name]["detail"]
    assert rows[GOOD]["status"] == "killed"
    assert res["harness_errors"] == 1 and not mx.matrix_ok(res)
    line = mx.problem_line(res)
    assert "\n" not in line and f"{STALE.name} (harness-error)" in line
    assert "ERROR" in mx.format_matrix(res)


# --- isolated cells (one process each, as on CUDA) ----------------------------------------

def _fake_cells(monkeypatch, behaviour):
    """Cells run ``behaviour[name]`` (python code) in a fresh interpreter instead."""
    def command(kind, name, backend, target="impl"):
        code = behaviour.get(name)
        if code is None:
            row = ({"probe": name, "finding": None, "oracle": None, "status": "clean"}
                   if kind == "probe" else
                   {"name": name, "summary": "", "source": "", "killed": True,
                    "status": "killed", "caught_by": "stale-value", "probe": "seed-eager",
                    "detail": "seed 0: ...", "seconds": 0.01})
            code = f"print({json.dumps(json.dumps(row))})"
        return [sys.executable, "-c", code]
    monkeypatch.setattr(mx, "_cell_command", command)


def test_isolated_cells_report_harness_errors_and_watchdog_exits(fake_probes, monkeypatch):
    from harness.runtime.cuda import WATCHDOG_EXIT
    err = json.dumps({"error": "mutation x: snippet occurs 0 times"})
    _fake_cells(monkeypatch, {
        "stash-drops-accept-lens": f"import os; print({json.dumps(err)}, flush=True); "
                                   f"os._exit({mx.HARNESS_ERROR})",
        "merge-order-swapped": f"import os; os._exit({WATCHDOG_EXIT})",
        "grammar-ngram": f"import os; os._exit({WATCHDOG_EXIT})",
    })
    names = ["stash-drops-accept-lens", "merge-order-swapped", GOOD]
    res = mx.run_matrix("sim", mutations=[BY_NAME[n] for n in names], isolate=True)
    rows = _rows(res)
    assert rows["stash-drops-accept-lens"]["status"] == "harness-error"
    assert "snippet occurs 0 times" in rows["stash-drops-accept-lens"]["detail"]
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
