"""The relay shapes of the overlap scheduler: a tensor written on one stream is gathered
or consumed on the other, fenced (or not) by the scheduler's own synchronisation.

``seed_*`` is the seed race reduced to its streams: verify writes ``accept_lens`` on
forward while the pre-fix filter_batch gathers it on schedule. The fine fence is an event recorded
*before* the write (it orders only the shared read it was meant for), so the gather is
unordered with the write; the coarse fence ``wait_stream(forward)`` covers the write.
``filter_index_*`` is the reverse relay: an index tensor filtered on schedule and used
for a gather on forward, with and without ``wait_stream(schedule)``.
"""
from __future__ import annotations

from functools import partial
from typing import List

import torch

from .common import _CLEAN, Litmus, _i32, _racy, _stall, overlap_streams


# The seed: the NGRAM accept relay into filter_batch, with the fine and the coarse fence --

def _seed(rt, stall: bool, coarse: bool) -> bool:
    m, S, F = overlap_streams(rt)
    accept_lens = torch.zeros(8, dtype=torch.int32, device=rt.device)  # req-pool indexed
    pool_idx = torch.tensor([1, 4, 6], dtype=torch.int64, device=rt.device)
    verified = _i32([3, 2, 4], rt)
    m.synchronize()
    with m.stream(F):
        shared_view = accept_lens.sum()  # the shared read the fine fence was meant for
        shared_read_done = m.Event()
        shared_read_done.record()  # fine fence: recorded BEFORE the accept write
        _stall(rt, stall)
        accept_lens[pool_idx] = verified  # verify writes accept_lens
    with m.stream(S):
        if coarse:
            S.wait_stream(F)  # coarse WAR fence: everything F has issued, write included
        else:
            S.wait_event(shared_read_done)
        got = accept_lens[pool_idx].tolist()  # filter_batch gathers on the schedule stream
    m.synchronize()
    del shared_view
    return got != [3, 2, 4]


# An index tensor filtered on one stream, consumed on another ----------------------------

def _filter(rt, stall: bool, synced: bool) -> bool:
    m, S, F = overlap_streams(rt)
    table = torch.arange(0, 80, 10, dtype=torch.int64, device=rt.device)
    idx = torch.arange(8, dtype=torch.int64, device=rt.device)
    keep = torch.tensor([1, 3, 5, 7], dtype=torch.int64, device=rt.device)
    # Zero-initialised, so whatever F reads is a valid index (no device assert on CUDA).
    filtered = torch.zeros(4, dtype=torch.int64, device=rt.device)
    m.synchronize()
    with m.stream(S):
        _stall(rt, stall)
        torch.index_select(idx, 0, keep, out=filtered)  # filter_batch on schedule
    with m.stream(F):
        if synced:
            F.wait_stream(S)
        got = table.index_select(0, filtered).tolist()  # consumed on forward
    m.synchronize()
    return got != [10, 30, 50, 70]


SEED: List[Litmus] = [
    Litmus("seed_fine_fence", "the seed: schedule gathers accept_lens after waiting on an "
           "event recorded before forward's write", partial(_seed, coarse=False), race=True,
           stale=_racy()),
    Litmus("seed_coarse_fence", "the seed with the coarse fence wait_stream(forward) after "
           "the write", partial(_seed, coarse=True), race=False, stale=dict(_CLEAN)),
]

FILTER: List[Litmus] = [
    Litmus("filter_index_nosync", "an index tensor filtered on schedule, consumed on "
           "forward without a wait", partial(_filter, synced=False), race=True, stale=_racy(),
           stalled_stream="schedule"),
    Litmus("filter_index_sync", "an index tensor filtered on schedule, consumed on forward "
           "after wait_stream(schedule)", partial(_filter, synced=True), race=False,
           stale=dict(_CLEAN), stalled_stream="schedule"),
]
