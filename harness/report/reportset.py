"""Writing a report set so that a reader sees the previous set or the new one, never a mix.

The set's files are written and fsynced into a private staging folder inside the report
folder (same file system, so a rename moves a file into place atomically), then renamed
over the old files in one burst with SIGINT/SIGTERM held back, the entry point (the JSON
that ``replay`` reads) last; members the new set lacks are removed after it. Every member
carries the set's run id, so a reader can still tell a mix apart if the process is
killed outright (SIGKILL, power loss) inside that burst.

SIGTERM while staging raises (``Terminated``) instead of killing the process, so the
staging folder is removed; one left behind by a killed process is removed by the next
write into the same folder (its name carries the writer's pid).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

STAGING_PREFIX = ".specrace-tmp-"

Writer = Callable[[Any], Any]  # writes one file into the open binary file it is given


class ReportDirError(ValueError):
    """The report folder cannot take a report set (one line for the user)."""


class Terminated(SystemExit):
    """SIGTERM arrived while a report set was being written (exit status 128 + 15)."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)


def prepare_report_dir(path: str, longest_name: str = "") -> str:
    """Create ``path`` if needed and prove a set can be written there -- before a run, so
    a bad ``--report-dir`` costs no trials: a staging folder and a file named
    ``longest_name`` inside it are created and removed again."""
    shown = path if len(path) <= 120 else path[:117] + "..."
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise ReportDirError(f"cannot write reports to {shown!r}: not a directory") from None
    except OSError as exc:
        raise ReportDirError(f"cannot write reports to {shown!r}: "
                             f"{exc.strerror or exc}") from None
    if not os.path.isdir(path):
        raise ReportDirError(f"cannot write reports to {shown!r}: not a directory")
    try:
        probe = tempfile.mkdtemp(prefix=STAGING_PREFIX + f"{os.getpid()}-", dir=path)
        try:
            with open(os.path.join(probe, longest_name or "probe"), "wb"):
                pass
        finally:
            shutil.rmtree(probe, ignore_errors=True)
    except OSError as exc:
        raise ReportDirError(f"cannot write reports to {shown!r}: "
                             f"{exc.strerror or exc}") from None
    return path


def write_set(folder: str, members: Sequence[Tuple[str, Writer]],
              absent: Sequence[str] = ()) -> Dict[str, Any]:
    """Write ``members`` (file name, writer) as one set into ``folder``; they are swapped
    in in the order given (put the entry point last), then ``absent`` names (members of an
    older set that this one lacks) are removed. Returns each writer's result by name."""
    _sweep_stale(folder)
    results: Dict[str, Any] = {}
    with _terminate_raises():
        stage = tempfile.mkdtemp(prefix=STAGING_PREFIX + f"{os.getpid()}-", dir=folder)
        try:
            for name, write in members:
                with open(os.path.join(stage, name), "wb") as f:
                    results[name] = write(f)
                    f.flush()
                    os.fsync(f.fileno())
            _swap(stage, folder, [name for name, _ in members], absent)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    return results


def _swap(stage: str, folder: str, names: List[str], absent: Sequence[str]) -> None:
    with _signals_held():
        for name in names:
            os.replace(os.path.join(stage, name), os.path.join(folder, name))
        for name in absent:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, name))
        _fsync_dir(folder)


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


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _terminate_raises() -> Iterator[None]:
    """SIGTERM raises ``Terminated`` in the block (only where it would kill us outright:
    the main thread, default disposition), so ``finally`` clauses run."""
    if not _main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT/SIGTERM wait until the block is done (a handful of renames), then act as
    they would have. Python handlers defer them (masking the main thread alone would not:
    the kernel may hand a process-directed signal to any of torch's threads)."""
    if not _main_thread():
        yield
        return
    held: List[int] = []
    # (a disposition set outside Python reads as None and cannot be put back: left alone)
    old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    old = {sig: h for sig, h in old.items() if h is not None}
    for sig in old:
        signal.signal(sig, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(held):
            signal.raise_signal(sig)  # now, under the handler it would have met


def _sweep_stale(folder: str) -> None:
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
            shutil.rmtree(os.path.join(folder, entry), ignore_errors=True)


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
