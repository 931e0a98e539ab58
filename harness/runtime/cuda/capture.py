"""The CUDA capture's bookkeeping: stream ids, per-stream seq counters, storage ids,
event positions -- shared by the dispatch mode (``dispatch.py``) and the stream/event API
wrappers (``api.py``), writing the trace format the simulator writes (``trace.py``).

Storages get ids from ``hostmem.new_sid()``; the capture holds no storage, so the caching
allocator frees and reuses blocks as it would untraced. Every op output that is fresh
memory (not an input's storage) is an allocation: a new storage id, an ``AllocRecord`` --
and when its data pointer is where an earlier storage began, a *reuse* of that block: the
capture infers the old storage's ``FreeRecord`` there (a free is not visible to a dispatch
mode; the allocator's deallocation callback and storage weak references both crashed
multi-trial runs on the H200). Its ``waits``, for each stream the old storage was
``record_stream``-ed on, are the position that stream had reached at the storage's last
recorded use -- no later than the real free, so the detector never credits
``record_stream`` with more than PyTorch waited for.

The capture of the open traced runtime is the current run's (``seams.context``).
"""
from __future__ import annotations

import contextlib
import threading
import itertools
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import torch

from seams.context import current
from harness.runtime import hostmem
from harness.runtime.graphs import GraphCapture
from harness.runtime.trace import (Access, AllocRecord, FreeRecord, HostAccess, OpKind, OpRecord,
                     Position, RecordStreamRecord, SyncRecord, Trace, tensor_range)
from seams.vocab import shaped_name

_CAPTURE_TOKENS = itertools.count(1)
EVENT_STATE = "_specrace_event"  # attribute on an event: (capture token, eid, position)
# What the logged API hands in: a ``torch.cuda`` stream/event, or the generic ``torch`` one.
AnyStream = Union[torch.cuda.Stream, torch.Stream]
AnyEvent = Union[torch.cuda.Event, torch.Event]


def _describe(t: torch.Tensor) -> str:
    return f"{t.device.type} {shaped_name(t.dtype, t.shape)}"


