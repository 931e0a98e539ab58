"""CUDA graphs in the trace, for both backends: what a capture records, what a replay issues.

While a capture is under way, the ops issued on the streams taking part in it are recorded
into the graph instead of being executed (simulator) or logged as executed (CUDA trace).
The streams taking part are the *origin* (current when the capture began) and every stream
that joined by waiting on an event recorded inside the capture -- CUDA's fork/join rule.
Ops on any other stream are ordinary work, not part of the graph. At the end every joined
stream must have been joined back to the origin (CUDA: ``cudaErrorStreamCaptureUnjoined``).

A replay issues the recorded ops again, in capture order, on the replaying stream, each a
``ReplayedOp`` that carries the capture site (its frame) and the replay site: to the
detector a replay is exactly the reads and writes of its kernels, ordered on that stream.

Not modelled: a graph's internal parallelism (forked branches are replayed in capture
order, so a race between two branches of one graph is not reported), conditional and
external-event nodes, and sharing a memory pool between graphs (the simulator never
reuses memory, and the CUDA trace holds every storage it saw).
"""
from __future__ import annotations

from typing import Dict, Iterator, List, NamedTuple, Optional

from harness.runtime.trace import Frame, OpRecord, Replay, ReplayedOp


class CaptureToken(NamedTuple):
    """An event recorded inside a capture: which stream, and how much of every captured
    stream is ordered before that point (a vector clock over the capture's streams)."""
    capture: "GraphCapture"
    stream: int
    known: Dict[int, int]


class GraphCapture:
    """One capture under way: its streams, the ops recorded so far, the join state."""

    def __init__(self, origin: int, mode: str = "global") -> None:
        if mode not in ("global", "thread_local", "relaxed"):
            raise ValueError(f"capture_error_mode must be global, thread_local or relaxed, "
                             f"got {mode!r}")
        self.origin = origin
        self.mode = mode
        self.ops: List[OpRecord] = []
        self.count: Dict[int, int] = {origin: 0}  # ops recorded per taking-part stream
        self.known: Dict[int, Dict[int, int]] = {origin: {}}
        self.invalid: Optional[str] = None  # what invalidated the capture, if anything

    def takes(self, sid: int) -> bool:
        """Is ``sid`` taking part in the capture (its ops are recorded, not run)?"""
        return sid in self.count

    def record(self, op: OpRecord) -> OpRecord:
        self.ops.append(op)
        self.count[op.stream] += 1
        return op

    def event(self, sid: int) -> CaptureToken:
        """An event recorded on ``sid`` (taking part) now."""
        known = dict(self.known[sid])
        known[sid] = self.count[sid]
        return CaptureToken(self, sid, known)

    def wait(self, sid: int, token: CaptureToken) -> None:
        """``sid`` waits on an event recorded inside this capture: a stream not yet taking
        part joins it (fork); the origin waiting on a forked stream joins that one back."""
        if sid not in self.count:
            self.count[sid] = 0
            self.known[sid] = {}
        mine = self.known[sid]
        for s, n in token.known.items():
            if mine.get(s, -1) < n:
                mine[s] = n

    def unjoined(self) -> List[int]:
        """Streams that joined but whose last recorded op is not ordered before the
        origin's end (CUDA refuses to end such a capture)."""
        seen = self.known[self.origin]
        return [s for s, n in self.count.items() if s != self.origin and seen.get(s, -1) < n]

    def invalidate(self, why: str) -> None:
        if self.invalid is None:
            self.invalid = why


def replayed(template: OpRecord, stream: int, replay: Replay) -> ReplayedOp:
    """The op a replay issues for one recorded op: same kernel, same accesses, same
    capture-site frame, on ``stream``."""
    return ReplayedOp(stream, template.name, template.reads, template.writes, template.frame,
                      kind=template.kind, duration=template.duration, fn=template.fn,
                      replay=replay)


def replay_ops(ops: List[OpRecord], stream: int, graph: int, n: int,
               frame: Optional[Frame]) -> Iterator[ReplayedOp]:
    info = Replay(graph, n, frame)
    for template in ops:
        yield replayed(template, stream, info)
