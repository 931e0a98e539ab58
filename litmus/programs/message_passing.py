"""Message passing and stream/event waits: one stream writes, another reads, and the
only thing that can order them is a ``wait_event`` / ``wait_stream`` on the reader.

These are the smallest cross-stream programs there are, so they pin down the basics
every other family builds on: an unsynchronised reader may see the old value, either
wait orders it, an event covers only the work recorded before it (a wait is
point-in-time), and a write-after-read is a race just like a read-after-write.
"""
from __future__ import annotations

from functools import partial
from typing import List

import torch

from .common import _CLEAN, Litmus, _racy, _stall, consume, overlap_streams


mp_nosync = partial(consume, wait="")
mp_wait_event = partial(consume, wait="event")
mp_wait_stream = partial(consume, wait="stream")


# WAR: the reader is stalled while another stream overwrites its input -------------------

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


# Waits are point-in-time: an event covers only what was issued before its record -------

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


MESSAGE_PASSING: List[Litmus] = [
    Litmus("mp_nosync", "message passing: forward writes, schedule reads with no sync",
           mp_nosync, race=True, stale=_racy()),
    Litmus("mp_wait_event", "message passing with an event recorded after the write",
           mp_wait_event, race=False, stale=dict(_CLEAN)),
    Litmus("mp_wait_stream", "message passing with schedule.wait_stream(forward)",
           mp_wait_stream, race=False, stale=dict(_CLEAN)),
]

WAR: List[Litmus] = [
    Litmus("war_overwrite", "WAR: the reader stream is stalled while forward overwrites "
           "its input", war_overwrite, race=True, stale=_racy(lazy=False),
           stalled_stream="schedule"),
]

EVENT_POINTS: List[Litmus] = [
    Litmus("event_before_write", "wait on an event recorded before the write: the wait is "
           "point-in-time, the write is not covered", partial(_event_point, after=False), race=True,
           stale=_racy()),
    Litmus("event_after_write", "wait on an event recorded after the write",
           partial(_event_point, after=True), race=False, stale=dict(_CLEAN)),
]