class Capture:
    """Bookkeeping shared by the dispatch mode and the stream/event wrappers.

    ``current_handle()`` returns the raw handle of the current stream; ``dev_type`` is the
    device type whose tensors are device memory ("cuda"; tests use "cpu").
    """

    def __init__(self, trace: Trace, current_handle: Callable[[], int],
                 default_handle: int = 0, dev_type: str = "cuda") -> None:
        self.trace = trace
        self.current_handle = current_handle
        self.dev_type = dev_type
        self.ids: Dict[int, int] = {}
        self.seqs: List[int] = []
        self.ptr_sid: Dict[int, int] = {}  # data_ptr -> sid of the storage that began there
        self.blocks: Dict[int, int] = {}  # data_ptr -> a small block number, for reports
        self.home: Dict[int, int] = {}  # sid -> the stream it was allocated on
        # sid -> {stream: seq it had reached at the storage's last use}, for the storages
        # that were record_stream-ed on those streams
        self.recorded: Dict[int, Dict[int, int]] = {}
        # > 0 inside a wrapped stream/event call (inner calls pass through) or while a
        # nested runtime is open (this capture is paused)
        self.depth = 0
        # the thread the run is: the program under test. Another thread's stream and event
        # calls (a background load's) are not the program's, and are not logged.
        self.thread = threading.get_ident()
        self.token = next(_CAPTURE_TOKENS)  # tells this run's event state from a stale one
        self._slotted_events: Dict[int, Tuple[Any, int, Position]] = {}
        self.graph: Optional[GraphCapture] = None  # the CUDA graph capture under way
        self.graph_ids = itertools.count(1)
        self._eids = itertools.count(1)
        self.stream_id(default_handle, "default")

    # --- streams ---------------------------------------------------------------------
    def stream_id(self, handle: int, name: Optional[str] = None) -> int:
        sid = self.ids.get(handle)
        if sid is None:
            sid = self.ids[handle] = len(self.seqs)
            self.seqs.append(0)
        if name is not None:
            self.trace.stream_names[sid] = name
        return sid

    def cur(self) -> int:
        return self.stream_id(self.current_handle())

    def stream_of(self, stream: Optional[AnyStream]) -> int:
        """Stream id of a stream object (None: the current stream)."""
        if stream is None:
            return self.cur()
        return self.stream_id(handle_of(stream))

    def position(self, sid: int) -> Position:
        return (sid, self.seqs[sid])

    # --- records ---------------------------------------------------------------------
    def op(self, sid: int, name: str, reads: List[Access], writes: List[Access],
           frame, kind: str = OpKind.KERNEL, wait_for: Optional[Position] = None,
           duration: float = 1.0) -> OpRecord:
        return self.log_op(OpRecord(sid, name, reads, writes, frame, kind=kind,
                                    wait_for=wait_for, duration=duration))

    def log_op(self, rec: OpRecord) -> OpRecord:
        graph = self.graph
        if graph is not None and graph.takes(rec.stream):
            # Captured into a CUDA graph: nothing runs now; each replay logs it again.
            return graph.record(rec)
        self.seqs[rec.stream] += 1
        rec.seq = self.seqs[rec.stream]
        self.trace.add(rec)
        if self.recorded:
            for accesses in (rec.reads, rec.writes):
                for acc in accesses:
                    used = self.recorded.get(acc[0])
                    if used is not None:
                        for s in used:
                            used[s] = self.seqs[s]
        return rec

    def sync(self, waits: List[Position], label: str, frame) -> None:
        self.trace.add(SyncRecord(label, list(waits), frame))

    def sync_current(self, label: str, frame) -> None:
        self.sync([self.position(self.cur())], label, frame)

    def note_host_access(self, access: Access, write: bool, name: str, frame) -> None:
        self.trace.add(HostAccess(access, write, name, frame))
        self.trace.storage_names.setdefault(access[0], name)

    # --- storages --------------------------------------------------------------------
    def storage_id(self, t: torch.Tensor) -> Tuple[int, int]:
        """(sid, data_ptr) of a live storage ``t`` uses (first sight: a new sid)."""
        ptr = t.untyped_storage().data_ptr()
        sid = self.ptr_sid.get(ptr)
        if sid is None:
            sid = self.ptr_sid[ptr] = hostmem.new_sid()
            self.trace.storage_names.setdefault(sid, _describe(t))
        return sid, ptr

    def allocated(self, t: torch.Tensor, frame) -> Tuple[int, int]:
        """``t``'s storage was just allocated (fresh memory from an op or a factory)."""
        st = t.untyped_storage()
        ptr, nbytes = st.data_ptr(), st.nbytes()
        if nbytes == 0:  # no block (PyTorch's nullptr), nothing to reuse
            return self.storage_id(t)
        prev = self.ptr_sid.get(ptr)
        sid = self.ptr_sid[ptr] = hostmem.new_sid()
        self.trace.storage_names.setdefault(sid, _describe(t))
        block = self.blocks.get(ptr)
        if block is None:
            block = self.blocks[ptr] = len(self.blocks) + 1
        stream = self.cur()
        if prev is not None:  # the block came back: the old storage was freed before now
            home = self.home.pop(prev, None)
            used = self.recorded.pop(prev, None) or {}
            waits = [(s, n) for s, n in sorted(used.items()) if s != home and n > 0]
            self.trace.add(FreeRecord(block, prev, home, waits, None))
        self.home[sid] = stream
        self.trace.add(AllocRecord(block, sid, stream, nbytes, frame, prev))
        return sid, ptr

    def access(self, t: torch.Tensor) -> Tuple[Access, int]:
        sid, ptr = self.storage_id(t)
        lo, hi = tensor_range(t)
        return (sid, lo, hi), ptr

    def sid_access(self, t: torch.Tensor) -> Access:
        """``access`` without the pointer (the kernel rung's per-argument call)."""
        ptr = t.untyped_storage().data_ptr()
        sid = self.ptr_sid.get(ptr)
        if sid is None:
            sid = self.storage_id(t)[0]
        lo, hi = tensor_range(t)
        return (sid, lo, hi)

    def fresh_access(self, t: torch.Tensor, frame) -> Access:
        """The access of an op writing its freshly allocated output ``t``."""
        sid, _ = self.allocated(t, frame)
        lo, hi = tensor_range(t)
        return (sid, lo, hi)

    def record_stream(self, t: torch.Tensor, stream: Optional[AnyStream], frame) -> None:
        sid, _ = self.storage_id(t)
        s = self.stream_of(stream)
        self.trace.add(RecordStreamRecord(sid, s, frame))
        self.recorded.setdefault(sid, {})[s] = self.seqs[s]

    def pinned_access(self, t: Any) -> Optional[Access]:
        if not isinstance(t, torch.Tensor):
            return None
        acc = hostmem.access_of(t)
        if acc is None:
            return None
        self.trace.storage_names.setdefault(acc[0][0], acc[1])
        return acc[0]

    # --- events ----------------------------------------------------------------------
    def event_recorded(self, event: AnyEvent, pos: Position) -> int:
        """Remember where ``event`` was last recorded. The state lives on the event object
        itself (no weak references), tagged with this capture's token, so an event kept
        from an earlier run is not mistaken for one of this run."""
        old = self.event_state(event)
        eid = old[0] if old is not None else next(self._eids)
        try:
            setattr(event, EVENT_STATE, (self.token, eid, pos))
        except AttributeError:  # no __dict__: keep it (and its id) alive for the run
            self._slotted_events[id(event)] = (event, eid, pos)
        return eid

    def event_state(self, event: AnyEvent) -> Optional[Tuple[int, Position]]:
        st = getattr(event, EVENT_STATE, None)
        if st is not None:
            return (st[1], st[2]) if st[0] == self.token else None
        slotted = self._slotted_events.get(id(event))
        if slotted is not None and slotted[0] is event:
            return slotted[1], slotted[2]
        return None

    def new_eid(self) -> int:
        return next(self._eids)


def handle_of(stream: AnyStream) -> int:
    handle = getattr(stream, "cuda_stream", None)
    if handle is not None:
        return int(handle)
    # a generic torch.Stream: rebuild the torch.cuda.Stream view of it
    s = torch.cuda.Stream(stream_id=stream.stream_id, device_index=stream.device_index,
                          device_type=stream.device_type)
    return int(s.cuda_stream)


def active() -> Optional[Capture]:
    """The capture the API wrappers log into: the current run's, unless paused."""
    cap = current().cuda_capture
    if cap is None or cap.depth or cap.thread != threading.get_ident():
        return None
    return cap


@contextlib.contextmanager
def passthrough() -> Iterator[None]:
    """Inside: the stream/event wrappers log nothing (calibration, harness internals)."""
    cap = current().cuda_capture
    if cap is None:
        yield
        return
    cap.depth += 1
    try:
        yield
    finally:
        cap.depth -= 1
