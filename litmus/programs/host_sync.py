"""Device<->host copies, pinned memory and the host's sync points: where a value crosses
to (or from) the host, and which host-side wait, if any, makes that crossing safe.

A ``non_blocking`` copy into pinned memory returns before the data lands, so the host
must wait for the copy's own stream (its event, ``query()`` until True, or that stream's
``synchronize()`` -- another stream's is not enough); a pinned source buffer must not be
refilled while its copy is pending. The rest are the sync points that need no extra
wait: ``device.synchronize()``, a blocking ``.cpu()`` and a copy into pageable memory,
which is synchronous whatever ``non_blocking`` says.
"""
from __future__ import annotations

from functools import partial
from typing import List

import torch

from .common import (FIVES, _CLEAN, Litmus, _pinned_zeros, _racy, _stall, consume,
                     overlap_streams, produce)


# non_blocking D2H into pinned memory, then one of the host-side waits ------------------

def _d2h(rt, stall: bool, how: str, via_view: bool = False) -> bool:
    """``via_view``: the host reads through a numpy view of the pinned buffer taken
    before the copy (as vLLM's ``CpuGpuBuffer.np``), not through the tensor."""
    m, S, F = overlap_streams(rt)
    x = torch.arange(1, 5, dtype=torch.int32, device=rt.device)
    host = _pinned_zeros(4)
    view = host.numpy() if via_view else None
    m.synchronize()
    with m.stream(F):
        _stall(rt, stall)
        y = x * 10
        host.copy_(y, non_blocking=True)
        copied = m.Event()
        copied.record()
    _host_wait(how, copied, S, F)
    # plain host read of pinned memory, through the tensor or the view
    got = [int(v) for v in view[:4]] if via_view else host.tolist()
    m.synchronize()
    return got != [10, 20, 30, 40]


def _host_wait(how: str, copied, S, F) -> None:
    """The host's wait, as ``how`` names it, for a copy on forward (``F``) that recorded
    ``copied``: "none", the event's synchronize(), polling its query() until True, or a
    stream's synchronize() -- the schedule stream's (``S``: "wrong stream", not the one
    doing the copy) or forward's ("right stream")."""
    if how == "event.synchronize":
        copied.synchronize()
    elif how == "query":
        while not copied.query():
            pass
    elif how == "wrong stream":
        S.synchronize()
    elif how == "right stream":
        F.synchronize()


# A reused pinned staging buffer ---------------------------------------------------------

def pinned_reuse(rt, stall: bool) -> bool:
    m, S, F = overlap_streams(rt)
    staging = _pinned_zeros(4)
    staging.copy_(torch.tensor([1, 2, 3, 4], dtype=torch.int32))  # batch 1, on the host
    dev = torch.zeros(4, dtype=torch.int32, device=rt.device)
    m.synchronize()
    with m.stream(F):
        _stall(rt, stall)
        dev.copy_(staging, non_blocking=True)  # reads the pinned buffer when it executes
    staging.fill_(9)  # batch 2 reuses the buffer while batch 1's copy may be pending
    with m.stream(F):
        got = dev.tolist()
    m.synchronize()
    return got != [1, 2, 3, 4]


# Other host sync points -------------------------------------------------------------------

device_synchronize = partial(consume, wait="device")


def blocking_cpu(rt, stall: bool) -> bool:
    m, S, F, x, _ = produce(rt, stall)
    with m.stream(F):
        got = x.cpu().tolist()  # blocking D2H: syncs the stream it is issued on
    m.synchronize()
    return got != FIVES


def d2h_pageable(rt, stall: bool) -> bool:
    m, S, F, x, _ = produce(rt, stall)
    host = torch.zeros(4, dtype=torch.int32)  # pageable: non_blocking cannot apply
    with m.stream(F):
        host.copy_(x, non_blocking=True)  # D2H into pageable memory returns when done
    got = host.tolist()
    m.synchronize()
    return got != FIVES


D2H: List[Litmus] = [
    Litmus("d2h_before_sync", "non_blocking D2H into pinned memory, read on the host "
           "before event.synchronize()", partial(_d2h, how="none"), race=True, stale=_racy()),
    Litmus("d2h_after_sync", "non_blocking D2H into pinned memory, read after "
           "event.synchronize()", partial(_d2h, how="event.synchronize"), race=False,
           stale=dict(_CLEAN)),
    Litmus("query_poll", "non_blocking D2H, host polls event.query() until True, then "
           "reads (CSAN flags this falsely)", partial(_d2h, how="query"), race=False,
           stale=dict(_CLEAN)),
]

PINNED: List[Litmus] = [
    Litmus("pinned_reuse", "the host refills a pinned staging buffer while its "
           "non_blocking H2D copy is still pending", pinned_reuse, race=True,
           stale=_racy()),
]

STREAM_SYNC: List[Litmus] = [
    Litmus("wrong_stream_sync", "non_blocking D2H on forward, host synchronizes the "
           "schedule stream, then reads", partial(_d2h, how="wrong stream"), race=True,
           stale=_racy()),
    Litmus("right_stream_sync", "non_blocking D2H on forward, host synchronizes forward, "
           "then reads", partial(_d2h, how="right stream"), race=False, stale=dict(_CLEAN)),
]

SYNC_POINTS: List[Litmus] = [
    Litmus("device_synchronize", "forward writes, the host synchronizes the device, "
           "schedule reads", device_synchronize, race=False, stale=dict(_CLEAN)),
    Litmus("blocking_cpu", "forward writes, a blocking .cpu() on forward reads",
           blocking_cpu, race=False, stale=dict(_CLEAN)),
    Litmus("d2h_pageable", "copy_(non_blocking=True) into pageable host memory is "
           "synchronous", d2h_pageable, race=False, stale=dict(_CLEAN)),
]
