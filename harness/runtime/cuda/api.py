"""The stream / event / graph API wrappers of a traced CUDA run, generated from one table.

``torch.cuda.Event.record/wait/query/synchronize``, ``torch.cuda.Stream.wait_event/
wait_stream/query/synchronize``, ``torch.cuda.synchronize`` and
``torch.cuda.CUDAGraph.capture_begin/capture_end/replay/reset`` are wrapped to log
``EventRecord`` / wait markers / ``SyncRecord`` / ``QueryRecord`` (a ``query()`` that
returned True is a sync, which CSAN misses). Waits are stream ops: they advance the
stream's seq. While a graph is captured, the ops on the streams taking part are recorded
into the graph (``Capture.log_op``); every ``replay()`` logs them again, in order, on the
replaying stream, so the detector sees what a replay reads and writes -- CSAN does not.

Installed once per class and never removed: each wrapper calls the real API (with logging
paused, so its inner calls pass through), then -- if a capture is active
(``capture.active()``) -- the row's logger. Swapping class attributes in and out around
every traced run, and keying event state on weak references, segfaulted CPython at the
end of the second traced trial on the H200 (``reports/gpu/second-capture-crash-bisect.txt``):
per-run state lives on the capture and, tagged with its token, on the event/graph objects.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Optional, Union

from harness.runtime.graphs import CaptureToken, GraphCapture, replay_ops
from harness.runtime.trace import (WAIT_EVENT, EventRecord, OpKind, Position, QueryRecord,
                     user_frame)
from harness.runtime.cuda.capture import AnyEvent, Capture, active

GRAPH_STATE = "_specrace_graph"  # attribute on a graph: [capture token, gid, ops, replays]


def _wait(cap: Capture, sid: int, pos: Union[Position, CaptureToken, None], frame) -> None:
    if isinstance(pos, CaptureToken):  # recorded inside a CUDA graph capture
        if pos.capture is cap.graph:
            cap.graph.wait(sid, pos)  # a fork or a join inside the graph: no stream op
        return
    # CUDA: waiting on a never-recorded event (or one recorded on an empty stream) is a
    # no-op; the simulator logs nothing there either.
    if pos is None or pos[1] == 0:
        return
    cap.op(sid, WAIT_EVENT, [], [], frame, kind=OpKind.WAIT, wait_for=pos, duration=0.0)


def _at(cap: Capture, event: AnyEvent) -> Optional[Position]:
    """Where ``event`` was recorded in this run; None if never, or inside a graph capture
    (CUDA refuses a host wait on that: nothing to log)."""
    st = cap.event_state(event)
    return None if st is None or isinstance(st[1], CaptureToken) else st[1]


def _waited(cap: Capture, event: AnyEvent) -> Union[Position, CaptureToken, None]:
    st = cap.event_state(event)
    return st[1] if st else None


# --- the loggers: (capture, the call's result, frame, the call's arguments) -----------------

def _ev_record(cap, res, frame, ev, stream=None, *_a, **_k):
    sid = cap.stream_of(stream)
    if cap.graph is not None and cap.graph.takes(sid):
        cap.event_recorded(ev, cap.graph.event(sid))  # a point inside the graph
        return
    pos = cap.position(sid)
    cap.trace.add(EventRecord(cap.event_recorded(ev, pos), pos, frame))


def _ev_query(cap, res, frame, ev, *_a, **_k):
    pos = _at(cap, ev) if res else None
    if pos is not None:  # a query() that returned True is a sync (CSAN misses it)
        cap.trace.add(QueryRecord("event.query", pos, frame))


def _ev_synchronize(cap, res, frame, ev, *_a, **_k):
    pos = _at(cap, ev)
    if pos is not None:
        cap.sync([pos], "event.synchronize", frame)


def _st_wait_stream(cap, res, frame, me_stream, other_stream, *_a, **_k):
    me, other = cap.stream_of(me_stream), cap.stream_of(other_stream)
    if me != other and cap.graph is not None and cap.graph.takes(other):
        cap.graph.wait(me, cap.graph.event(other))  # a fork or a join inside the graph
    elif me != other:  # as the simulator: an internal event recorded, then one wait
        pos = cap.position(other)
        cap.trace.add(EventRecord(cap.new_eid(), pos, frame))
        _wait(cap, me, pos, frame)


def _st_query(cap, res, frame, stream, *_a, **_k):
    if res:
        cap.trace.add(QueryRecord("stream.query", cap.position(cap.stream_of(stream)), frame))


def _g_capture_end(cap, graph_obj, graph):
    if graph is not None:
        setattr(graph_obj, GRAPH_STATE, [cap.token, next(cap.graph_ids), graph.ops, 0])


def _g_replay(cap, res, frame, graph_obj, *_a, **_k):
    st = getattr(graph_obj, GRAPH_STATE, None)
    if st is not None and st[0] == cap.token:  # captured in this run: its accesses are known
        st[3] += 1
        for op in replay_ops(st[2], cap.cur(), st[1], st[3], frame):
            cap.log_op(op)


def _g_reset(cap, res, frame, graph_obj, *_a, **_k):
    if getattr(graph_obj, GRAPH_STATE, None) is not None:
        setattr(graph_obj, GRAPH_STATE, None)


def _g_begin(cap, res, frame, graph_obj, *_a, **_k):
    cap.graph = GraphCapture(cap.cur())  # CUDA itself enforces the capture rules


# The one table: (owner, attribute, logger run after the real call). Owners: "event" is
# torch.cuda.Event, "stream" torch.cuda.Stream, "module" torch.cuda, "graph" CUDAGraph.
API = (
    ("event", "record", _ev_record),
    ("event", "wait", lambda cap, res, frame, ev, stream=None, *a, **k:
        _wait(cap, cap.stream_of(stream), _waited(cap, ev), frame)),
    ("event", "query", _ev_query),
    ("event", "synchronize", _ev_synchronize),
    ("stream", "wait_event", lambda cap, res, frame, stream, ev, *a, **k:
        _wait(cap, cap.stream_of(stream), _waited(cap, ev), frame)),
    ("stream", "wait_stream", _st_wait_stream),
    ("stream", "query", _st_query),
    ("stream", "synchronize", lambda cap, res, frame, stream, *a, **k:
        cap.sync([cap.position(cap.stream_of(stream))], "stream.synchronize", frame)),
    ("module", "synchronize", lambda cap, res, frame, *a, **k:
        cap.sync([cap.position(s) for s in range(len(cap.seqs))], "device.synchronize",
                 frame)),
    ("graph", "capture_begin", _g_begin),
    ("graph", "capture_end", None),  # special: the capture ends before the real call
    ("graph", "replay", _g_replay),
    ("graph", "reset", _g_reset),
)


def _wrapper(orig: Callable[..., Any], log: Optional[Callable[..., Any]],
             name: str) -> Callable[..., Any]:
    def wrapped(*a, **k):
        cap = active()
        if cap is None:
            return orig(*a, **k)
        graph = None
        if log is None:  # capture_end: the graph stops taking ops even if the call raises
            graph, cap.graph = cap.graph, None
        cap.depth += 1  # the real call's inner calls pass through
        try:
            res = orig(*a, **k)
        finally:
            cap.depth -= 1
        if log is None:
            _g_capture_end(cap, a[0], graph)
        else:
            log(cap, res, user_frame(2), *a, **k)
        return res

    wrapped.__name__ = name
    wrapped.__qualname__ = getattr(orig, "__qualname__", name)
    wrapped.__doc__ = getattr(orig, "__doc__", None)
    wrapped.__wrapped__ = orig
    wrapped._specrace_wrapper = True
    return wrapped


def ensure_api_wrapped(stream_cls: type, event_cls: type, module: ModuleType,
                       graph_cls: Optional[type] = None) -> None:
    """Wrap the stream/event API of ``stream_cls`` / ``event_cls`` / ``module``, and the
    capture/replay API of ``graph_cls`` (``torch.cuda.CUDAGraph``), once."""
    owners = {"event": event_cls, "stream": stream_cls, "module": module, "graph": graph_cls}
    for key, name, log in API:
        owner = owners[key]
        if owner is None:
            continue
        current = getattr(owner, name)
        if not getattr(current, "_specrace_wrapper", False):
            setattr(owner, name, _wrapper(current, log, name))
    from seams import process
    process.note("cuda-api-wrapped")
