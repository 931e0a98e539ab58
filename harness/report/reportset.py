"""Writing a report set as one directory, swapped in whole by one rename.

A set is the folder ``REPORT_DIR/NAME/``. Its files are written and fsynced into a staging
folder beside it (``.specrace-tmp-PID-XXXX``: same file system), and then one system call
puts the whole folder in place: ``rename(stage, NAME)`` where there is no set yet, else an
atomic exchange of the two names (``renameat2(RENAME_EXCHANGE)``, Linux 3.15+), after which
the staging name holds the old set, which is removed. So

* each file a reader opens is whole, from the old set or the new one; a reader of several
  files reads one set with ``read_set`` (the folder opened once, every file read relative
  to it, again from the start if the set was replaced meanwhile) -- opening ``NAME/a`` and
  then ``NAME/b`` by path may straddle a swap (each file's ``run_id`` tells);
* two writers of one name are serialised by the kernel: the last exchange wins, whole;
* a writer killed at any moment (SIGKILL included) leaves the old set or the new one, plus
  at most its staging folder, which the next write into the report folder removes (its
  name carries the writer's pid; a live writer's is left alone);
* a failing rename changes nothing (one call: it happened or it did not).

Where the file system cannot exchange (``EINVAL``/``ENOSYS``: NFS, FUSE, not Linux), the old
set is renamed aside and the new one into place, under an exclusive ``flock`` on
``.specrace-lock`` so writers stay serialised: a reader may then find no set for that
instant, never a mixed one.

Signals: the whole write is a critical section (``seams.signals.deferred``): a SIGINT or
SIGTERM is remembered, not raised into the middle of a file or a garbage-collector callback;
staging checks for one between files and stops (the old set stays, the staging folder is
removed), the swap itself is one call, and the signal is honoured when the section ends.
Nothing is imported inside it (``preload`` first).
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import stat
import tempfile
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from seams import signals

STAGING_PREFIX = ".specrace-tmp-"
LOCK_NAME = ".specrace-lock"

Writer = Callable[[Any], Any]  # writes one file into the open binary file it is given


class ReportDirError(ValueError):
    """The report folder cannot take a report set (one line for the user)."""


def _shown(path: str) -> str:
    return path if len(path) <= 120 else path[:117] + "..."


def prepare_report_dir(path: str, longest_name: str = "") -> str:
    """Create ``path`` if needed and prove a set can be written there -- before a run, so
    a bad ``--report-dir`` costs no trials: a staging folder holding a folder named
    ``longest_name`` is created and removed again."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise ReportDirError(f"cannot write reports to {_shown(path)!r}: not a directory"
                             ) from None
    except OSError as exc:
        raise ReportDirError(f"cannot write reports to {_shown(path)!r}: "
                             f"{exc.strerror or exc}") from None
    if not os.path.isdir(path):
        raise ReportDirError(f"cannot write reports to {_shown(path)!r}: not a directory")
    try:
        probe = tempfile.mkdtemp(prefix=STAGING_PREFIX + f"{os.getpid()}-", dir=path)
        try:
            os.mkdir(os.path.join(probe, longest_name or "probe"))
        finally:
            shutil.rmtree(probe, ignore_errors=True)
    except OSError as exc:
        raise ReportDirError(f"cannot write reports to {_shown(path)!r}: "
                             f"{exc.strerror or exc}") from None
    return path


def write_set(folder: str, name: str, members: Sequence[Tuple[str, Writer]]) -> Dict[str, Any]:
    """Write ``members`` (file name, writer) as the set ``folder/name/``, swapped in whole.
    Returns each writer's result by file name. ``OSError`` if it cannot be written (the
    old set, if any, is then still there)."""
    target = os.path.join(folder, name)
    results: Dict[str, Any] = {}
    with signals.deferred():
        sweep_stale(folder)
        stage = tempfile.mkdtemp(prefix=STAGING_PREFIX + f"{os.getpid()}-", dir=folder)
        try:
            os.chmod(stage, 0o777 & ~_umask())  # a set folder as mkdir would make it
            for fname, write in members:
                if signals.pending() is not None:  # stop: the old set stays
                    return results
                with open(os.path.join(stage, fname), "wb") as f:
                    results[fname] = write(f)
                    f.flush()
                    os.fsync(f.fileno())
            _fsync_dir(stage)
            if signals.pending() is None:
                swap(stage, target)
                _fsync_dir(folder)
        finally:
            _remove(stage)  # the new set if it never went in, else the old one
    return results


READ_SET_TRIES = 100  # a set replaced this many times in a row while being read: give up


