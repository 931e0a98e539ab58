"""Litmus programs: small stream programs with a known verdict (SPEC §1).

Each program is a ``Litmus``: ``body(rt, stall) -> bool`` runs it on a runtime ``rt``
(simulator or CUDA -- it touches only ``rt.device``, ``rt.module``, ``rt.label``,
``rt.stall`` and ordinary torch ops) and returns True iff a stale, poisoned or otherwise
wrong value reached the host, judged against the value a sequential execution (every op
run the moment it is issued, in host program order) gives.

``stall=True`` makes the body call ``rt.stall(STALL_MS)`` on ``stalled_stream`` at the one
point whose delay exposes the race (right before the write / the read that races); the
simulator's schedule policies expose it without that.

Expectations:

* ``race``  -- whether the happens-before detector must report a race. It is a property of
  the program's synchronisation, so it holds on every schedule.
* ``stale`` -- per policy kind: ``eager``, ``lazy``, ``stall`` (= ``stall(<stalled_stream>)``),
  ``random``, ``pct``, ``cuda`` (real GPU, no injected stall) and ``cuda_stall`` (real GPU,
  ``stall=True``): True (must be stale), False (must be fresh) or None (either).
  ``expected_stale(kind)`` fills in ``cuda`` when a program leaves it out.

Every body allocates its inputs, then ``synchronize()``s the device once so the setup is
ordered before the program proper, and ends with a ``synchronize()`` so no work (or stall)
outlives it.

The caching-allocator programs (22-27) start with ``empty_cache()`` so that on CUDA the
block a program frees is the one its next allocation on that stream gets, whatever the
programs before it left cached (the stream objects come from a pool and are reused).
"""
from __future__ import annotations

from functools import partial

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch

STALL_MS = 20.0  # the injected delay; on CUDA it dwarfs the host's few µs per launch

KINDS = ("eager", "lazy", "stall", "random", "pct", "cuda", "cuda_stall")


@dataclass(frozen=True)
class Litmus:
    name: str
    doc: str
    body: Callable[..., bool]
    race: bool
    stale: Dict[str, Optional[bool]] = field(default_factory=dict)
    stalled_stream: str = "forward"

    def expected_stale(self, kind: str) -> Optional[bool]:
        """True / False / None (either) for a policy kind (see the module docstring)."""
        if kind in self.stale:
            return self.stale[kind]
        if kind == "cuda":  # unstalled hardware: a racy program may go either way
            return None if self.race else self.stale.get("eager")
        raise KeyError(f"{self.name}: no expectation for policy kind {kind!r}")

    def run(self, rt, stall: bool = False) -> bool:
        return bool(self.body(rt, stall))


# Expectation tables --------------------------------------------------------------------

def _racy(lazy: bool = True) -> Dict[str, Optional[bool]]:
    """A racy program: fresh when every op runs at issue; stale when the stalled stream
    (or, with ``lazy``, every stream) runs only on demand; either under the random ones."""
    return {"eager": False, "lazy": lazy, "stall": True, "random": None, "pct": None,
            "cuda": None, "cuda_stall": True}


_CLEAN = {k: False for k in KINDS}
# Uninitialised memory: on the simulator the freed block's old contents (its caching
# allocator hands it straight back) or poison, never what the program wants. On CUDA it is
# whatever the caching allocator hands back -- a freed block's old contents, or fresh
# (often zero) memory when another block comes back -- so either verdict.
_POISON = {k: (None if k.startswith("cuda") else True) for k in KINDS}


# Helpers -------------------------------------------------------------------------------

def overlap_streams(rt):
    """The device module and the two streams of the overlap scheduler, labelled."""
    m = rt.module
    S, F = m.Stream(), m.Stream()
    rt.label(S, "schedule")
    rt.label(F, "forward")
    return m, S, F


def _stall(rt, stall: bool) -> None:
    if stall:
        rt.stall(STALL_MS)


def _i32(values, rt) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=rt.device)


def _pinned_zeros(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.int32, pin_memory=True)


# 1-3: message passing ------------------------------------------------------------------

def mp_nosync(rt, stall: bool) -> bool:
    m, S, F = overlap_streams(rt)
    x = torch.zeros(4, dtype=torch.int32, device=rt.device)
    m.synchronize()
    with m.stream(F):
        _stall(rt, stall)
        x.add_(5)  # producer
    with m.stream(S):
        got = x.tolist()  # consumer: nothing orders it after the producer
    m.synchronize()
    return got != [5, 5, 5, 5]


