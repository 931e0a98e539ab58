"""One signal policy for a specrace process: SIGINT and SIGTERM end the run cleanly.

``install()`` -- called by the console entry point before anything heavy is imported --
makes both raise ``Interrupted`` (a ``KeyboardInterrupt``, so code that lets a Ctrl-C
through lets a SIGTERM through too) in the main thread; the CLI turns it into one line and
exit status 128 + N (130, 143), no traceback. The signal is also *remembered*: where Python
cannot propagate the exception -- it landed in a garbage-collector callback, a ``__del__``
or a weakref finaliser ("Exception ignored in ...") -- it is not lost: ``checkpoint()``
(called between trials and before the report is written) raises it again, and the
unraisable hook stays quiet about it.

``deferred()`` is a critical section: inside, a signal is only remembered (the handler
returns, nothing is raised into the middle of a file write or an import); ``pending()``
lets the section stop early; on leaving it, a remembered signal is honoured -- raised as
``Interrupted`` where ``install()`` ran, else re-delivered under the handler that was
there before (a test process, a library caller). Sections nest; off the main thread
(where Python runs no handlers) they do nothing.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Any, Dict, Iterator, Optional

SIGNALS = (signal.SIGINT, signal.SIGTERM)

__all__ = ["Interrupted", "install", "deferred", "pending", "checkpoint", "status_of"]


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived: the run ends with status 128 + ``signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def status(self) -> int:
        return 128 + self.signum

    @property
    def signame(self) -> str:
        return signal.Signals(self.signum).name


_state: Dict[str, Any] = {"installed": False, "pending": None, "depth": 0}


def _handler(signum: int, frame: Any) -> None:
    if _state["pending"] is None:
        _state["pending"] = signum
    if _state["depth"] == 0:
        raise Interrupted(signum)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def install() -> None:
    """The policy for this process (the main thread; idempotent)."""
    if not _main_thread():
        return
    for sig in SIGNALS:
        signal.signal(sig, _handler)
    if not _state["installed"]:
        previous = sys.unraisablehook

        def quiet(unraisable: Any) -> None:
            if isinstance(unraisable.exc_value, KeyboardInterrupt):
                return  # remembered: the next checkpoint() raises it where it can propagate
            previous(unraisable)
        sys.unraisablehook = quiet
    _state["installed"] = True


def pending() -> Optional[int]:
    """The signal remembered and not yet honoured (None: none)."""
    return _state["pending"]


def checkpoint() -> None:
    """Raise a remembered signal now (outside critical sections, where installed)."""
    if _state["pending"] is not None and _state["depth"] == 0 and _state["installed"]:
        raise Interrupted(_state["pending"])


def status_of(exc: BaseException) -> int:
    """The exit status for an interrupt: 128 + N, 130 for a plain ``KeyboardInterrupt``."""
    return exc.status if isinstance(exc, Interrupted) else 128 + signal.SIGINT


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A critical section: SIGINT/SIGTERM are remembered inside and honoured after."""
    if not _main_thread():
        yield
        return
    ours = _state["installed"] and all(signal.getsignal(s) is _handler for s in SIGNALS)
    before: Dict[int, Any] = {}
    if not ours and _state["depth"] == 0:
        for sig in SIGNALS:
            h = signal.getsignal(sig)
            if h is not None:  # a disposition set outside Python cannot be put back
                before[sig] = h
                signal.signal(sig, _handler)
    _state["depth"] += 1
    try:
        yield
    finally:
        _state["depth"] -= 1
        if _state["depth"] == 0:
            for sig, h in before.items():
                signal.signal(sig, h)
            signum = _state["pending"]
            if signum is not None and ours:
                raise Interrupted(signum)
            if signum is not None and not _state["installed"]:
                _state["pending"] = None
                signal.raise_signal(signum)  # under the handler it would have met
