"""CUDA graphs on the simulator: ``torch.sim.CUDAGraph``, ``torch.sim.graph`` and friends.

The device-module API is ``torch.cuda``'s, so server code captures and replays on both
backends unchanged:

* ``graph(g, pool=None, stream=None)`` synchronizes the device, makes ``stream`` (default:
  the device's own side stream) current and captures into ``g`` until the block ends;
* while capturing, ops issued on the streams taking part (``harness.runtime.graphs``) are
  *recorded, not run*: a captured op's outputs are allocated at capture time -- the static
  tensors, poison until a replay writes them -- and its kernel is kept for later;
* ``g.replay()`` issues every recorded op, in order, on the current stream, against the
  same (static) tensors. A stall captured inside the graph (a fault point hit during the
  capture) is one of those ops, so it stalls every replay;
* CUDA's capture rules: no host syncs inside a capture -- ``.item()``, ``.cpu()``,
  ``.tolist()``, blocking copies, data-dependent shapes (``nonzero``, boolean masks),
  ``synchronize()``, ``query()`` -- each is a ``RuntimeError`` naming the operation, and
  invalidates the capture; no capture on the default stream; a capturing stream may not
  wait on an event recorded outside the capture; forked streams must be joined back.

Memory: what a capture allocates comes from the graph's private pool, which ordinary
allocations never get (``allocator.py``); pool handles are accepted and handed back
(``pool()``, ``graph_pool_handle()``), but several graphs sharing one pool -- and reuse
inside a pool -- are not modelled.
"""
from __future__ import annotations

import itertools
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from harness.runtime.graphs import GraphCapture, replay_ops
from harness.runtime.policy import Chooser
from harness.runtime.trace import Position, short_path, user_frame
from harness.runtime.sim.device import SimDevice
from harness.runtime.sim.streams import Event, Stream, current_device

__all__ = ["CUDAGraph", "graph", "graph_pool_handle", "is_current_stream_capturing"]

_POOLS = itertools.count(1)

CAPTURE_SYNC = "cudaErrorStreamCaptureUnsupported"


def graph_pool_handle() -> Tuple[int, int]:
    """An opaque memory-pool token, as ``torch.cuda.graph_pool_handle()`` returns."""
    return (0, next(_POOLS))


def is_current_stream_capturing() -> bool:
    dev = current_device()
    return dev.capture is not None and dev.capture.takes(dev.current.sid)


def _site() -> str:
    frame = user_frame(3)
    return f" at {short_path(frame[0])}:{frame[1]}" if frame else ""


class _CaptureChooser(Chooser):
    """The device's chooser while a capture is under way: ops on streams taking part must
    take the queued path (they are recorded, not run), so the idle-stream fast path is off
    for them; every choice is still the real chooser's. Swapping the chooser keeps the
    per-op fast path free of any capture check."""

    def __init__(self, inner: Chooser, capture: "SimCapture") -> None:
        self.inner = inner
        self.capture = capture

    def choose(self, runnable: Sequence[int], last: Optional[int],
               names: Mapping[int, str]) -> int:
        return self.inner.choose(runnable, last, names)

    def runs_idle(self, stream: int, names: Mapping[int, str]) -> bool:
        return not self.capture.takes(stream) and self.inner.runs_idle(stream, names)


class SimCapture(GraphCapture):
    """A capture on the simulated device, with the device hooks ``device.py`` calls."""

    def __init__(self, dev: SimDevice, origin: int, mode: str) -> None:
        super().__init__(origin, mode)
        self.dev = dev
        self.scheduler = dev.policy
        self.inner = self.scheduler.chooser
        dev.capture = self
        dev.captured = True
        self.scheduler.chooser = _CaptureChooser(self.inner, self)

    def finish(self) -> None:
        """End the capture on the device (idempotent): its streams run ordinary work again."""
        if self.dev.capture is self:
            self.dev.capture = None
            self.scheduler.chooser = self.inner

    # --- device hooks ---------------------------------------------------------------
    def refuse(self, what: str, waits: List[Position], event: Optional[Event] = None) -> None:
        """A host sync or query during the capture. CUDA refuses it (in ``relaxed`` mode
        only when it involves the capture) and the capture is invalidated."""
        involved = any(self.takes(sid) for sid, _ in waits) or self.owns(event)
        if self.mode == "relaxed" and not involved:
            return
        msg = (f"operation not permitted when stream is capturing: {what}{_site()} -- a host "
               f"sync inside a CUDA graph capture ({CAPTURE_SYNC}); the capture is invalidated")
        self.invalidate(msg)
        raise RuntimeError(msg)

    def owns(self, event: Optional[Event]) -> bool:
        token = getattr(event, "token", None)
        return token is not None and token.capture is self

    def record_event(self, event: Event, sid: int) -> bool:
        """``event.record()`` on ``sid``: inside the capture it marks a point of the graph
        (for forks and joins), not a stream position. True when handled here."""
        if not self.takes(sid):
            return False
        event.position = None
        event.token = self.event(sid)
        return True

    def wait_event(self, event: Event, sid: int) -> bool:
        """``sid`` waits on ``event``. True when handled here (no wait marker to queue)."""
        if self.owns(event):
            self.wait(sid, event.token)  # a fork or a join: ordering inside the graph
            return True
        if not self.takes(sid):
            return False  # ordinary work on a stream outside the capture
        if event.position is None or event.position[1] == 0:
            return True  # never recorded: a no-op, as outside a capture
        msg = (f"a capturing stream waited on an event recorded outside the capture"
               f"{_site()}: a dependency across the capture boundary "
               f"(CUDA: cudaErrorStreamCaptureIsolation); the capture is invalidated")
        self.invalidate(msg)
        raise RuntimeError(msg)


