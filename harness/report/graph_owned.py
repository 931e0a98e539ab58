"""Which results a copy stream reads out of CUDA-graph storage: found in the trace, not in
a hand-kept list -- so a later release that hands out one more static graph output (a
``block_accept_lens`` beside ``accept_lens``) shows up unasked.

A storage is graph-owned when a graph replay writes it (a ``ReplayedOp``'s write): the
next replay rewrites it in place, whatever the caching allocator knows. A device-to-host
copy that reads it is a readback of a graph output -- correct only if nothing lets that
replay run first.
"""
from __future__ import annotations

from typing import Any, Dict, List

from harness.runtime.trace import OpKind, OpRecord, ReplayedOp, Trace, short_path


def graph_owned_reads(trace: Trace) -> List[Dict[str, Any]]:
    """One row per graph-owned storage a copy reads: the storage (its allocation site),
    the stream and site of the copy, and the captured op that writes it (first seen)."""
    written: Dict[int, ReplayedOp] = {}
    rows: Dict[int, Dict[str, Any]] = {}
    for op in trace.executed:
        if type(op) is ReplayedOp:
            for sid, _lo, _hi in op.writes:
                written.setdefault(sid, op)
        elif isinstance(op, OpRecord) and op.kind == OpKind.COPY:
            for sid, _lo, _hi in op.reads:
                writer = written.get(sid)
                if writer is not None and sid not in rows:
                    rows[sid] = {
                        "storage": trace.storage_name(sid),
                        "read_by": f"{trace.stream_name(op.stream)} {op.name}",
                        "read_at": _site(op.frame),
                        "written_by": f"{writer.name} captured at {_site(writer.frame)}",
                        "written_frame": (short_path(writer.frame[0]), writer.frame[1])
                        if writer.frame else None}
    return list(rows.values())


def _site(frame) -> str:
    if not frame:
        return "?"
    return f"{short_path(frame[0])}:{frame[1]} ({frame[2]})"
