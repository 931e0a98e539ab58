"""Every failure is a verdict or one line with exit code 2, never a traceback -- through
the real entry point, in a subprocess. Where a test needs a bug the tree does not have
(an engine that crashes in both runs, a mutation that no longer applies, a full disk), a
few lines patch it in before ``specrace.cli.main`` runs, as a user's local change would."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess

import pytest

from specrace_process import specrace
MAX_SEED_POLICY = "pct(9223372036854775807,3)"


def _no_traceback(proc):
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr


def _one_error_line(proc, needle=""):
    _no_traceback(proc)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("specrace: error:")]
    assert len(errors) == 1, proc.stderr
    assert needle in errors[0], errors[0]
    return errors[0]


def _load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# --- one report, written by the CLI, shared by the tests below ---------------------------

REPRO_ARGS = ["repro", "ngram-filter-race", "--variant", "fixed", "--backend", "sim",
              "--policy", MAX_SEED_POLICY, "--trials", "2"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli-reports")
    proc = specrace(*REPRO_ARGS, "--report-dir", str(out))
    return proc, _set_json(out)


def _set_json(folder):
    """The one report set's JSON in ``folder`` (its folder name carries the settings)."""
    sets = [p for p in folder.iterdir() if not p.name.startswith(".")]
    assert len(sets) == 1, sets
    return sets[0] / "report.json"


def test_policy_seed_at_the_top_of_its_range_runs_every_trial(report):
    proc, path = report
    assert proc.returncode == 0, proc.stderr
    _no_traceback(proc)
    doc = _load(path)
    assert doc["trials"] == 2 and doc["outcome"] == "clean"
    assert [t["trial"] for t in doc["trial_results"]] == [0, 1]


def test_trial_policies_stay_in_the_policy_seed_range():
    from harness.policies import MAX_POLICY_SEED, parse_policy
    top = parse_policy(MAX_SEED_POLICY)
    seeds = [top.offset(i).seed for i in range(3)]
    assert len(set(seeds)) == 3 and all(0 <= s <= MAX_POLICY_SEED for s in seeds)
    assert str(parse_policy("random(7)").offset(2)) == "random(9)"
    assert parse_policy("lazy").offset(5) == parse_policy("lazy")


def test_the_report_command_is_shell_quoted(report):
    proc, path = report
    cmd = _load(path)["command"]
    assert shlex.split(cmd) == ["specrace", *REPRO_ARGS, "--report-dir",
                                str(path.parent.parent)]
    assert f"'{MAX_SEED_POLICY}'" in cmd
    if shutil.which("bash"):
        assert subprocess.run(["bash", "-n", "-c", cmd], timeout=60).returncode == 0


def test_replay_shows_progress_and_escapes_unprintable_report_fields(report, tmp_path):
    _, path = report
    doc = _load(path)
    doc["first_divergence"] = {"kind": "crash", "rid": None, "step": None,
                               "observed": "\ud800 \u202e \x85 \x1b[31m"}
    crafted = tmp_path / "crafted.json"
    crafted.write_text(json.dumps(doc))  # ensure_ascii: the file itself is plain ASCII
    proc = specrace("replay", str(crafted))
    _no_traceback(proc)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("replay: DIFFERENT verdict")
    assert "\\ud800" in lines[0] and "\\u202e" in lines[0] and "\x1b" not in lines[0]
    assert "specrace: replay: 2/2" in proc.stderr.splitlines()  # progress, trial by trial


def test_replay_of_the_report_is_identical(report):
    from specrace.replay import replay_report
    _, path = report
    seen = []
    verdict = replay_report(str(path), lambda n, total=None: seen.append(n))
    assert verdict["same"], verdict["summary"]
    assert seen == [0, 1, 2]


def test_a_report_may_not_ask_for_more_trials_than_repro_allows(report, tmp_path):
    from harness.trials.repro import MAX_TRIALS
    from specrace.replay import load_report
    from harness.report.schema import REPORT_SCHEMA
    assert REPORT_SCHEMA["properties"]["trials"]["maximum"] == MAX_TRIALS
    _, path = report
    for trials in (MAX_TRIALS + 1, 100_000):
        p = tmp_path / f"t{trials}.json"
        p.write_text(json.dumps({**_load(path), "trials": trials}))
        with pytest.raises(ValueError, match="'trials'"):
            load_report(str(p))
    from specrace.cli import main
    assert main(["repro", "ngram-filter-race", "--trials", str(MAX_TRIALS + 1)]) == 2


def test_repro_and_replay_arm_the_gpu_watchdog(report, monkeypatch, capsys):
    """The wiring (on the simulator it is a no-op; the watchdog itself is tested in
    tests/harness/runtime/test_cuda_backend.py)."""
    import contextlib

    from specrace.cli import main
    from harness.runtime import limits
    armed = []

    def record(backend, trials, stall_ms, what):
        armed.append((backend, trials, stall_ms, what))
        return contextlib.nullcontext()

    monkeypatch.setattr(limits, "gpu_watchdog", record)
    _, path = report
    assert main(["repro", "ngram-filter-race", "--variant", "fixed", "--backend", "sim",
                 "--trials", "1", "--stall-ms", "1.5", "--json", "--no-report"]) == 0
    assert main(["replay", "--json", str(path)]) == 0
    capsys.readouterr()
    assert armed == [("sim", 1, 1.5, "specrace repro"), ("sim", 2, None, "specrace replay")]


# --- bad input before any work: one line, exit 2 ------------------------------------------

