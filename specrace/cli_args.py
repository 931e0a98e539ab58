"""The CLI's argument types and its progress display (``specrace.cli`` uses them).

The bounds are the harness's own (repro, the report schema and the runtimes use the same
constants); imported when a value is parsed, so ``specrace list`` stays light. An echoed
value is cut to ``ECHO_CHARS`` (``seams.text.echo``): a 100 kB argument is not a
100 kB error line.
"""
from __future__ import annotations

import argparse
import math
import sys
from typing import Optional


def _echo(text: str) -> str:
    from seams.text import echo
    return echo(text)


def int_in(lo: int, hi: int):
    """An argparse type: an integer in [lo, hi]."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {_echo(text)}") from None
        if v < lo or v > hi:
            raise argparse.ArgumentTypeError(f"{v} is out of range ({lo}..{hi})")
        return v
    return parse


def trials(text: str) -> int:
    from harness.trials.repro import MAX_TRIALS
    return int_in(1, MAX_TRIALS)(text)


def seed(text: str) -> int:
    from harness.trials.repro import MAX_SEED
    return int_in(0, MAX_SEED)(text)


def stall_ms(text: str) -> float:
    from harness.runtime.limits import MAX_STALL_MS
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {_echo(text)}") from None
    if not math.isfinite(v) or v < 0 or v > MAX_STALL_MS:
        raise argparse.ArgumentTypeError(f"{_echo(text)} is out of range (0..{MAX_STALL_MS:g} ms)")
    return v


def policy(text: str):  # parsed here, once: the value travels into every trial
    from harness.policies import parse_policy
    try:
        return parse_policy(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def budget_s(text: str) -> float:
    """Seconds of wall clock, 0..one week."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {_echo(text)}") from None
    if not math.isfinite(v) or v < 0 or v > 7 * 24 * 3600:
        raise argparse.ArgumentTypeError(f"{_echo(text)} is out of range (0..604800 s)")
    return v


def with_progress(fn, total, label: str, quiet: bool):
    """Progress on stderr while ``fn(progress_callback)`` runs: a rich bar on a terminal,
    a line every tenth of the way in a CI log, nothing with ``--json``. Each call is also
    a signal checkpoint (``seams.signals``): an interrupt that was swallowed where it
    landed ends the run after the trial it arrived in."""
    from seams.signals import checkpoint

    def run(show):
        def callback(n: int, total: Optional[int] = None) -> None:
            checkpoint()
            show(n, total)
        return fn(callback)
    return _progress(run, total, label, quiet)


def _progress(fn, total, label: str, quiet: bool):
    if quiet:
        return fn(lambda n, total=None: None)
    if not sys.stderr.isatty():
        state = {"total": total, "last": -1}

        def log(n: int, total: Optional[int] = None) -> None:
            if total is not None:
                state["total"] = total
            t = state["total"]
            step = max(1, (t or 10) // 10)
            if n // step != state["last"] or n == t:
                state["last"] = n // step
                print(f"specrace: {label}: {n}/{t if t else '?'}", file=sys.stderr, flush=True)
        return fn(log)
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), transient=True, console=_stderr_console()) as prog:
        task = prog.add_task(label, total=total)

        def update(n: int, total: Optional[int] = None) -> None:
            if total is not None:
                prog.update(task, total=total)
            prog.update(task, completed=n)
        return fn(update)


def _stderr_console():
    from rich.console import Console
    return Console(stderr=True)


