"""The process around the commands: signals at any moment and standard streams that are
closed, full or gone end in a clean exit (130 / 143 / 2 / the command's own), one line,
no traceback, the previous report set intact. Subprocesses only where a case needs one
(a signal to a whole process, a closed descriptor); the rest runs in this process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from seams import signals
from seams.paths import REPO_ROOT as ROOT
from specrace_process import cli_env as _env, pytest_plugin_args


# --- the signal policy, in this process (handlers restored after) ---------------------

@pytest.fixture
def policy():
    saved = {s: signal.getsignal(s) for s in signals.SIGNALS}
    hook, state = sys.unraisablehook, dict(signals._state)
    signals.install()
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
        sys.unraisablehook = hook
        signals._state.clear()
        signals._state.update(state)


def _spin():
    for _ in range(100_000):  # the handler runs between bytecodes, i.e. in here
        pass


def test_a_signal_that_lands_in_a_finaliser_is_honoured_at_the_next_checkpoint(policy,
                                                                              capsys):
    class Finalised:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            _spin()

    Finalised()  # __del__ runs now; the Interrupted raised in it cannot propagate
    assert signals.pending() == signal.SIGTERM
    with pytest.raises(signals.Interrupted) as info:
        signals.checkpoint()
    assert info.value.status == 143
    assert "Exception ignored" not in capsys.readouterr().err


def test_a_critical_section_defers_the_signal_and_honours_it_after(policy):
    done = []
    with pytest.raises(signals.Interrupted) as info:
        with signals.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            _spin()
            assert signals.pending() == signal.SIGINT
            done.append("the whole section ran")
    assert done and info.value.status == 130


def test_without_the_policy_a_deferred_signal_meets_the_handler_it_would_have():
    got = []
    old = signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
    try:
        with signals.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            _spin()
            assert got == []
        _spin()
        assert got == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, old)


# --- a repro interrupted, through the console script ----------------------------------

def _old_set(folder, trials):
    """A set (no trace, nothing run) under the name that ``specrace repro
    ngram-filter-race --backend sim --trials N`` writes."""
    from harness.trials.results import ReproResult
    from harness.report import write_reports
    from scenarios.resolve import RunRequest, resolve
    run = resolve(RunRequest("ngram-filter-race", backend="sim", trials=trials))
    sc = run.scenario
    ident = run.identity()
    result = ReproResult(sc.name, ident["variant"], "fine", "sim", ident["policy"], None, 0,
                         trials, 0, None, stall_plan=list(run.stalls),
                         host_order=dict(run.host_order), command="the old set")
    assert result.identity() == ident
    paths = write_reports(result, str(folder))
    with open(paths["json"], encoding="utf-8") as f:
        return paths["json"], json.load(f)["run_id"]


def _console(args, patch=""):
    code = textwrap.dedent(patch) + textwrap.dedent(f"""
        import sys
        sys.argv = ["specrace"] + {list(args)!r}
        from specrace.console import console_main
        console_main()
    """)
    # a patch lives in this process only: started under the pinned hash seed, the console
    # runs on in it instead of re-executing (specrace.console._pin_hash_seed)
    env = _env(PYTHONHASHSEED="0") if patch else _env(PYTHONHASHSEED="random")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def test_a_signal_during_the_trials_is_one_line_and_keeps_the_old_set(tmp_path):
    sig = signal.SIGTERM  # SIGINT takes the same path (the import test below sends one)
    path, run_id = _old_set(tmp_path, 20)
    proc = _console(["repro", "ngram-filter-race", "--backend", "sim", "--trials", "20",
                     "--report-dir", str(tmp_path)])
    first = proc.stderr.readline()  # the first trial's progress line: trials are running
    assert "1/20" in first, first
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err and err.strip().splitlines() == [
        f"specrace: interrupted ({signal.Signals(sig).name})"]
    with open(path, encoding="utf-8") as f:
        assert json.load(f)["run_id"] == run_id
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(os.path.dirname(path))]


# (a signal inside the report write, under the policy: test_report_set.py's
# test_sigterm_under_the_policy_is_honoured_after_the_write)


def test_a_signal_while_the_cli_is_still_importing_is_one_line():
    proc = _console(["list"], patch="""
        import os, signal, sys
        class Trip:  # SIGINT the moment specrace.cli starts to import
            def find_spec(self, name, path=None, target=None):
                if name == "specrace.cli":
                    os.kill(os.getpid(), signal.SIGINT)
                    for _ in range(100000):
                        pass
                return None
        sys.meta_path.insert(0, Trip())
    """)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["specrace: interrupted (SIGINT)"] and out == ""


# --- standard streams closed, full or gone --------------------------------------------

# --help writes to stdout and an unknown command is a usage error: neither imports torch
SCRIPT = """
S="$PY -m specrace.cli"
$S --help >&- 2>closed.err; echo "closed-stdout $?"
$S --help >/dev/full 2>full.err; echo "full-stdout $?"
$S frobnicate 2>&- >closed-stderr.out; echo "closed-stderr $?"
(sleep 0.5; $S --help 2>pipe.err; echo "pipe-gone $?" >pipe.rc) | true
"""


def test_closed_full_or_gone_streams_exit_cleanly(tmp_path):
    proc = subprocess.run(["bash", "-c", SCRIPT], capture_output=True, text=True,
                          cwd=tmp_path, env={**_env(), "PY": sys.executable}, timeout=300)
    codes = dict(line.split() for line in proc.stdout.splitlines())
    codes.update(dict([(tmp_path / "pipe.rc").read_text().split()]))
    assert codes == {"closed-stdout": "2", "full-stdout": "2", "closed-stderr": "2",
                     "pipe-gone": "0"}, (codes, proc.stderr)
    err = {n: (tmp_path / n).read_text() for n in ("closed.err", "full.err", "pipe.err")}
    assert err["closed.err"].splitlines() == [
        "specrace: error: cannot write the output to stdout: Bad file descriptor"]
    assert err["full.err"].splitlines() == [
        "specrace: error: cannot write the output to stdout: No space left on device"]
    assert err["pipe.err"] == ""  # the reader left: not an error, no traceback
    # the error line had nowhere to go: it did not go to stdout instead
    assert (tmp_path / "closed-stderr.out").read_text() == ""


def test_pytest_options_are_a_usage_error_before_collection(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pytest", *pytest_plugin_args(),
                           "--specrace-soak", "-1",
                           "-q", "-p", "no:xdist", str(tmp_path)],
                          capture_output=True, text=True, env=_env(), cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "--specrace-soak: -1 is out of range" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def _policy_in_place(pid: int) -> bool:
    """Has process ``pid`` installed the signal policy? (Its SIGTERM is caught: Python
    itself only ever catches SIGINT; /proc/PID/status lists the caught signals.)"""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(int(ln.split()[1], 16) for ln in f if ln.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(caught & (1 << (signal.SIGTERM - 1)))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
@pytest.mark.long
def test_a_signal_at_any_moment_from_the_first_instruction_is_one_line():
    """20 moments from the console script's first instruction (its policy in place, ~30
    ms after exec on an idle machine; before it, only the interpreter's own start-up) to
    1.5 s in (imports, resolving, trials): each SIGINT / SIGTERM is status 130 / 143 and
    one line, never a traceback, a lost signal or a finished run. Moments count from the
    policy's arrival, not from exec: on a loaded machine start-up alone can take longer."""
    import random
    import time
    rng = random.Random(44)
    script = os.path.join(os.path.dirname(sys.executable), "specrace")
    if not os.path.exists(script):
        pytest.skip("the console script is not installed here (pip install -e .)")
    for _ in range(20):
        moment, sig = rng.uniform(0.0, 1.5), rng.choice([signal.SIGINT, signal.SIGTERM])
        proc = subprocess.Popen([script, "repro", "ngram-filter-race", "--trials", "10000",
                                 "--no-report", "--backend", "sim"], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not _policy_in_place(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.0005)
        time.sleep(moment)
        assert proc.poll() is None, "10,000 trials cannot be over this soon"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
        lines = [ln for ln in err.splitlines() if " on sim: " not in ln]  # progress
        assert proc.returncode == 128 + sig, (moment, sig, proc.returncode, err[-400:])
        assert lines == [f"specrace: interrupted ({signal.Signals(sig).name})"], (moment, err)


@pytest.mark.parametrize("var, value", [("SPECRACE_TARGET", "nope"),
                                         ("SPECRACE_BACKEND", "nonsense"),
                                         ("SPECRACE_TEST_WATCHDOG_S", "soon"),
                                         ("SPECRACE_TEST_WATCHDOG_S", "inf"),
                                         ("SPECRACE_TEST_WATCHDOG_S", "-1")])
def test_a_bad_setting_is_a_usage_error_before_collection(tmp_path, var, value):
    """Not a failure inside a state machine's Hypothesis report: pytest stops at
    configure, naming the setting (exit 4, a usage error)."""
    test = tmp_path / "test_x.py"
    test.write_text("def test_x():\n    pass\n")
    env = {**_env(), var: value}
    proc = subprocess.run([sys.executable, "-m", "pytest", *pytest_plugin_args(), "-q", "-p",
                           "no:cacheprovider", str(test)], capture_output=True, text=True,
                          env=env, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 4, (proc.stdout[-400:], proc.stderr[-400:])
    assert var in proc.stderr and "Traceback" not in proc.stderr
