"""One signal policy for a specrace process: SIGINT and SIGTERM end the run cleanly.

``install()`` -- called by the console entry point before anything heavy is imported --
makes both raise ``Interrupted`` (never inside an import: there the signal is delivered
again a few milliseconds later, until the import is over) (a ``KeyboardInterrupt``, so code that lets a Ctrl-C
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
import os
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


# raised: an Interrupted has been raised -- the run is ending, later signals change nothing
# (one more Ctrl-C must not interrupt the line that says so); redelivery: the timer that
# delivers a signal again after an import (one at a time)
_state: Dict[str, Any] = {"installed": False, "pending": None, "depth": 0, "raised": False,
                          "redelivery": None}


REDELIVER_S = 0.005  # how soon a signal that landed inside an import is delivered again


def _importing(frame: Any) -> bool:
    """Is the main thread inside an import (a module's code, or a C extension's
    initialisation, running under importlib's machinery)?"""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def _interrupt(signum: int) -> "Interrupted":
    """The one exception the run ends on (every path that raises one goes through here:
    later signals and a pending re-delivery then change nothing)."""
    _state["raised"] = True
    return Interrupted(signum)


def _redeliver(signum: int) -> None:
    if not _state["raised"]:
        os.kill(os.getpid(), signum)


def _handler(signum: int, frame: Any) -> None:
    if _state["raised"]:
        return
    if _state["pending"] is None:
        _state["pending"] = signum
    if _state["depth"] == 0:
        if _importing(frame):
            # never into an import: a module -- above all a C extension -- left half
            # initialised cannot be imported again in this process (numpy: "cannot load
            # module more than once"), and the next import of it fails as an ImportError
            # that code may take for something else. Delivered again shortly, until the
            # import is over.
            timer = _state["redelivery"]
            if timer is None or not timer.is_alive():
                timer = _state["redelivery"] = threading.Timer(REDELIVER_S, _redeliver,
                                                               (signum,))
                timer.daemon = True
                timer.start()
            return
        raise _interrupt(signum)


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
        raise _interrupt(_state["pending"])


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
                raise _interrupt(signum)
            if signum is not None and not _state["installed"]:
                _state["pending"] = None
                signal.raise_signal(signum)  # under the handler it would have met
