"""Device memory from the caching allocator: uninitialised blocks and blocks reused
across streams.

``empty_vs_zeros`` / ``zeros_read`` read rows the program never wrote: with
``torch.empty`` they hold whatever the allocator's block held before (or poison on the
simulator), with ``torch.zeros`` they are zero -- a bug with no race in it, on every
schedule. The ``reuse_*`` programs free a tensor that another stream still uses: the
caching allocator returns a block to its home stream's pool at the host's free, so the
next allocation there may get it while the other stream's read or write is pending,
unless ``record_stream``, a host ``synchronize()`` or a ``wait_stream`` orders the two
owners.

The ``reuse_*`` programs start with ``empty_cache()`` so that on CUDA the block a program
frees is the one its next allocation on that stream gets, whatever the programs before it
left cached (the stream objects come from a pool and are reused).
"""
from __future__ import annotations

from functools import partial
from typing import List

import torch

from .common import _CLEAN, _POISON, Litmus, _racy, _stall, overlap_streams


# Uninitialised device memory --------------------------------------------------------------

def _alloc(rt, stall: bool, factory) -> bool:
    m, S, F = overlap_streams(rt)
    with m.stream(F):
        # The caching allocator hands this block straight back to the allocation below
        # (on CUDA and on the simulator), so ``empty`` shows 7s there: never zeros.
        junk = torch.full((4,), 7, dtype=torch.int32, device=rt.device)
        del junk
        buf = factory(4, dtype=torch.int32, device=rt.device)
        _stall(rt, stall)
        buf[:2] = 1  # the code writes only the rows it uses ...
        got = buf.tolist()  # ... and reads them all
    m.synchronize()
    return got != [1, 1, 0, 0]


# Caching-allocator reuse ------------------------------------------------------------------
# x is allocated on forward (its home stream) and used on schedule; then the host drops
# it, and forward's next allocation may get its block while schedule's use is pending.

def _reuse(rt, stall: bool, how: str) -> bool:
    m, S, F = overlap_streams(rt)
    m.empty_cache()
    with m.stream(F):
        x = torch.full((4,), 1, dtype=torch.int32, device=rt.device)
    m.synchronize()
    user = F if how == "same stream" else S
    with m.stream(user):
        _stall(rt, stall)
        if how == "stale write":
            x.fill_(3)  # the old owner's pending write
            y = None
        else:
            y = x * 10  # the old owner's pending read
        if how == "record_stream":
            x.record_stream(S)
    if how == "sync":
        S.synchronize()
    del x  # the host frees it: the block goes back to forward's pool at once
    with m.stream(F):
        if how == "wait":
            F.wait_stream(S)  # the new owner's first use waits for the old one
        z = torch.full((4,), 7, dtype=torch.int32, device=rt.device)  # likely x's block
    m.synchronize()
    if how == "stale write":
        return z.tolist() != [7, 7, 7, 7]  # the old owner's write landed in z
    return y.tolist() != [10, 10, 10, 10]


UNINITIALISED: List[Litmus] = [
    Litmus("empty_vs_zeros", "torch.empty where torch.zeros was meant: the unwritten "
           "rows read as garbage (poison), on every schedule; no race",
           partial(_alloc, factory=torch.empty),
           race=False, stale=dict(_POISON)),
    Litmus("zeros_read", "the same program with torch.zeros",
           partial(_alloc, factory=torch.zeros), race=False,
           stale=dict(_CLEAN)),
]

REUSE: List[Litmus] = [
    Litmus("reuse_stale_read", "x read on schedule, freed without record_stream, its block "
           "reallocated on forward: the pending read sees the new owner's data",
           partial(_reuse, how="stale read"), race=True, stale=_racy(lazy=False),
           stalled_stream="schedule"),
    Litmus("reuse_stale_write", "x written on schedule, freed without record_stream, its "
           "block reallocated on forward: the pending write lands in the new owner",
           partial(_reuse, how="stale write"), race=True, stale=_racy(lazy=False),
           stalled_stream="schedule"),
    Litmus("reuse_record_stream", "the same read with x.record_stream(schedule): the block "
           "is not handed out before schedule passed the free",
           partial(_reuse, how="record_stream"), race=False, stale=dict(_CLEAN),
           stalled_stream="schedule"),
    Litmus("reuse_same_stream", "x used on its own stream, freed, reallocated there: stream "
           "order protects it", partial(_reuse, how="same stream"), race=False,
           stale=dict(_CLEAN)),
    Litmus("reuse_after_sync", "x read on schedule, schedule.synchronize(), then freed and "
           "reallocated", partial(_reuse, how="sync"), race=False, stale=dict(_CLEAN),
           stalled_stream="schedule"),
    Litmus("reuse_after_wait", "x read on schedule, freed; the new owner's stream waits on "
           "schedule before its first use", partial(_reuse, how="wait"), race=False,
           stale=dict(_CLEAN), stalled_stream="schedule"),
]
