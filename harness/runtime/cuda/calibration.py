"""Stalls on a GPU: ``torch.cuda._sleep`` cycles per millisecond, calibrated once per
process by event timing (after a warm-up: the first launch in a process is slow).

A cycle count is not a duration (clock drift, ROCm, TDR), so every stall is capped at
``MAX_STALL_MS`` (``limits``, shared with the simulator and the CLI). The pure parts come
first: they are tested without a GPU.
"""
from __future__ import annotations

import statistics
import threading
from typing import Iterable, List, Optional, Tuple

import torch

from harness.runtime.limits import (CYCLES_PER_MS_RANGE, DEFAULT_STALL_MS, MAX_STALL_MS,
                                     LimitError, cycles_per_ms_from_env)
from harness.runtime.cuda.capture import passthrough

# Calibration: warm the spin kernel up, then time these sizes with events.
_WARMUP_CYCLES = 100_000
_WARMUP_LAUNCHES = 3
_CALIBRATION_CYCLES = (1_000_000, 2_000_000)
_CALIBRATION_REPEATS = 3


def cycles_per_ms_from_samples(samples: Iterable[Tuple[float, float]]) -> float:
    """Median cycles per millisecond over ``(cycles, measured_ms)`` samples.

    Samples with a non-positive count or time are ignored (a timer glitch must not give
    an infinite rate); with none left this raises ``ValueError``.
    """
    rates = [c / ms for c, ms in samples if c > 0 and ms > 0]
    if not rates:
        raise ValueError("no usable calibration samples (every measured time was <= 0)")
    return float(statistics.median(rates))


def clamp_ms(ms: Optional[float]) -> float:
    """A stall's length in ms: ``None`` is ``DEFAULT_STALL_MS``, capped to [0, MAX]."""
    return min(max(float(DEFAULT_STALL_MS if ms is None else ms), 0.0), MAX_STALL_MS)


def stall_cycles(ms: Optional[float], cycles_per_ms: float) -> int:
    """Spin-kernel cycles for a stall of ``ms`` (None: ``DEFAULT_STALL_MS``), capped."""
    return max(0, int(round(cycles_per_ms * clamp_ms(ms))))


_CYCLES_PER_MS: Optional[float] = None
_CALIBRATION_LOCK = threading.Lock()


def calibrate(force: bool = False) -> float:
    """Cycles of ``torch.cuda._sleep`` per millisecond on this GPU (cached per process).

    ``SPECRACE_CYCLES_PER_MS`` in the environment skips the measurement; it must be a
    plausible GPU clock (``limits.CYCLES_PER_MS_RANGE``, else ``limits.LimitError``).
    """
    global _CYCLES_PER_MS
    with _CALIBRATION_LOCK:
        if _CYCLES_PER_MS is not None and not force:
            return _CYCLES_PER_MS
        value = cycles_per_ms_from_env()
        if value is not None and not force:
            _CYCLES_PER_MS = value
            return value
        with passthrough():  # never log the calibration's own events into a trace
            measured = _measure_cycles_per_ms()
        # a measured rate is held to the range a given one is: a rate far off the GPU's
        # clock turns the capped stall into minutes (a stall that never ends reads as a
        # hang, with nothing named)
        lo, hi = CYCLES_PER_MS_RANGE
        if not lo <= measured <= hi:
            raise LimitError(f"the stall calibration measured {measured:.3g} cycles/ms, "
                             f"outside a GPU clock's {lo:g}..{hi:g}: set SPECRACE_CYCLES_PER_MS")
        _CYCLES_PER_MS = measured
        return _CYCLES_PER_MS


def _measure_cycles_per_ms() -> float:
    torch.cuda.synchronize()
    for _ in range(_WARMUP_LAUNCHES):  # first launch in a process is slow (module loading)
        torch.cuda._sleep(_WARMUP_CYCLES)
    torch.cuda.synchronize()
    samples: List[Tuple[float, float]] = []
    first = True
    for _ in range(_CALIBRATION_REPEATS):
        for cycles in _CALIBRATION_CYCLES:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
            if first:  # the first timed pair warms the event path up too
                first = False
                continue
            samples.append((cycles, ms))
    return cycles_per_ms_from_samples(samples)
