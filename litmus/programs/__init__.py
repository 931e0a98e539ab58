"""Litmus programs: small stream programs with a known verdict (CUDA's stream semantics:
harness/runtime/sim/device.py), one module per
family, gathered here into the catalogue.

* ``common``          -- the ``Litmus`` record, the policy ``KINDS``, the expectation
  tables and the helpers every body uses (see its docstring for what a program is and
  what its expectations mean).
* ``message_passing`` -- a write on one stream, a read on another, ordered (or not) by
  ``wait_event`` / ``wait_stream``; write-after-read; point-in-time events.
* ``relay``           -- the overlap scheduler's relay shapes: the seed (accept_lens
  under the fine and the coarse fence) and an index filtered on one stream, used on the
  other.
* ``host_sync``       -- device<->host copies, pinned memory and the host's sync points.
* ``allocator``       -- uninitialised blocks and caching-allocator reuse across streams.
* ``graphs``          -- CUDA graph replays and their static buffers.
* ``load``            -- background bulk traffic on the copy engines (``runtime.load``).
* ``numpy_views``     -- pinned memory read and written through numpy views taken once,
  and streams named through ``torch.cuda`` (how vLLM writes them).

``PROGRAMS`` keeps one fixed order (reports and the CLI list the programs in it), so the
families' groups are laid out below rather than one family after another.
"""
from __future__ import annotations

from typing import Dict, List

from .allocator import REUSE, UNINITIALISED
from .common import KINDS, STALL_MS, Litmus, overlap_streams
from .graphs import GRAPH_PROGRAMS
from .host_sync import D2H, PINNED, STREAM_SYNC, SYNC_POINTS
from .load import LOAD
from .message_passing import EVENT_POINTS, MESSAGE_PASSING, WAR
from .numpy_views import NUMPY_VIEWS, UVA
from .relay import FILTER, SEED

__all__ = ["KINDS", "STALL_MS", "Litmus", "overlap_streams", "PROGRAMS", "GRAPH_PROGRAMS",
           "BY_NAME", "get"]

PROGRAMS: List[Litmus] = [
    *MESSAGE_PASSING,
    *SEED,
    *D2H,
    *WAR,
    *FILTER,
    *PINNED,
    *UNINITIALISED,
    *EVENT_POINTS,
    *STREAM_SYNC,
    *SYNC_POINTS,
    *REUSE,
    *LOAD,
    *NUMPY_VIEWS,
    *UVA,
    *GRAPH_PROGRAMS,  # last: graph_capture_sync is the one that leaves CUDA state behind
]

BY_NAME: Dict[str, Litmus] = {p.name: p for p in PROGRAMS}


def get(name: str) -> Litmus:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown litmus program {name!r}; known: {', '.join(BY_NAME)}") from None
