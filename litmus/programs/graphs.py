"""CUDA graphs: a replay is one launch of every captured kernel on the current stream,
reading and writing the graph's static input and output buffers.

Servers replay a captured decode step on one stream and refill its static input or read
its static output from another, so a replay needs the same ordering as any other work:
a read of the static output after the replay, a refill of the static input after the
replay has read it, a host read of a pinned static output after the replaying stream is
synchronized. A host sync inside a capture must be refused.
"""
from __future__ import annotations

from functools import partial
from typing import List

import torch

from .common import _CLEAN, Litmus, _i32, _pinned_zeros, _racy, _stall, overlap_streams


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
