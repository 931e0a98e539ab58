"""Bounds on stalls and on how long a GPU run may take: one place for every layer.

Nothing here touches a device, so the CLI checks its input before any work starts.

* ``MAX_STALL_MS``: every stall is capped, on both backends and in the CLI and the
  report schema (a cycle count is not a duration on a GPU; a virtual stall that long only
  hides a bug behind a huge clock on the simulator).
* ``SPECRACE_CYCLES_PER_MS`` (skips the GPU's stall calibration) must be a plausible GPU
  clock: ``CYCLES_PER_MS_RANGE``; 1e12 would turn the capped stall into days.
* ``SPECRACE_WATCHDOG_S`` overrides the GPU watchdog's limit for ``repro``, ``replay`` and
  each ``matrix`` cell (0: off); by default it is derived from the work asked for.
"""
from __future__ import annotations

import contextlib
import math
import os
from typing import Optional, Tuple
from seams.vocab import Backend

MAX_STALL_MS = 2000.0
DEFAULT_STALL_MS = 1.0  # a GPU stall of unspecified length: >= 0.5 ms saturates on an H200
CYCLES_PER_MS_ENV = "SPECRACE_CYCLES_PER_MS"
# torch.cuda._sleep spins on the SM clock: ~0.1 GHz .. 100 GHz covers every GPU with margin
CYCLES_PER_MS_RANGE: Tuple[float, float] = (1e5, 1e8)

WATCHDOG_ENV = "SPECRACE_WATCHDOG_S"
WATCHDOG_SETUP_S = 300.0  # CUDA initialisation, calibration, the first kernels' loading
WATCHDOG_TRIAL_S = 30.0  # one trial's own work (a GPU trial takes milliseconds)
WATCHDOG_STALLS_PER_TRIAL = 100  # stalls a trial may take (a few fault points x iterations)
MAX_WATCHDOG_S = 7 * 24 * 3600.0


class LimitError(ValueError):
    """A limit's setting is unusable; the message is one line for the user."""


def _number(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise LimitError(f"{name}={text[:40]!r} is not a number") from None
    if not math.isfinite(value):
        raise LimitError(f"{name}={text[:40]!r} must be finite")
    return value


def seconds_from_env(name: str, default: float) -> float:
    """A duration in seconds set in the environment (``default`` when unset): a finite
    number in 0..``MAX_WATCHDOG_S``, else ``LimitError`` naming the setting."""
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    value = _number(name, text)
    if not 0 <= value <= MAX_WATCHDOG_S:
        raise LimitError(f"{name}={text[:40]!r} is out of range (0..{MAX_WATCHDOG_S:g} s)")
    return value


def cycles_per_ms_from_env() -> Optional[float]:
    """``SPECRACE_CYCLES_PER_MS`` as a number, ``None`` when unset (calibrate then);
    ``LimitError`` when it is not a finite number within ``CYCLES_PER_MS_RANGE``."""
    text = os.environ.get(CYCLES_PER_MS_ENV)
    if text is None or not text.strip():
        return None
    value = _number(CYCLES_PER_MS_ENV, text)
    lo, hi = CYCLES_PER_MS_RANGE
    if not lo <= value <= hi:
        raise LimitError(f"{CYCLES_PER_MS_ENV}={text[:40]!r} is out of range "
                         f"({lo:g}..{hi:g} cycles per ms)")
    return value


def watchdog_seconds(trials: int, stall_ms: Optional[float] = None) -> Optional[float]:
    """The GPU watchdog's limit for ``trials`` trials with stalls of ``stall_ms`` (None:
    the backend's default stall): ``SPECRACE_WATCHDOG_S`` if set (0: off, ``None``), else
    set-up time plus a budget per trial. ``LimitError`` for an unusable setting."""
    text = os.environ.get(WATCHDOG_ENV)
    if text is not None and text.strip():
        value = _number(WATCHDOG_ENV, text)
        if not 0 <= value <= MAX_WATCHDOG_S:
            raise LimitError(f"{WATCHDOG_ENV}={text[:40]!r} is out of range "
                             f"(0..{MAX_WATCHDOG_S:g} s; 0 turns the watchdog off)")
        return value or None
    ms = DEFAULT_STALL_MS if stall_ms is None else float(stall_ms)
    stall_s = min(max(ms, 0.0), MAX_STALL_MS) / 1e3
    per_trial = WATCHDOG_TRIAL_S + WATCHDOG_STALLS_PER_TRIAL * stall_s
    return min(WATCHDOG_SETUP_S + max(int(trials), 1) * per_trial, MAX_WATCHDOG_S)


def check_environment() -> None:
    """Validate every limit set in the environment (``LimitError`` on the first bad one),
    so a bad setting is reported before any work starts."""
    cycles_per_ms_from_env()
    watchdog_seconds(1)


def gpu_watchdog(backend: str, trials: int, stall_ms: Optional[float], what: str):
    """A context manager: on ``cuda``, the watchdog (``watchdog.watchdog``: stacks on
    stderr, exit status ``watchdog.WATCHDOG_EXIT``) armed for
    ``watchdog_seconds(trials, stall_ms)``;
    elsewhere nothing (the simulator bounds its own work: iteration cap, deadlocks)."""
    if backend != Backend.CUDA:
        return contextlib.nullcontext()
    from harness.runtime.watchdog import watchdog
    return watchdog(watchdog_seconds(trials, stall_ms), what)
