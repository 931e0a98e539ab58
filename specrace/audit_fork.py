"""Each configuration of an audit in a fork of the process that loaded the target.

The start-up -- importing the server, checking its contract -- is paid once, by the
process that forks; each configuration then runs in a copy of that process as it stood
before any trial: what a fresh ``specrace repro`` would be after its own start-up. So a
configuration's run cannot depend on the ones before it (a module another run imported
lazily, a table a toy model cached), and its report replays in a fresh process exactly;
and ``jobs`` copies run side by side on a machine with the cores for them.

A child that dies without answering (a signal, a segfault in an extension) leaves an
``error`` row naming how it died; the others go on. Used on the simulator only: a process
that has touched CUDA cannot fork a usable copy (the audit runs in-process there).
"""
from __future__ import annotations

import json
import os
import selectors
import signal
from typing import Any, Callable, Dict, Iterator, List, Sequence, Tuple


def can_fork() -> bool:
    return hasattr(os, "fork")


def jobs_default() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def run_forked(work: Callable[[int], List[Dict[str, Any]]], count: int, jobs: int,
               died: Callable[[int, str], List[Dict[str, Any]]]
               ) -> Iterator[Tuple[int, List[Dict[str, Any]]]]:
    """``(i, work(i))`` for each ``i < count``, each computed in a child forked from this
    process, at most ``jobs`` at a time, yielded as each ends; a child that gives no
    answer yields ``died(i, how)``."""
    sel = selectors.DefaultSelector()
    running: Dict[int, Tuple[int, int, List[bytes]]] = {}  # fd -> (i, pid, chunks)
    pending = list(range(count))
    try:
        while pending or running:
            while pending and len(running) < max(1, jobs):
                i = pending.pop(0)
                fd, pid = _spawn(work, i)
                running[fd] = (i, pid, [])
                sel.register(fd, selectors.EVENT_READ)
            for key, _ in sel.select():
                fd = key.fd
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    running[fd][2].append(chunk)
                    continue
                sel.unregister(fd)
                os.close(fd)
                i, pid, chunks = running.pop(fd)
                yield i, _answer(b"".join(chunks), pid, lambda how: died(i, how))
    finally:  # interrupted, or the caller stopped reading: no child outlives the audit
        for fd, (_, pid, _) in running.items():
            _kill(pid)
            os.close(fd)
        sel.close()


def _spawn(work, i: int) -> Tuple[int, int]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer once, then leave without the parent's exit handlers
        os.close(r)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it kills us
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        code = 0
        try:
            data = json.dumps(work(i), default=str).encode()
            with os.fdopen(w, "wb") as out:
                out.write(data)
        except BaseException:  # noqa: BLE001 -- no answer is the parent's "died" row
            code = 1
        os._exit(code)
    os.close(w)
    return r, pid


def _answer(data: bytes, pid: int, died) -> List[Dict[str, Any]]:
    _, status = os.waitpid(pid, 0)
    try:
        rows = json.loads(data) if data else None
    except ValueError:
        rows = None
    if isinstance(rows, list):
        return rows
    if os.WIFSIGNALED(status):
        return died(f"its process died of {signal.Signals(os.WTERMSIG(status)).name}")
    return died(f"its process exited {os.WEXITSTATUS(status)} without an answer")


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def order(results: Sequence[Tuple[int, List[Dict[str, Any]]]]) -> List[Dict[str, Any]]:
    """The rows in plan order, whatever order the children ended in."""
    return [row for _, rows in sorted(results, key=lambda r: r[0]) for row in rows]
