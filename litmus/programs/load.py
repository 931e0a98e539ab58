"""Background load on the copy engines (``harness.runtime.load``): a readback that is right
only *by timing* -- queued behind the forward that wrote its source, while the next
forward overwrites that source -- goes stale once another stream's bulk copies hold the
engine of its direction, with no stall injected. The shapes of the readback findings,
and the three facts the simulator's copy-engine model rests on:

* ``load_copy_behind_bulk``  -- a D2H readback behind bulk D2H traffic starts late: the
  next write lands first (stale on the simulator under every eager schedule);
* ``load_other_direction``   -- bulk H2D traffic does not delay a D2H readback: each
  direction has its own engine queue;
* ``load_fifo_two_streams``  -- a blocking D2H on a third stream, queued after the
  readback, returns only once the readback landed (one FIFO queue per direction across
  streams): the host, without waiting on the readback's own event, reads it fresh on
  the simulator's eager schedule (a race all the same: CUDA promises no such order).

On a GPU a run under load is real traffic (a background thread), so the ``cuda`` rows are
a property of the hardware: an H100's are measured (``reports/measurements.md``).
"""
from __future__ import annotations

from functools import partial

import torch

from harness.runtime.load import LOADS

from .common import Litmus, _pinned_zeros, _stall, overlap_streams


def _readback(rt, stall: bool, load: str, fifo: bool = False) -> bool:
    m, S, F = overlap_streams(rt)
    C = m.Stream()
    rt.label(C, "copy")
    x = torch.arange(1, 5, dtype=torch.int32, device=rt.device)
    y = torch.zeros(4, dtype=torch.int32, device=rt.device)
    other = torch.ones(2, dtype=torch.int32, device=rt.device)
    host = _pinned_zeros(4)
    m.synchronize()
    with rt.loaded(LOADS[load]):
        with m.stream(F):
            y.copy_(x * 10)  # the forward's result, in a buffer the next forward rewrites
            wrote = m.Event()
            wrote.record()
        with m.stream(C):
            C.wait_event(wrote)
            _stall(rt, stall)  # (the stalled stream: the copy)
            host.copy_(y, non_blocking=True)  # the readback: a leaf, nothing waits on it
            copied = m.Event()
            copied.record()
        if fifo:
            with m.stream(S):
                other.cpu()  # a blocking D2H of its own, queued after the readback
        else:
            with m.stream(F):
                y.fill_(-1)  # the next forward's write of the same buffer
            copied.synchronize()
        got = host.tolist()
        m.synchronize()
    return got != [10, 20, 30, 40]


_BEHIND = {"eager": True, "lazy": False, "stall": True, "random": None, "pct": None,
           "cuda": None, "cuda_stall": True}
_BESIDE = {"eager": False, "lazy": False, "stall": True, "random": None, "pct": None,
           "cuda": None, "cuda_stall": True}
_FIFO = {"eager": False, "lazy": True, "stall": True, "random": None, "pct": None,
         "cuda": None, "cuda_stall": True}

LOAD = [
    Litmus("load_copy_behind_bulk", "a D2H readback behind another stream's bulk D2H "
           "traffic starts late: the next forward's write lands first",
           partial(_readback, load="bulk-d2h"), race=True, stale=_BEHIND,
           stalled_stream="copy", load="bulk-d2h"),
    Litmus("load_other_direction", "bulk H2D traffic does not hold a D2H readback (each "
           "direction queues on its own engine)",
           partial(_readback, load="bulk-h2d"), race=True, stale=_BESIDE,
           stalled_stream="copy", load="bulk-h2d"),
    Litmus("load_fifo_two_streams", "a blocking D2H queued after the readback returns "
           "once the readback landed: one FIFO queue per direction across streams",
           partial(_readback, load="bulk-d2h", fifo=True), race=True, stale=_FIFO,
           stalled_stream="copy", load="bulk-d2h"),
]
