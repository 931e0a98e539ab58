"""A process watchdog: a GPU hang must not hang CI forever.

``watchdog(seconds, what)`` arms one daemon thread for the block (cheap to arm and disarm:
a lock and a notify); past the limit the process dumps every thread's stack on stderr and
exits with status ``WATCHDOG_EXIT``. Nothing here touches a device: the limits (``limits``)
and the CUDA backend both use it.
"""
from __future__ import annotations

import contextlib
import faulthandler
import itertools
import os
import sys
import threading
import time
from typing import Dict, Iterator, Optional, Tuple

WATCHDOG_EXIT = 3  # the process's exit status when the watchdog fires


class _Watchdog:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: Dict[int, Tuple[float, float, str]] = {}
        self._ids = itertools.count(1)
        self._thread: Optional[threading.Thread] = None

    def arm(self, seconds: float, what: str) -> int:
        with self._cond:
            token = next(self._ids)
            self._armed[token] = (time.monotonic() + seconds, seconds, what)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="specrace-watchdog",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()
            return token

    def disarm(self, token: int) -> None:
        with self._cond:
            self._armed.pop(token, None)
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while True:
                if not self._armed:
                    self._cond.wait()
                    continue
                deadline, seconds, what = min(self._armed.values())
                now = time.monotonic()
                if now >= deadline:
                    _fire(seconds, what)
                self._cond.wait(deadline - now)


def _fire(seconds: float, what: str) -> None:
    msg = (f"\nspecrace watchdog: {what} exceeded {seconds:g} s -- a GPU hang or a stall "
           f"that never ends; dumping stacks and exiting with status {WATCHDOG_EXIT}\n")
    try:
        os.write(2, msg.encode())
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
    except Exception:
        pass
    os._exit(WATCHDOG_EXIT)


_WATCHDOG = _Watchdog()


@contextlib.contextmanager
def watchdog(seconds: Optional[float], what: str = "block") -> Iterator[None]:
    """Exit the process (status 3, stacks on stderr) if the block runs past ``seconds``.

    ``None`` or a non-positive limit disables it.
    """
    if seconds is None or seconds <= 0:
        yield
        return
    token = _WATCHDOG.arm(float(seconds), what)
    try:
        yield
    finally:
        _WATCHDOG.disarm(token)