def test_a_policy_longer_than_a_report_may_hold_is_refused():
    from harness.policies import MAX_POLICY_CHARS
    from harness.report.schema import REPORT_SCHEMA
    assert REPORT_SCHEMA["properties"]["policy"]["maxLength"] == MAX_POLICY_CHARS
    long = "stall(" + ",".join(["forward"] * 40) + ")"
    assert len(long) > MAX_POLICY_CHARS
    proc = specrace("repro", "ngram-filter-race", "--policy", long, "--trials", "1",
                    "--no-report")
    assert proc.returncode == 2
    _one_error_line(proc, f"longer than {MAX_POLICY_CHARS} characters")
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == ""


def _bad_dirs(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    dirs = {"file": (str(a_file), "not a directory"),
            "devnull": ("/dev/null", "not a directory"),
            "too-long": (str(tmp_path / ("n" * 300)), "too long")}
    return dirs


def test_a_report_dir_that_cannot_take_reports_fails_before_the_run(tmp_path):
    where, needle = _bad_dirs(tmp_path)["file"]
    proc = specrace("repro", "ngram-filter-race", "--trials", "1", "--report-dir", where)
    assert proc.returncode == 2
    _one_error_line(proc, needle)
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # no trial ran
    assert proc.stdout == ""


@pytest.mark.parametrize("case", ["devnull", "too-long"])
def test_more_report_dirs_that_cannot_take_reports(tmp_path, capsys, case):
    from specrace.cli import main
    where, needle = _bad_dirs(tmp_path)[case]
    assert main(["repro", "ngram-filter-race", "--trials", "1", "--report-dir", where]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and needle in err  # one line, no progress


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root writes into read-only folders")
def test_a_read_only_report_dir_fails_before_the_run(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    proc = specrace("repro", "ngram-filter-race", "--trials", "1", "--report-dir", str(ro))
    assert proc.returncode == 2
    _one_error_line(proc, "ermission denied")


def test_a_write_error_after_the_run_keeps_the_verdict(tmp_path):
    full_disk = """
        import errno
        import harness.report.reportset as rs
        def write_set(*a, **k):
            raise OSError(errno.ENOSPC, "No space left on device")
        rs.write_set = write_set
        import harness.report
        harness.report.write_set = write_set
    """
    proc = specrace("repro", "ngram-filter-race", "--variant", "fixed", "--trials", "1",
                    "--json", "--report-dir", str(tmp_path), patch=full_disk)
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["outcome"] == "clean"  # the verdict is still printed
    _one_error_line(proc, "No space left on device")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_bad_cycles_per_ms_setting_is_exit_2():
    proc = specrace("repro", "ngram-filter-race", "--trials", "1", "--no-report",
                    SPECRACE_CYCLES_PER_MS="1e12")
    assert proc.returncode == 2
    _one_error_line(proc, "SPECRACE_CYCLES_PER_MS")
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("var,value", [("SPECRACE_CYCLES_PER_MS", "nan"),
                                       ("SPECRACE_CYCLES_PER_MS", "inf"),
                                       ("SPECRACE_CYCLES_PER_MS", "many"),
                                       ("SPECRACE_WATCHDOG_S", "-5"),
                                       ("SPECRACE_WATCHDOG_S", "soon")])
def test_bad_limit_settings_are_one_line(monkeypatch, capsys, var, value):
    from specrace.cli import main
    monkeypatch.setenv(var, value)
    for args in (["repro", "ngram-filter-race", "--no-report"], ["matrix"], ["litmus"]):
        assert main(args) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and var in err


# --- a crash in both runs is no verdict: the code does not fit the target ----------------

CRASH_IN_BOTH_RUNS = r"""
    import impl.scheduler as S
    _step = S.Scheduler.step
    def step(self):
        if self.iteration == 1:
            raise RuntimeError("staging broke \ud800 \u202e \x85")
        return _step(self)
    S.Scheduler.step = step
"""


@pytest.mark.parametrize("expect", ["race", "clean"])
def test_a_crash_of_the_reference_run_is_exit_2_and_no_report(tmp_path, expect):
    """The engine fails without any overlap: nothing about a race was shown either way,
    so there is no verdict to print or write -- one line, exit 2, whatever was expected,
    its text sanitised like every other line."""
    proc = specrace("repro", "ngram-filter-race", "--trials", "2", "--expect", expect,
                    "--report-dir", str(tmp_path), patch=CRASH_IN_BOTH_RUNS)
    _no_traceback(proc)
    assert proc.returncode == 2, proc.stderr
    assert "reproduced" not in proc.stdout + proc.stderr
    assert "does not fit the impl target" in proc.stderr
    assert "engine crashed in the synchronous reference run" in proc.stderr
    assert "\\ud800" in proc.stderr and "\u202e" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


# --- the matrix goes on past a mutation that no longer applies ----------------------------

STALE_MUTATION = """
    import dataclasses
    import matrix.run as mx
    import mutations as mutations
    from mutations import BY_NAME
    good = BY_NAME["copy-done-not-recorded"]
    stale = dataclasses.replace(BY_NAME["stash-drops-accept-lens"],
                                edits=(("a line a local change removed", "pass"),))
    mutations.MUTATIONS[:] = [stale, good]
    mx.PROBES = {"seed-eager": dataclasses.replace(mx.PROBES["seed-eager"], seeds=(0,))}
"""


def test_matrix_reports_a_stale_mutation_per_cell_and_runs_the_rest():
    proc = specrace("matrix", patch=STALE_MUTATION)
    _no_traceback(proc)
    assert proc.returncode == 1
    rows = {ln.split()[1]: ln.split()[0] for ln in proc.stdout.splitlines()[1:]}
    assert rows["stash-drops-accept-lens"] == "ERROR"
    assert rows["copy-done-not-recorded"] == "killed"
    summary = [ln for ln in proc.stderr.splitlines() if ln.startswith("specrace: matrix:")]
    assert len(summary) == 1 and "stash-drops-accept-lens (harness-error)" in summary[0]
