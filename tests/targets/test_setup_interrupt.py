"""An interrupted release set-up (``python -m targets.envs TARGET setup V``): SIGINT or
SIGTERM is one line and exit 130 / 143, its staging folder goes and its running step's
whole process group (pip and what pip started) is killed first; a set-up killed outright
takes its step with it (Linux), and the next set-up removes the staging folder it left --
never one a live set-up holds.

No network and no pip: the set-up's build is a step of the test's, a Python child that
says it started (a file beside it) and then waits to be killed, writing into the staging
folder as pip would."""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from seams.paths import REPO_ROOT
from targets import envs, wheels
from targets.sglang.environments import LINE

# The set-up, its folder under the test's, its build one long step
SETUP = textwrap.dedent("""
    import os, sys
    from targets import envs, wheels
    envs.ENVS = sys.argv[1]
    STEP = ("import os, sys, time\\n"
            "open(os.path.join(sys.argv[1], 'step.pid'), 'w').write(str(os.getpid()))\\n"
            "while True:\\n"
            "    open(os.path.join(sys.argv[1], 'written'), 'a').write('x')\\n"
            "    time.sleep(0.05)\\n")
    def build(self, version, d):
        open(os.path.join(sys.argv[1], 'staging'), 'w').write(d)
        wheels.run_step([sys.executable, "-c", STEP, d])
        return []
    envs.ReleaseLine._build = build
    sys.exit(envs.main(["sglang", "setup", "0.5.23"]))
""")


def _start(tmp_path):
    """The set-up, once its step runs: (the process, its staging folder, the step's pid)."""
    proc = subprocess.Popen([sys.executable, "-c", SETUP, str(tmp_path)], cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(3000):  # the step's pid file is the handshake (a bound, not a timing)
        staging = (tmp_path / "staging").read_text() if (tmp_path / "staging").exists() \
            else None
        pid_file = os.path.join(staging, "step.pid") if staging else None
        if pid_file and os.path.exists(pid_file) and open(pid_file).read():
            return proc, staging, int(open(pid_file).read())
        try:
            proc.wait(timeout=0.02)
            break  # the set-up ended before its step started: a failure, shown below
        except subprocess.TimeoutExpired:
            continue
    proc.kill()
    pytest.fail("the set-up's step never started: " + proc.communicate(timeout=60)[1][-800:])


def _gone(pid: int) -> bool:
    """Has process ``pid`` ended (polled for a bounded while)?"""
    for _ in range(1000):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    return True  # ended; its new parent has not reaped it yet
        except OSError:
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_set_up_is_one_line_and_leaves_nothing(tmp_path, sig):
    proc, staging, step = _start(tmp_path)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert signal.Signals(sig).name in err
    assert not os.path.exists(staging)  # its staging folder went with it
    assert os.listdir(tmp_path / "sglang") == []  # nor any lock beside it
    assert _gone(step)  # and so did the step it was running


def test_a_set_up_killed_outright_takes_its_step_and_the_next_removes_its_folder(
        tmp_path, monkeypatch):
    proc, staging, step = _start(tmp_path)
    proc.kill()
    proc.wait(timeout=60)
    assert _gone(step)  # PR_SET_PDEATHSIG: no orphaned step goes on writing
    assert os.path.exists(staging)  # what SIGKILL leaves ...
    monkeypatch.setattr(envs, "ENVS", str(tmp_path))
    monkeypatch.setattr(envs.ReleaseLine, "_build", _fake_build)
    LINE.setup("0.5.22")  # ... the next set-up (of any release) removes
    assert sorted(os.listdir(tmp_path / "sglang")) == ["0.5.22"]


def _fake_build(self, version, d):
    os.mkdir(os.path.join(d, "bin"))
    os.symlink(sys.executable, os.path.join(d, "bin", "python"))
    return []


def test_a_sweep_keeps_a_live_set_ups_folder_and_removes_the_rest(tmp_path, monkeypatch):
    parent = tmp_path / "sglang"
    parent.mkdir()
    legacy = parent / (wheels.STAGING + "0.5.20-old")  # from before the lock: stale
    legacy.mkdir()
    (legacy / "big").write_text("x" * 1000)
    dead = parent / (wheels.STAGING + "0.5.21-dead")  # its lock free: its owner is gone
    dead.mkdir()
    (parent / (dead.name + wheels.LOCK)).write_text("")
    live = parent / (wheels.STAGING + "0.5.22-live")  # held: a set-up running now
    live.mkdir()
    fd = os.open(parent / (live.name + wheels.LOCK), os.O_CREAT | os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert sorted(wheels.sweep(str(parent))) == sorted([dead.name, legacy.name])
        assert sorted(os.listdir(parent)) == [live.name, live.name + wheels.LOCK]
    finally:
        os.close(fd)


def test_a_failed_step_kills_nothing_else_and_is_one_error(tmp_path):
    with pytest.raises(wheels.EnvError) as info:
        wheels.run_step([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert "failed (3)" in str(info.value)