def mp_wait_event(rt, stall: bool) -> bool:
    m, S, F = overlap_streams(rt)
    x = torch.zeros(4, dtype=torch.int32, device=rt.device)
    m.synchronize()
    with m.stream(F):
        _stall(rt, stall)
        x.add_(5)
        ready = m.Event()
        ready.record()
    with m.stream(S):
        S.wait_event(ready)
        got = x.tolist()
    m.synchronize()
    return got != [5, 5, 5, 5]


def mp_wait_stream(rt, stall: bool) -> bool:
    m, S, F = overlap_streams(rt)
    x = torch.zeros(4, dtype=torch.int32, device=rt.device)
    m.synchronize()
    with m.stream(F):
        _stall(rt, stall)
        x.add_(5)
    with m.stream(S):
        S.wait_stream(F)
        got = x.tolist()
    m.synchronize()
    return got != [5, 5, 5, 5]


# 4-5: the seed (NGRAM accept relay, pre-fix filter_batch) ------------------------------

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


# 6-8, 17-18: non_blocking D2H into pinned memory ---------------------------------------

def _d2h(rt, stall: bool, how: str) -> bool:
    m, S, F = overlap_streams(rt)
    x = torch.arange(1, 5, dtype=torch.int32, device=rt.device)
    host = _pinned_zeros(4)
    m.synchronize()
    with m.stream(F):
        _stall(rt, stall)
        y = x * 10
        host.copy_(y, non_blocking=True)
        copied = m.Event()
        copied.record()
    if how == "event.synchronize":
        copied.synchronize()
    elif how == "query":
        while not copied.query():
            pass
    elif how == "wrong stream":
        S.synchronize()  # the schedule stream -- not the one doing the copy
    elif how == "right stream":
        F.synchronize()
    got = host.tolist()  # plain host read of pinned memory
    m.synchronize()
    return got != [10, 20, 30, 40]


# 9: WAR -- the reader is stalled while another stream overwrites its input -------------

def war_overwrite(rt, stall: bool) -> bool:
    m, S, F = overlap_streams(rt)
    x = torch.arange(1, 5, dtype=torch.int32, device=rt.device)
    m.synchronize()
    with m.stream(S):
        _stall(rt, stall)
        snap = x.clone()  # reader
    with m.stream(F):
        x.fill_(99)  # writer: does not wait for the reader
    S.synchronize()
    got = snap.tolist()
    m.synchronize()
    return got != [1, 2, 3, 4]


# 10-11: an index tensor filtered on one stream, consumed on another ----------------------

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


# 12: a reused pinned staging buffer ---------------------------------------------------

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


# 13-14: uninitialised device memory ---------------------------------------------------

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


# 15-16: waits are point-in-time --------------------------------------------------------

def _event_point(rt, stall: bool, after: bool) -> bool:
    m, S, F = overlap_streams(rt)
    x = torch.zeros(4, dtype=torch.int32, device=rt.device)
    m.synchronize()
    ev = m.Event()
    with m.stream(F):
        x.fill_(1)
        if not after:
            ev.record()  # captures F's position now: the add below is not covered
        _stall(rt, stall)
        x.add_(10)
        if after:
            ev.record()
    with m.stream(S):
        S.wait_event(ev)
        got = x.tolist()
    m.synchronize()
    return got != [11, 11, 11, 11]


# 19-21: other host sync points ---------------------------------------------------------

def device_synchronize(rt, stall: bool) -> bool:
    m, S, F = overlap_streams(rt)
    x = torch.zeros(4, dtype=torch.int32, device=rt.device)
    m.synchronize()
    with m.stream(F):
        _stall(rt, stall)
        x.add_(5)
    m.synchronize()  # waits for every stream
    with m.stream(S):
        got = x.tolist()
    m.synchronize()
    return got != [5, 5, 5, 5]


def blocking_cpu(rt, stall: bool) -> bool:
    m, S, F = overlap_streams(rt)
    x = torch.zeros(4, dtype=torch.int32, device=rt.device)
    m.synchronize()
    with m.stream(F):
        _stall(rt, stall)
        x.add_(5)
        got = x.cpu().tolist()  # blocking D2H: syncs the stream it is issued on
    m.synchronize()
    return got != [5, 5, 5, 5]


def d2h_pageable(rt, stall: bool) -> bool:
    m, S, F = overlap_streams(rt)
    x = torch.zeros(4, dtype=torch.int32, device=rt.device)
    host = torch.zeros(4, dtype=torch.int32)  # pageable: non_blocking cannot apply
    m.synchronize()
    with m.stream(F):
        _stall(rt, stall)
        x.add_(5)
        host.copy_(x, non_blocking=True)  # D2H into pageable memory returns when done
    got = host.tolist()
    m.synchronize()
    return got != [5, 5, 5, 5]


# 22-27: caching-allocator reuse ----------------------------------------------------------
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


