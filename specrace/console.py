"""The ``specrace`` console script: the process around ``specrace.cli.main``.

Before anything else is imported it installs the signal policy (``seams.signals``: a
SIGINT or SIGTERM at any moment, the first milliseconds included, is exit 130 / 143 and one
line, never a traceback) and makes the standard streams safe to write:

* a standard descriptor that is closed at start (``specrace ... >&-``) is opened on
  ``/dev/null``, so no file the run opens lands on it and nothing meant for stderr goes
  to stdout (``print(file=None)`` writes to stdout);
* a write to stdout or stderr that fails -- the reader left (EPIPE), the disk is full
  (ENOSPC), an I/O error -- does not raise into the command: that stream is pointed at
  ``/dev/null`` and the command goes on to its own exit status. A pipe whose reader left
  keeps that status (``specrace list | head`` is 0); lost output on stdout for any other
  reason is exit 2, with one line on stderr if stderr can still take it.

It ends without interpreter teardown (``os._exit`` after flushing): on torch 2.11 (H200)
tensors freed during finalisation aborted the process in ``StorageImpl::decref_pyobject``
after the work was done, and a signal landing in the teardown met no handler.
"""
from __future__ import annotations

from seams import signals

# The first thing the console script runs (importing this module is how it starts): from
# here on a SIGINT or SIGTERM is honoured -- before it, only the interpreter's own start-up
# (tens of milliseconds) is left to the default dispositions.
signals.install()

import errno  # noqa: E402 -- after the signal policy, on purpose
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

from seams import children  # noqa: E402 -- standard library only

EXIT_USAGE = 2


class SafeStream:
    """A text stream whose write errors are recorded, not raised (see the module)."""

    def __init__(self, stream, fd: int, closed: bool = False) -> None:
        self._stream, self._fd = stream, fd
        self.failed = None  # the first OSError's errno
        self._closed_at_start = closed  # the first write fails as on a closed descriptor

    def _fail(self, exc: OSError) -> None:
        if self.failed is None:
            self.failed = exc.errno or errno.EIO
        _null_fd(self._fd)  # what is still buffered drains into /dev/null
        try:
            self._stream.flush()
        except (OSError, ValueError):
            pass

    def write(self, text: str) -> int:
        if self._closed_at_start and text and self.failed is None:
            self.failed = errno.EBADF
        if self.failed is not None:
            return len(text)
        try:
            return self._stream.write(text)
        except OSError as exc:
            self._fail(exc)
            return len(text)

    def flush(self) -> None:
        if self.failed is not None:
            return
        try:
            self._stream.flush()
        except OSError as exc:
            self._fail(exc)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _null_fd(fd: int) -> None:
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(null, fd)
    except OSError:
        pass
    finally:
        if null != fd:
            os.close(null)


def _open_std_fds() -> set:
    """Open ``/dev/null`` on each standard descriptor that is closed; returns those."""
    closed = set()
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.add(fd)
            try:
                null = os.open(os.devnull, os.O_RDWR)
            except OSError:
                continue
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    return closed


def _safe_streams():
    closed = _open_std_fds()
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        if stream is None or fd in closed:  # closed at start: a stream on /dev/null
            try:
                stream = open(fd, "w", encoding="utf-8", errors="backslashreplace",
                              closefd=False)
            except OSError:
                continue
        setattr(sys, name, SafeStream(stream, fd, closed=fd in closed))
    return sys.stdout, sys.stderr


# Python's hash seed every specrace process runs under (``_pin_hash_seed``).
HASH_SEED = children.HASH_SEED


def _pin_hash_seed() -> None:
    """Run under ``PYTHONHASHSEED=0``, re-executing this process once when it was started
    under another seed. The code under test iterates sets of strings -- vLLM clears the
    rows of a step's finished requests in the order of the set of their ids -- so under a
    random seed a simulator trace changed from process to process, and a report did not
    replay to its own trace. The new image runs the command this one was started with
    (``sys.orig_argv``: the console script's own file, never ``python -m``, which would put
    the working directory first on ``sys.path`` and run a ``./shlex.py`` or
    ``./specrace/cli.py`` found there as specrace). SIGINT and SIGTERM stay blocked across
    the exec: one that arrives then is pending, not lost, and ``console_main`` honours it
    (one line) as soon as the new image unblocks them. A junk seed never gets here: the
    interpreter refuses it before running a line (exit 1, its own message); every child
    specrace starts gets this seed whatever its parent had (``seams.children``)."""
    was = os.environ.get("PYTHONHASHSEED")
    argv = _own_command()
    if was == HASH_SEED or argv is None or sys.flags.ignore_environment:
        return  # pinned already, nothing to re-run, or -E / -I: the variable is not read
    os.environ["PYTHONHASHSEED"] = HASH_SEED
    signal.pthread_sigmask(signal.SIG_BLOCK, signals.SIGNALS)
    try:
        os.execv(sys.executable, argv)
    except OSError:  # no exec here: run on under the seed this process has (as reports say)
        if was is None:
            del os.environ["PYTHONHASHSEED"]
        else:
            os.environ["PYTHONHASHSEED"] = was
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals.SIGNALS)


def _own_command():
    """The command line this interpreter was started with, its program the running
    interpreter (None where there is none to re-run)."""
    orig = list(getattr(sys, "orig_argv", None) or [])
    if not sys.executable or len(orig) < 2:
        return None
    return [sys.executable, *orig[1:]]


def console_main() -> None:
    signals.install()  # installed at import already; again, if main was called otherwise
    _pin_hash_seed()
    rc = EXIT_USAGE
    out = err = None
    try:
        # blocked across _pin_hash_seed's exec: a signal pending since is honoured here
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals.SIGNALS)
        out, err = _safe_streams()
        from specrace.cli import main
        rc = main()
    except KeyboardInterrupt as exc:  # an interrupt before or around main's own handling
        rc = signals.status_of(exc)
        _say_interrupted(exc)
    except SystemExit as exc:  # --help, --version: argparse exits
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_USAGE)
    try:
        for stream in (out, err):
            if stream is not None:
                stream.flush()
    except KeyboardInterrupt as exc:
        rc = signals.status_of(exc)
    if isinstance(out, SafeStream) and out.failed not in (None, errno.EPIPE):
        print(f"specrace: error: cannot write the output to stdout: "
              f"{os.strerror(out.failed)}", file=sys.stderr)
        rc = EXIT_USAGE
        if err is not None:
            err.flush()
    _leave(rc)


def _say_interrupted(exc: BaseException) -> None:
    name = exc.signame if isinstance(exc, signals.Interrupted) else "SIGINT"
    try:
        print(f"specrace: interrupted ({name})", file=sys.stderr)
    except Exception:  # noqa: BLE001 - a stream that cannot take it: the status says it
        pass


def _leave(rc: int) -> None:
    """Out, without interpreter teardown: the work is done and the streams are flushed.
    Teardown with torch loaded takes a while and is no place for a signal (a SIGTERM there
    met the default disposition; an abort was seen once in 200 runs), and on torch 2.11
    (H200) tensors freed during finalisation aborted the process. A signal from here on
    is honoured at once: status 128 + N."""
    for sig in signals.SIGNALS:
        try:
            signal.signal(sig, _exit_now)
        except (OSError, ValueError):
            pass
    os._exit(rc)


def _exit_now(signum: int, frame) -> None:
    os._exit(128 + signum)


if __name__ == "__main__":
    console_main()