def _side_stream(dev: SimDevice) -> Stream:
    """``torch.cuda.graph``'s internal side stream (one per simulated device)."""
    if dev.graph_stream is None:
        dev.graph_stream = dev.new_stream(name="graph capture")
    return dev.graph_stream


class CUDAGraph:
    """``torch.cuda.CUDAGraph`` on the simulator."""

    def __init__(self, keep_graph: bool = False) -> None:
        self.gid = 0  # numbered by the device at each successful capture
        self._capture: Optional[SimCapture] = None
        self._ops: Optional[list] = None
        self._dev: Optional[SimDevice] = None
        self._pool: Optional[Tuple[int, int]] = None
        self._replays = 0

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global",
                      check_input_liveness: bool = False) -> None:
        dev = current_device()
        if dev.capture is not None:
            raise RuntimeError("a CUDA graph capture is already under way on this device; "
                               "captures happen one at a time")
        if self._ops is not None:
            raise RuntimeError("This CUDAGraph instance already owns a captured graph. To "
                               "capture a new graph, create a new instance (or reset() it).")
        stream = dev.current
        if stream is dev.default_stream:
            raise RuntimeError("CUDA graphs must be captured on a non-default stream. "
                               "(However, after capture, it's ok to replay them on the "
                               "default stream.)")
        self._capture = SimCapture(dev, stream.sid, capture_error_mode)
        self._pool = pool if pool is not None else graph_pool_handle()

    def capture_end(self) -> None:
        dev = current_device()
        cap = self._capture
        if cap is None or dev.capture is not cap:
            raise RuntimeError("capture_end() without a capture under way on this graph")
        if dev.current.sid != cap.origin:
            raise RuntimeError("Capture must end on the same stream it began on.")
        self._abort()
        if cap.invalid is not None:
            raise RuntimeError(f"operation failed due to a previous error during capture: "
                               f"{cap.invalid}")
        unjoined = cap.unjoined()
        if unjoined:
            names = ", ".join(dev.trace.stream_name(s) for s in unjoined)
            raise RuntimeError(f"capture_end(): stream(s) {names} joined the capture but were "
                               f"not joined back to the stream it began on "
                               f"(CUDA: cudaErrorStreamCaptureUnjoined)")
        self._ops = cap.ops
        self._dev = dev
        self.gid = next(dev.graph_ids)
        self._replays = 0

    def _abort(self) -> None:
        """End a capture under way without keeping anything (an exception in the block)."""
        cap, self._capture = self._capture, None
        if cap is not None:
            cap.finish()

    def replay(self) -> None:
        dev = current_device()
        if self._ops is None:
            raise RuntimeError("Called CUDAGraph::replay without a preceding successful "
                               "capture.")
        if self._dev is not dev:
            raise RuntimeError("this graph was captured on another simulated device (an "
                               "earlier session); capture it again")
        stream = dev.current
        if dev.capture is not None and dev.capture.takes(stream.sid):
            raise RuntimeError("replaying a CUDA graph into a capturing stream is not "
                               "supported (CUDA refuses to launch a graph there)")
        self._replays += 1
        for op in replay_ops(self._ops, stream.sid, self.gid, self._replays, user_frame(2)):
            dev.enqueue(op)

    def reset(self) -> None:
        self._abort()
        self._ops = None
        self._dev = None

    def pool(self) -> Optional[Tuple[int, int]]:
        return self._pool

    def instantiate(self) -> None:
        """Instantiation is implicit on the simulator."""

    def __repr__(self) -> str:
        state = "captured" if self._ops is not None else "empty"
        return f"<sim CUDA graph {self.gid} ({state}, {len(self._ops or ())} ops)>"


class graph:
    """``with torch.sim.graph(g, pool=None, stream=None):`` -- as ``torch.cuda.graph``:
    synchronize the device, make the capture stream current, capture into ``g``."""

    def __init__(self, cuda_graph: CUDAGraph, pool: Any = None, stream: Optional[Stream] = None,
                 capture_error_mode: str = "global", **_ignored: Any) -> None:
        self.cuda_graph = cuda_graph
        self.pool = pool
        self.capture_stream = stream
        self.capture_error_mode = capture_error_mode
        self._prev: Optional[Stream] = None

    def __enter__(self) -> None:
        dev = current_device()
        if dev.capture is not None:
            raise RuntimeError("a CUDA graph capture is already under way on this device; "
                               "captures happen one at a time")
        dev.synchronize_all()  # the capture starts from an idle device, as on CUDA
        stream = self.capture_stream if self.capture_stream is not None else _side_stream(dev)
        self._prev, dev.current = dev.current, stream
        try:
            self.cuda_graph.capture_begin(self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            dev.current = self._prev
            raise

    def __exit__(self, exc_type, exc, tb) -> None:
        dev = current_device()
        try:
            if exc_type is None:
                self.cuda_graph.capture_end()
        finally:
            # An exception inside the block (a refused sync, say) ends the capture with
            # nothing kept and propagates as itself.
            self.cuda_graph._abort()
            dev.current = self._prev