def read_set(path: str, names: Optional[Sequence[str]] = None) -> Dict[str, bytes]:
    """The files of the set folder ``path`` (``names``, or every file in it), all of one
    set: the folder is opened once and each file read relative to that handle, so a swap
    meanwhile cannot mix in the new set's files; a file the swap's clean-up removed before
    it was read means the set was replaced -- read again, the new one. ``OSError`` if
    there is no set, or it keeps being replaced."""
    for _ in range(READ_SET_TRIES):
        dir_fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            wanted = list(names) if names is not None else sorted(
                e for e in os.listdir(dir_fd) if not e.startswith("."))
            try:
                return {name: _read_at(dir_fd, name) for name in wanted}
            except FileNotFoundError:
                if _same_folder(dir_fd, path):
                    raise  # the set in place lacks it: not a swap
                # the old set was swapped out and is being removed: read the new one
        finally:
            os.close(dir_fd)
    raise OSError(errno.EAGAIN, f"{_shown(path)} was replaced {READ_SET_TRIES} times "
                                f"while being read")


def _same_folder(dir_fd: int, path: str) -> bool:
    try:
        here, there = os.fstat(dir_fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _read_at(dir_fd: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
    with open(fd, "rb") as f:
        return f.read()


def swap(stage: str, target: str) -> None:
    """Put the folder ``stage`` at ``target`` in one step; the old ``target`` (if any) is
    left at ``stage``."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, f"{os.path.basename(target)} is in the way (not a "
                                     f"report set folder)")
    if st is None:
        try:
            os.rename(stage, target)  # an empty target is replaced; a set is not
            os.mkdir(stage)  # the caller removes ``stage``: give it something to remove
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            # another writer put a set there first: exchange with it
    try:
        _exchange(stage, target)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        _swap_locked(stage, target)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_renameat2: Any = None


def _exchange(a: str, b: str) -> None:
    """Atomically exchange the names ``a`` and ``b`` (both exist)."""
    global _renameat2
    if _renameat2 is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                           ctypes.c_uint]
            fn.restype = ctypes.c_int
            _renameat2 = fn
        except (AttributeError, OSError):
            _renameat2 = False
    if _renameat2 is False:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _swap_locked(stage: str, target: str) -> None:
    """The fallback: old set aside, new set in, serialised by a lock in the folder."""
    import fcntl
    folder = os.path.dirname(target) or "."
    fd = os.open(os.path.join(folder, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        aside = tempfile.mkdtemp(prefix=STAGING_PREFIX + f"{os.getpid()}-old-", dir=folder)
        os.rmdir(aside)
        with contextlib.suppress(FileNotFoundError):
            os.rename(target, aside)
        os.rename(stage, target)
        with contextlib.suppress(FileNotFoundError):
            os.rename(aside, stage)  # the caller removes ``stage``: the old set
    finally:
        os.close(fd)  # releases the lock


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _remove(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a directory; the renames stand
        pass
    finally:
        os.close(fd)


def sweep_stale(folder: str) -> None:
    """Remove staging folders whose writer is gone (killed before it could clean up)."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    for entry in entries:
        if not entry.startswith(STAGING_PREFIX):
            continue
        pid = _pid_of(entry)
        if pid is not None and pid != os.getpid() and not _alive(pid):
            _remove(os.path.join(folder, entry))


def _pid_of(entry: str) -> Optional[int]:
    head = entry[len(STAGING_PREFIX):].split("-", 1)[0]
    return int(head) if head.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, but not ours to signal
        return True
    return True


def run_ids(folder: str) -> Dict[str, str]:
    """``{file: run id}`` of a written set in ``folder``: what each of its files says it
    belongs to (``report.json``, ``report.md``, and the trace and timeline where the set
    has them) -- one id throughout, for a set written whole."""
    import json
    ids = {}
    with open(os.path.join(folder, "report.json"), encoding="utf-8") as f:
        ids["json"] = json.load(f)["run_id"]
    with open(os.path.join(folder, "report.md"), encoding="utf-8") as f:
        ids["md"] = f.read().split("run id `", 1)[1].split("`", 1)[0]
    trace = os.path.join(folder, "trace.json")
    if os.path.exists(trace):
        with open(trace, encoding="utf-8") as f:
            ids["trace"] = json.load(f)["otherData"]["run_id"]
    png = os.path.join(folder, "timeline.png")
    if os.path.exists(png):
        from PIL import Image
        ids["png"] = Image.open(png).text["Description"].split()[-1]
    return ids
