"""The simulated device's streams and events, as ``torch.sim.Stream()`` and
``torch.sim.Event()`` hand them out (the semantics: ``device.py``).

Each belongs to the session it was made in; a stream holds its device weakly (the
device holds its streams: a cycle would outlive the session).
"""
from __future__ import annotations

import collections
import weakref
from typing import TYPE_CHECKING, Any, Deque, List, Optional

import torch

from seams.context import current
from harness.runtime.trace import WAIT_EVENT, EventRecord, OpKind, OpRecord, Position, user_frame
from harness.runtime.sim.errors import check_session

if TYPE_CHECKING:
    from harness.runtime.graphs import CaptureToken

# ``SimDevice`` below is ``device.SimDevice`` (not imported: the device imports this module)
SimDevice = Any


class Stream:
    """A simulated stream. Construct through the device module: ``torch.sim.Stream()``."""

    def __init__(self, device: Any = None, priority: int = 0, *,
                 _sim: Optional[SimDevice] = None) -> None:
        dev = _sim or current_device()
        # weak: the device holds its streams (why no cycle may hold a session:
        # ``sim._gc_frozen``)
        self._devref = weakref.ref(dev)
        self.sid = len(dev.streams)
        dev.streams.append(self)
        self.priority = priority
        self.pending: Deque[OpRecord] = collections.deque()
        self.enq = 0  # ops enqueued so far
        self.done = 0  # ops executed so far
        self.clock = 0.0  # virtual time the last executed op ended
        self.ends: List[float] = [0.0]  # end time of op n at index n

    @property
    def _dev(self) -> Optional[SimDevice]:
        """The session's device (None once nothing else holds it)."""
        return self._devref()

    # --- CUDA's Stream API -------------------------------------------------------------
    def _mine(self, what: str) -> SimDevice:
        dev = self._dev
        check_session(current_device(), dev, f"{what}: {self!r}")
        return dev

    def wait_event(self, event: "Event") -> None:
        event.wait(self)

    def wait_stream(self, stream: "Stream") -> None:
        if stream is self:
            return
        self.wait_event(stream.record_event())

    def record_event(self, event: Optional["Event"] = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return self._mine("stream.query").poll((self.sid, self.enq), "stream.query")

    def synchronize(self) -> None:
        self._mine("stream.synchronize").host_sync([(self.sid, self.enq)],
                                                   "stream.synchronize")

    @property
    def cuda_stream(self) -> int:  # some code keys dictionaries on this
        return self.sid

    @property
    def device(self) -> torch.device:
        return torch.device("sim", 0)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.sid == self.sid

    def __hash__(self) -> int:
        return hash(("sim-stream", self.sid))

    def __repr__(self) -> str:
        dev = self._dev
        return f"<sim stream {dev.trace.stream_name(self.sid) if dev else self.sid}>"


class Event:
    """A simulated event: ``record`` captures the stream position, waits are positional.

    It belongs to the session it was made in (or, made outside one, first used in), which
    numbers it: ids do not depend on what ran earlier in the process."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        self._dev = current().sim_device
        self.eid = self._dev.new_eid() if self._dev is not None else 0
        self.position: Optional[Position] = None
        self.token: Optional[CaptureToken] = None  # recorded inside a graph capture (sim/graphs.py)
        self.time = 0.0

    def _mine(self, what: str) -> SimDevice:
        dev = current_device()
        if self._dev is None:
            self._dev, self.eid = dev, dev.new_eid()
        check_session(dev, self._dev, f"{what}: {self!r}")
        return dev

    def record(self, stream: Optional[Stream] = None) -> None:
        dev = self._mine("event.record")
        stream = stream or dev.current
        stream._mine("event.record")
        self.token = None
        if dev.capture is not None and dev.capture.record_event(self, stream.sid):
            return
        self.position = (stream.sid, stream.enq)
        dev.trace.add(EventRecord(self.eid, self.position, user_frame(2), dev.host_clock))

    def wait(self, stream: Optional[Stream] = None) -> None:
        dev = self._mine("event.wait")
        stream = stream or dev.current
        stream._mine("event.wait")
        if dev.capture is not None and dev.capture.wait_event(self, stream.sid):
            return
        if self.position is None or self.position[1] == 0:
            return  # CUDA: waiting on a never-recorded (or empty-stream) event is a no-op
        dev.enqueue(OpRecord(stream.sid, WAIT_EVENT, [], [], user_frame(2),
                             kind=OpKind.WAIT, wait_for=self.position, duration=0.0))

    def query(self) -> bool:
        dev = self._mine("event.query")
        if dev.capture is not None:
            dev.capture.refuse("event.query", [self.position] if self.position else [], self)
        if self.position is None:
            return True
        return dev.poll(self.position, "event.query")

    def synchronize(self) -> None:
        dev = self._mine("event.synchronize")
        if dev.capture is not None:
            dev.capture.refuse("event.synchronize", [self.position] if self.position else [],
                               self)
        if self.position is not None:
            dev.host_sync([self.position], "event.synchronize")

    def elapsed_time(self, end: "Event") -> float:
        dev = self._mine("event.elapsed_time")
        end._mine("event.elapsed_time")
        t0 = dev.position_end(self.position)
        t1 = dev.position_end(end.position)
        return (t1 - t0) / 1000.0

    def __repr__(self) -> str:
        return f"<sim event {self.eid} at {self.position}>"


def current_device() -> SimDevice:
    """The simulated device of the open session (the current run's, ``seams.context``)."""
    dev = current().sim_device
    if dev is None:
        raise RuntimeError("the sim device is not set up: use harness.runtime.sim.session()")
    return dev