# 28-34: CUDA graphs (a replay is one launch of every captured kernel on the current stream)

def _capture(rt, m, stall: bool, body):
    """Capture ``body`` into a graph on a side stream, as servers do: one warm-up run
    there first (lazy kernel loading must not happen inside a capture on a GPU). The
    stall, when asked, is captured too, so every replay starts with it (a real GPU has no
    other way to delay a replay's kernels)."""
    g = m.CUDAGraph()
    side = m.Stream()
    rt.label(side, "graph")
    side.wait_stream(m.current_stream())
    with m.stream(side):
        body()
    with m.graph(g, stream=side):
        _stall(rt, stall)
        out = body()
    return g, out


def _graph_replay_read(rt, stall: bool, wait: bool) -> bool:
    """Replay on forward, read the static output on schedule."""
    m, S, F = overlap_streams(rt)
    static_in = torch.zeros(4, dtype=torch.int32, device=rt.device)
    batch1, batch2 = _i32([1, 2, 3, 4], rt), _i32([5, 6, 7, 8], rt)
    m.synchronize()
    g, out = _capture(rt, m, stall, lambda: static_in * 10)
    with m.stream(F):
        static_in.copy_(batch1)
        g.replay()
    m.synchronize()  # the static output now holds batch 1's result
    with m.stream(F):
        static_in.copy_(batch2)
        g.replay()
    with m.stream(S):
        if wait:
            S.wait_stream(F)
        got = out.tolist()
    m.synchronize()
    return got != [50, 60, 70, 80]


def _graph_refill(rt, stall: bool, wait: bool) -> bool:
    """Schedule refills the static input (the next batch) while forward's replay may
    still be reading it."""
    m, S, F = overlap_streams(rt)
    static_in = torch.zeros(4, dtype=torch.int32, device=rt.device)
    batch1, batch2 = _i32([1, 2, 3, 4], rt), _i32([5, 6, 7, 8], rt)
    m.synchronize()
    g, out = _capture(rt, m, stall, lambda: static_in * 10)
    static_in.copy_(batch1)
    m.synchronize()
    with m.stream(F):
        g.replay()  # reads static_in
    with m.stream(S):
        if wait:
            S.wait_stream(F)
        static_in.copy_(batch2)
    with m.stream(F):
        got = out.tolist()  # batch 1's result
    m.synchronize()
    return got != [10, 20, 30, 40]


def _graph_host_read(rt, stall: bool, synced: bool) -> bool:
    """The graph's static output is pinned host memory (a captured non_blocking D2H);
    the host reads it after the replay, with or without synchronizing forward."""
    m, S, F = overlap_streams(rt)
    static_in = torch.zeros(4, dtype=torch.int32, device=rt.device)
    batch = _i32([1, 2, 3, 4], rt)
    host = _pinned_zeros(4)
    m.synchronize()

    def body():
        host.copy_(static_in * 10, non_blocking=True)
    g, _ = _capture(rt, m, stall, body)
    with m.stream(F):
        static_in.copy_(batch)
        g.replay()
    if synced:
        F.synchronize()
    got = host.tolist()  # plain host read of pinned memory
    m.synchronize()
    return got != [10, 20, 30, 40]


def graph_capture_sync(rt, stall: bool) -> bool:
    """A host sync inside a capture must be refused (CUDA: "operation not permitted when
    stream is capturing"); True (wrong) if the capture went through."""
    m, S, F = overlap_streams(rt)
    x = torch.arange(4, dtype=torch.int32, device=rt.device)
    m.synchronize()
    try:
        _capture(rt, m, stall, lambda: (x + 1).sum().item())  # fine in the warm-up only
        refused = False
    except RuntimeError:
        refused = True
    m.synchronize()
    return not refused


GRAPH_PROGRAMS: List[Litmus] = [
    Litmus("graph_replay_nosync", "a graph replayed on forward, its static output read on "
           "schedule with no wait", partial(_graph_replay_read, wait=False), race=True,
           stale=_racy()),
    Litmus("graph_replay_wait", "a graph replayed on forward, its static output read on "
           "schedule after wait_stream(forward)", partial(_graph_replay_read, wait=True),
           race=False, stale=dict(_CLEAN)),
    Litmus("graph_refill_inflight", "schedule refills a graph's static input while "
           "forward's replay may still be reading it", partial(_graph_refill, wait=False),
           race=True, stale=_racy(lazy=False)),
    Litmus("graph_refill_after_wait", "schedule refills the static input after "
           "wait_stream(forward)", partial(_graph_refill, wait=True), race=False,
           stale=dict(_CLEAN)),
    Litmus("graph_host_read_before_sync", "a replay's static output in pinned memory, read "
           "on the host before forward is synchronized", partial(_graph_host_read, synced=False),
           race=True, stale=_racy()),
    Litmus("graph_host_read_after_sync", "the same, read after forward.synchronize()",
           partial(_graph_host_read, synced=True), race=False, stale=dict(_CLEAN)),
    # Last: on a GPU a refused capture is the one program that leaves CUDA state behind.
    Litmus("graph_capture_sync", "a host sync (.item()) inside a graph capture is refused",
           graph_capture_sync, race=False, stale=dict(_CLEAN)),
]


