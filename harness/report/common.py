"""What the trace view and the timeline picture share: a time base, names, race marks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple, Union

from harness.runtime.trace import (HostAccess, OpKind, OpRecord, QueryRecord, Record, SyncRecord,
                                   Trace, access_label, frame_text)

if TYPE_CHECKING:
    from harness.detect import Race

SYNTHETIC_STEP_US = 10.0  # one trace-log position, when ops carry no times (CUDA)
SYNTHETIC_DUR_US = 8.0

# The records the host lane of the views shows.
HostRecord = Union[SyncRecord, HostAccess, QueryRecord]


def where(frame: Optional[Tuple[str, int, str]]) -> Optional[str]:
    """A site for the trace view (None: no frame)."""
    return frame_text(frame, missing=None)


def access_names(trace: Trace, accesses) -> List[str]:
    return [f"{trace.storage_name(sid)} [{lo}:{hi})" for sid, lo, hi in accesses]


@dataclass
class Layout:
    """Where every record sits on one time axis (µs).

    ``virtual``: the simulator's virtual clock (ops: start/end, host records: ``time``).
    ``synthetic``: no per-op times (CUDA): every record at ``log index * 10 µs``, in host
    program order -- the order the host enqueued, not a measured execution order.
    """

    mode: str
    ops: List[OpRecord]  # in execution order (virtual) / host order (synthetic)
    span: Dict[int, Tuple[float, float]] = field(default_factory=dict)  # log index -> (ts, end)
    not_executed: int = 0

    def ts(self, rec: Record) -> Optional[float]:
        s = self.span.get(rec.index)
        return s[0] if s else None

    def host_time(self, rec: HostRecord) -> float:
        if self.mode == "synthetic":
            return rec.index * SYNTHETIC_STEP_US
        return float(rec.time)


def layout(trace: Trace) -> Layout:
    ops_log = [r for r in trace.log if isinstance(r, OpRecord)]
    executed = list(trace.executed) or ops_log
    timed = bool(executed) and all(op.start is not None and op.end is not None
                                   for op in executed)
    if timed:
        lay = Layout("virtual", executed)
        stream_end: Dict[int, float] = {}
        for op in executed:
            start, end = float(op.start), float(op.end)
            if op.kind == OpKind.STALL:
                # The simulator stamps a stall "held until forced" with the time it was
                # released; the stream was held from the stall's enqueue (or from when
                # its previous op ended) -- show that span, it is what the stall did.
                start = min(start, max(float(op.enq), stream_end.get(op.stream, 0.0)))
            lay.span[op.index] = (start, end)
            stream_end[op.stream] = end
        lay.not_executed = sum(1 for op in ops_log if op.index not in lay.span)
        return lay
    lay = Layout("synthetic", ops_log)
    for op in ops_log:
        t = op.index * SYNTHETIC_STEP_US
        lay.span[op.index] = (t, t + SYNTHETIC_DUR_US)
    return lay


def time_note(lay: Layout) -> str:
    if lay.mode == "virtual":
        return "simulator virtual time (µs): ops at their executed start/end"
    return (f"synthetic time: no per-op timing on this backend; each trace-log record is "
            f"placed at index x {SYNTHETIC_STEP_US:g} µs in host program order")


def race_marks(trace: Trace, races: List[Race]) -> Dict[int, List[str]]:
    """trace-log index -> ["RAW #1", ...] for both accesses of every race."""
    marks: Dict[int, List[str]] = {}
    for n, race in enumerate(races, 1):
        label = f"{race.kind} #{n}"
        for acc in (race.first, race.second):
            if 0 <= acc.index < len(trace.log):
                marks.setdefault(acc.index, [])
                if label not in marks[acc.index]:
                    marks[acc.index].append(label)
    return marks


def host_records(trace: Trace) -> List[HostRecord]:
    return [r for r in trace.log if isinstance(r, (SyncRecord, HostAccess, QueryRecord))]


def stream_ids(trace: Trace) -> List[int]:
    sids = set(trace.stream_names)
    sids.update(r.stream for r in trace.log if isinstance(r, OpRecord))
    return sorted(sids)


def op_at(trace: Trace) -> Dict[Tuple[int, int], OpRecord]:
    """(stream, seq) -> op."""
    return {(r.stream, r.seq): r for r in trace.log if isinstance(r, OpRecord)}


def host_label(rec: Record, trace: Trace) -> str:
    if isinstance(rec, SyncRecord):
        return f"sync: {rec.label}"
    if isinstance(rec, QueryRecord):
        return f"query: {rec.label}"
    if isinstance(rec, HostAccess):
        return f"host {access_label(rec.write)} {rec.name}"
    return type(rec).__name__
