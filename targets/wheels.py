"""A release's wheel: downloaded once and kept, and -- for a server whose wheel is mostly
compiled GPU code -- only its Python files unpacked (``targets.envs`` builds release
environments with these)."""
from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from typing import Iterator, List

from seams import children, signals
from seams.paths import REPO_ROOT

DOWNLOADS = os.path.join(REPO_ROOT, ".releases", ".downloads")  # release wheels, kept
STAGING = ".staging-"  # a download or an environment in progress: never a wheel or one
LOCK = ".lock"  # beside a staging folder: held by the set-up that owns it
PIP_TAIL_LINES = 3  # what a failed pip step shows of its own output


class EnvError(ValueError):
    """A release that cannot be set up or is not set up: bad input."""


def run_step(cmd: List[str]) -> None:
    """A set-up step; its own output only when it fails (its last lines, in the error).
    The step runs in a process group of its own, which an interrupt of this process (or
    any exception) kills whole -- pip and whatever it started -- before it propagates: a
    step never goes on writing into a staging folder its set-up has left. On Linux the
    step also dies with this process (``PR_SET_PDEATHSIG``), should this one be killed
    outright. Python steps keep the working directory off their path (``seams.children``)."""
    if cmd[1:2] == ["-m"]:
        cmd = children.command(cmd[0], *cmd[1:])
    prctl = _prctl()  # looked up here: the child only calls it (no import after fork)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=children.env(project=False), start_new_session=True,
                            preexec_fn=(lambda: prctl(1, signal.SIGKILL)) if prctl else None)
    try:
        out, err = proc.communicate()
    except BaseException:
        _kill_group(proc)
        raise
    if proc.returncode != 0:
        tail = [ln for ln in (err or out).splitlines() if ln.strip()]
        raise EnvError(f"set-up step failed ({proc.returncode}): "
                       f"{' '.join(map(str, cmd[1:]))[:160]}"
                       + "".join(f"\n  {ln[:200]}" for ln in tail[-PIP_TAIL_LINES:]))


def _prctl():
    """libc's ``prctl`` where there is one (Linux): ``prctl(1, SIGKILL)`` in the step's
    process before it runs (``PR_SET_PDEATHSIG``) kills it when its parent dies."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None  # the interrupt path still kills the group


def _kill_group(proc: subprocess.Popen) -> None:
    """The step's whole process group, ended (politely first, then for good)."""
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def staging(parent: str, prefix: str) -> Iterator[str]:
    """A staging folder under ``parent`` (named ``STAGING + prefix + ...``), removed on any
    way out -- an error, SIGINT or SIGTERM (``seams.signals``: the removal is not cut
    short by a second one). Its owner holds a lock on ``FOLDER.lock`` (taken before the
    folder exists) for as long as it lives: ``sweep`` removes a staging folder only once
    no one holds it, so what a killed set-up left goes with the next set-up, and a
    running one's is never touched. The body may rename the folder away (swap it in)."""
    os.makedirs(parent, exist_ok=True)
    fd, lock = tempfile.mkstemp(prefix=STAGING + prefix, suffix=LOCK, dir=parent)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        folder = lock[:-len(LOCK)]
        os.mkdir(folder)
        yield folder
    finally:
        with signals.deferred():
            shutil.rmtree(lock[:-len(LOCK)], ignore_errors=True)
            _unlink(lock)
            os.close(fd)


def sweep(parent: str) -> List[str]:
    """Remove the staging folders under ``parent`` that no live set-up holds (a killed
    one's; one from before the lock, which has none): returns their names."""
    gone = []
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return gone
    for name in names:
        path = os.path.join(parent, name)
        if not name.startswith(STAGING) or name.endswith(LOCK):
            continue
        if _held(path + LOCK):
            continue
        with signals.deferred():
            shutil.rmtree(path, ignore_errors=True)
            _unlink(path + LOCK)
        gone.append(name)
    for name in names:  # a lock left without its folder
        path = os.path.join(parent, name)
        if name.startswith(STAGING) and name.endswith(LOCK) \
                and not os.path.exists(path[:-len(LOCK)]) and not _held(path):
            _unlink(path)
    return gone


def _held(lock: str) -> bool:
    """Does a live process hold ``lock`` (False: no such file, or free)?"""
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops a lock this process just took
    return False


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def download(package: str, version: str) -> str:
    """The release's wheel, downloaded once into ``DOWNLOADS`` and reused by every later
    set-up of it (a re-run of ``make upstream``, a lock, CI's second build)."""
    folder = os.path.join(DOWNLOADS, package)
    os.makedirs(folder, exist_ok=True)
    mine = [w for w in glob.glob(os.path.join(folder, f"{package}-{version}-*.whl"))]
    if not mine:
        sweep(folder)  # what an interrupted download left
        # into a staging folder first: an interrupted download never looks like a wheel
        with staging(folder, "download-") as tmp:
            run_step([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                  "--only-binary=:all:", "-d", tmp, f"{package}=={version}"])
            for name in os.listdir(tmp):
                os.replace(os.path.join(tmp, name), os.path.join(folder, name))
        mine = glob.glob(os.path.join(folder, f"{package}-{version}-*.whl"))
    if not mine:
        raise EnvError(f"pip downloaded no {package} {version} wheel")
    return mine[0]


def unpack_python(wheel: str, site: str) -> int:
    """The wheel's ``.py`` files and its ``.dist-info`` (its version, requirements and
    RECORD -- the hashes the contract compares executed files with) into ``site``;
    returns how many files. Members are checked to stay inside ``site``."""
    count = 0
    root = os.path.realpath(site)
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = info.filename
            top = name.split("/", 1)[0]
            if info.is_dir() or not (name.endswith(".py") or top.endswith(".dist-info")):
                continue
            dest = os.path.realpath(os.path.join(site, name))
            if not dest.startswith(root + os.sep):
                raise EnvError(f"the wheel has a member outside its folder: {name[:120]!r}")
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(info) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
            count += 1
    return count