PROGRAMS: List[Litmus] = [
    Litmus("mp_nosync", "message passing: forward writes, schedule reads with no sync",
           mp_nosync, race=True, stale=_racy()),
    Litmus("mp_wait_event", "message passing with an event recorded after the write",
           mp_wait_event, race=False, stale=dict(_CLEAN)),
    Litmus("mp_wait_stream", "message passing with schedule.wait_stream(forward)",
           mp_wait_stream, race=False, stale=dict(_CLEAN)),
    Litmus("seed_fine_fence", "the seed: schedule gathers accept_lens after waiting on an "
           "event recorded before forward's write", partial(_seed, coarse=False), race=True,
           stale=_racy()),
    Litmus("seed_coarse_fence", "the seed with the coarse fence wait_stream(forward) after "
           "the write", partial(_seed, coarse=True), race=False, stale=dict(_CLEAN)),
    Litmus("d2h_before_sync", "non_blocking D2H into pinned memory, read on the host "
           "before event.synchronize()", partial(_d2h, how="none"), race=True, stale=_racy()),
    Litmus("d2h_after_sync", "non_blocking D2H into pinned memory, read after "
           "event.synchronize()", partial(_d2h, how="event.synchronize"), race=False,
           stale=dict(_CLEAN)),
    Litmus("query_poll", "non_blocking D2H, host polls event.query() until True, then "
           "reads (CSAN flags this falsely)", partial(_d2h, how="query"), race=False,
           stale=dict(_CLEAN)),
    Litmus("war_overwrite", "WAR: the reader stream is stalled while forward overwrites "
           "its input", war_overwrite, race=True, stale=_racy(lazy=False),
           stalled_stream="schedule"),
    Litmus("filter_index_nosync", "an index tensor filtered on schedule, consumed on "
           "forward without a wait", partial(_filter, synced=False), race=True, stale=_racy(),
           stalled_stream="schedule"),
    Litmus("filter_index_sync", "an index tensor filtered on schedule, consumed on forward "
           "after wait_stream(schedule)", partial(_filter, synced=True), race=False,
           stale=dict(_CLEAN), stalled_stream="schedule"),
    Litmus("pinned_reuse", "the host refills a pinned staging buffer while its "
           "non_blocking H2D copy is still pending", pinned_reuse, race=True,
           stale=_racy()),
    Litmus("empty_vs_zeros", "torch.empty where torch.zeros was meant: the unwritten "
           "rows read as garbage (poison), on every schedule; no race",
           partial(_alloc, factory=torch.empty),
           race=False, stale=dict(_POISON)),
    Litmus("zeros_read", "the same program with torch.zeros",
           partial(_alloc, factory=torch.zeros), race=False,
           stale=dict(_CLEAN)),
    Litmus("event_before_write", "wait on an event recorded before the write: the wait is "
           "point-in-time, the write is not covered", partial(_event_point, after=False), race=True,
           stale=_racy()),
    Litmus("event_after_write", "wait on an event recorded after the write",
           partial(_event_point, after=True), race=False, stale=dict(_CLEAN)),
    Litmus("wrong_stream_sync", "non_blocking D2H on forward, host synchronizes the "
           "schedule stream, then reads", partial(_d2h, how="wrong stream"), race=True,
           stale=_racy()),
    Litmus("right_stream_sync", "non_blocking D2H on forward, host synchronizes forward, "
           "then reads", partial(_d2h, how="right stream"), race=False, stale=dict(_CLEAN)),
    Litmus("device_synchronize", "forward writes, the host synchronizes the device, "
           "schedule reads", device_synchronize, race=False, stale=dict(_CLEAN)),
    Litmus("blocking_cpu", "forward writes, a blocking .cpu() on forward reads",
           blocking_cpu, race=False, stale=dict(_CLEAN)),
    Litmus("d2h_pageable", "copy_(non_blocking=True) into pageable host memory is "
           "synchronous", d2h_pageable, race=False, stale=dict(_CLEAN)),
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

PROGRAMS += GRAPH_PROGRAMS

BY_NAME: Dict[str, Litmus] = {p.name: p for p in PROGRAMS}


def get(name: str) -> Litmus:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown litmus program {name!r}; known: {', '.join(BY_NAME)}") from None
