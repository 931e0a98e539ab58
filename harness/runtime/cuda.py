"""The CUDA backend: torch.cuda itself, plus a calibrated stall and an op-trace capture.

``cuda_runtime(trace=True)`` yields a ``CudaRuntime``. ``impl/`` code runs on it unchanged
(``rt.device`` is a real ``cuda`` device, ``rt.module`` is ``torch.cuda``). The harness adds:

* **stall(ms)**: ``torch.cuda._sleep`` on the *current* stream, with cycles per millisecond
  calibrated once per process by event timing (after a warm-up: the first launch in a
  process is slow). A cycle count is not a duration, so every stall is capped.
* **watchdog(seconds)**: a GPU hang must not hang CI forever; past the limit the process
  dumps every thread's stack and exits with status 3.
* **the trace** (``trace=True``), in the format the simulator writes (``trace.py``), so the
  happens-before detector runs on it unchanged:

  - a ``TorchDispatchMode`` records every aten op that touches CUDA tensors as an
    ``OpRecord`` on the current stream, with reads/writes from the op schema
    (``schema.effects``, as the simulator and CSAN do: in-place arguments are read and
    written, fresh outputs are written, views and allocations are metadata only);
  - storages get ids from ``hostmem.new_sid()``; the capture holds no storage, so the
    caching allocator frees and reuses blocks as it would untraced. Every op output that
    is fresh memory (not an input's storage) is an allocation: a new storage id, an
    ``AllocRecord`` -- and when its data pointer is where an earlier storage began, a
    *reuse* of that block: the capture infers the old storage's ``FreeRecord`` there (a
    free is not visible to a dispatch mode; the allocator's deallocation callback and
    storage weak references both crashed multi-trial runs on the H200). Its ``waits``,
    for each stream the old storage was ``record_stream``-ed on, are the position that
    stream had reached at the storage's last recorded use -- no later than the real free,
    so the detector never credits ``record_stream`` with more than PyTorch waited for;
  - ``record_stream`` reaches the mode as ``aten.record_stream``: a
    ``RecordStreamRecord``;
  - host syncs (blocking D2H, ``.item()``, data-dependent output shapes such as
    ``nonzero`` / boolean masks) append a ``SyncRecord`` on the current stream after the op;
    a ``non_blocking`` D2H into pinned memory is an op writing the pinned buffer, which is
    registered in ``hostmem`` so later host reads (``tolist()``, ``.item()``, ...) show up
    as ``HostAccess`` records -- the reads CSAN cannot see;
  - ``torch.cuda.Event.record/wait/query/synchronize``, ``torch.cuda.Stream.wait_event/
    wait_stream/query/synchronize`` and ``torch.cuda.synchronize`` are wrapped (once per
    process; a wrapper logs only while a traced runtime is open) to log ``EventRecord`` /
    wait markers / ``SyncRecord`` / ``QueryRecord`` (a ``query()`` that returned True is a
    sync, which CSAN misses). Waits are stream ops: they advance the stream's seq;
  - CUDA graphs: ``torch.cuda.CUDAGraph.capture_begin/capture_end/replay/reset`` are wrapped
    the same way. While a graph is captured, the ops the dispatch mode sees on the streams
    taking part are recorded into the graph, not logged (nothing executes then); every
    ``replay()`` logs them again, in order, on the replaying stream (``ReplayedOp``, with
    the replay site), so the detector sees what a replay reads and writes -- CSAN does not.

``trace=False`` installs nothing (no mode, no wrappers): repro-rate measurements run at
full speed, with only the stall and the labels. Runtimes nest (a reference run inside a
trial): the outer capture pauses while an inner runtime is open.

Differences from the simulator worth knowing (both follow CUDA / PyTorch here):
blocking H2D copies (``x.to("cuda")``, ``torch.tensor(..., device="cuda")``) are
``memcpy_and_sync`` in PyTorch, so they sync the current stream (``BLOCKING_H2D_SYNCS``);
``*_like`` / ``new_*`` factories do not read their input's data; views of pinned memory are
metadata, not host reads.
"""
from __future__ import annotations

import contextlib
import faulthandler
import itertools
import os
import statistics
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import BackendError, Runtime, hostmem
from .graphs import CaptureToken, GraphCapture, replay_ops
from .limits import DEFAULT_STALL_MS, MAX_STALL_MS, cycles_per_ms_from_env
from .pinning import CudaPinning, cuda_is_pinned, needs_cuda_pinning
from .schema import arg_value, effects, iter_tensors
from .trace import (Access, AllocRecord, EventRecord, FreeRecord, HostAccess, OpRecord,
                    Position, QueryRecord, RecordStreamRecord, SyncRecord, Trace,
                    tensor_range, user_frame)

__all__ = [
    "CudaRuntime", "cuda_runtime", "calibrate", "cycles_per_ms_from_samples",
    "stall_cycles", "watchdog", "DEFAULT_STALL_MS", "MAX_STALL_MS", "WATCHDOG_EXIT",
]

aten = torch.ops.aten

# DEFAULT_STALL_MS (``stall(None)``) and MAX_STALL_MS (every stall is capped: cycles are
# not time -- clock drift, ROCm, TDR) come from ``limits``, shared with the simulator.
BLOCKING_H2D_SYNCS = True  # PyTorch's blocking H2D copy is memcpy_and_sync on the stream

# Calibration: warm the spin kernel up, then time these sizes with events.
_WARMUP_CYCLES = 100_000
_WARMUP_LAUNCHES = 3
_CALIBRATION_CYCLES = (1_000_000, 2_000_000)
_CALIBRATION_REPEATS = 3


# ---------------------------------------------------------------------------------------
# Stall calibration (pure parts first: they are tested without a GPU)

def cycles_per_ms_from_samples(samples: Iterable[Tuple[float, float]]) -> float:
    """Median cycles per millisecond over ``(cycles, measured_ms)`` samples.

    Samples with a non-positive count or time are ignored (a timer glitch must not give
    an infinite rate); with none left this raises ``ValueError``.
    """
    rates = [c / ms for c, ms in samples if c > 0 and ms > 0]
    if not rates:
        raise ValueError("no usable calibration samples (every measured time was <= 0)")
    return float(statistics.median(rates))


def stall_cycles(ms: Optional[float], cycles_per_ms: float) -> int:
    """Spin-kernel cycles for a stall of ``ms`` (None: ``DEFAULT_STALL_MS``), capped."""
    if ms is None:
        ms = DEFAULT_STALL_MS
    ms = min(max(float(ms), 0.0), MAX_STALL_MS)
    return max(0, int(round(cycles_per_ms * ms)))


def _clamp_ms(ms: Optional[float]) -> float:
    return min(max(float(DEFAULT_STALL_MS if ms is None else ms), 0.0), MAX_STALL_MS)


_CYCLES_PER_MS: Optional[float] = None
_CALIBRATION_LOCK = threading.Lock()


def calibrate(force: bool = False) -> float:
    """Cycles of ``torch.cuda._sleep`` per millisecond on this GPU (cached per process).

    ``SPECRACE_CYCLES_PER_MS`` in the environment skips the measurement; it must be a
    plausible GPU clock (``limits.CYCLES_PER_MS_RANGE``, else ``limits.LimitError``).
    """
    global _CYCLES_PER_MS
    with _CALIBRATION_LOCK:
        if _CYCLES_PER_MS is not None and not force:
            return _CYCLES_PER_MS
        value = cycles_per_ms_from_env()
        if value is not None and not force:
            _CYCLES_PER_MS = value
            return value
        with _passthrough():  # never log the calibration's own events into a trace
            _CYCLES_PER_MS = _measure_cycles_per_ms()
        return _CYCLES_PER_MS


def _measure_cycles_per_ms() -> float:
    torch.cuda.synchronize()
    for _ in range(_WARMUP_LAUNCHES):  # first launch in a process is slow (module loading)
        torch.cuda._sleep(_WARMUP_CYCLES)
    torch.cuda.synchronize()
    samples: List[Tuple[float, float]] = []
    first = True
    for _ in range(_CALIBRATION_REPEATS):
        for cycles in _CALIBRATION_CYCLES:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
            if first:  # the first timed pair warms the event path up too
                first = False
                continue
            samples.append((cycles, ms))
    return cycles_per_ms_from_samples(samples)


# ---------------------------------------------------------------------------------------
# Watchdog: one daemon thread, cheap to arm and disarm (a lock and a notify)

class _Watchdog:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: Dict[int, Tuple[float, float, str]] = {}
        self._ids = itertools.count(1)
        self._thread: Optional[threading.Thread] = None

    def arm(self, seconds: float, what: str) -> int:
        with self._cond:
            token = next(self._ids)
            self._armed[token] = (time.monotonic() + seconds, seconds, what)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="specrace-watchdog",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()
            return token

    def disarm(self, token: int) -> None:
        with self._cond:
            self._armed.pop(token, None)
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while True:
                if not self._armed:
                    self._cond.wait()
                    continue
                deadline, seconds, what = min(self._armed.values())
                now = time.monotonic()
                if now >= deadline:
                    _fire(seconds, what)
                self._cond.wait(deadline - now)


WATCHDOG_EXIT = 3  # the process's exit status when the watchdog fires


def _fire(seconds: float, what: str) -> None:
    msg = (f"\nspecrace watchdog: {what} exceeded {seconds:g} s -- a GPU hang or a stall "
           f"that never ends; dumping stacks and exiting with status {WATCHDOG_EXIT}\n")
    try:
        os.write(2, msg.encode())
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
    except Exception:
        pass
    os._exit(WATCHDOG_EXIT)


_WATCHDOG = _Watchdog()


@contextlib.contextmanager
def watchdog(seconds: Optional[float], what: str = "block") -> Iterator[None]:
    """Exit the process (status 3, stacks on stderr) if the block runs past ``seconds``.

    ``None`` or a non-positive limit disables it.
    """
    if seconds is None or seconds <= 0:
        yield
        return
    token = _WATCHDOG.arm(float(seconds), what)
    try:
        yield
    finally:
        _WATCHDOG.disarm(token)


# ---------------------------------------------------------------------------------------
# The capture: stream ids, per-stream seq counters, storage ids, event positions

_ACTIVE: Optional["_Capture"] = None  # the capture of the open traced runtime, if any
_CAPTURE_TOKENS = itertools.count(1)




def _describe(t: torch.Tensor) -> str:
    return f"{t.device.type} {str(t.dtype)[6:]}{list(t.shape)}"


class _Capture:
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

    def stream_of(self, stream: Any) -> int:
        """Stream id of a stream object (None: the current stream)."""
        if stream is None:
            return self.cur()
        return self.stream_id(_handle_of(stream))

    def position(self, sid: int) -> Position:
        return (sid, self.seqs[sid])

    # --- records ---------------------------------------------------------------------
    def op(self, sid: int, name: str, reads: List[Access], writes: List[Access],
           frame, kind: str = "kernel", wait_for: Optional[Position] = None,
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

    def fresh_access(self, t: torch.Tensor, frame) -> Access:
        """The access of an op writing its freshly allocated output ``t``."""
        sid, _ = self.allocated(t, frame)
        lo, hi = tensor_range(t)
        return (sid, lo, hi)

    def record_stream(self, t: torch.Tensor, stream: Any, frame) -> None:
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
    def event_recorded(self, event: Any, pos: Position) -> int:
        """Remember where ``event`` was last recorded. The state lives on the event object
        itself (no weak references), tagged with this capture's token, so an event kept
        from an earlier run is not mistaken for one of this run."""
        old = self.event_state(event)
        eid = old[0] if old is not None else next(self._eids)
        try:
            setattr(event, _EVENT_STATE, (self.token, eid, pos))
        except AttributeError:  # no __dict__: keep it (and its id) alive for the run
            self._slotted_events[id(event)] = (event, eid, pos)
        return eid

    def event_state(self, event: Any) -> Optional[Tuple[int, Position]]:
        st = getattr(event, _EVENT_STATE, None)
        if st is not None:
            return (st[1], st[2]) if st[0] == self.token else None
        slotted = self._slotted_events.get(id(event))
        if slotted is not None and slotted[0] is event:
            return slotted[1], slotted[2]
        return None

    def new_eid(self) -> int:
        return next(self._eids)


def _handle_of(stream: Any) -> int:
    handle = getattr(stream, "cuda_stream", None)
    if handle is not None:
        return int(handle)
    # a generic torch.Stream: rebuild the torch.cuda.Stream view of it
    s = torch.cuda.Stream(stream_id=stream.stream_id, device_index=stream.device_index,
                          device_type=stream.device_type)
    return int(s.cuda_stream)


@contextlib.contextmanager
def _passthrough() -> Iterator[None]:
    """Inside: the stream/event wrappers log nothing (calibration, harness internals)."""
    cap = _ACTIVE
    if cap is None:
        yield
        return
    cap.depth += 1
    try:
        yield
    finally:
        cap.depth -= 1


# ---------------------------------------------------------------------------------------
# The dispatch mode

def _ops(*names: str) -> set:
    out = set()
    for n in names:
        packet, _, overload = n.partition(".")
        op = getattr(getattr(aten, packet, None), overload or "default", None)
        if op is not None:
            out.add(op)
    return out


# Ops whose output shape depends on data: CUDA syncs the current stream to size them.
_SYNC_OPS = _ops("nonzero.default", "masked_select.default", "_unique2.default",
                 "unique_dim.default", "unique_consecutive.default", "_unique.default",
                 "equal.default", "is_nonzero.default", "bincount.default")
_BOOL_INDEX_OPS = _ops("index.Tensor", "index_put_.default", "index_put.default",
                       "_index_put_impl_.default")
_REPEAT_INTERLEAVE = _ops("repeat_interleave.Tensor")
# No kernel runs: allocation or metadata only (the storage gets an id when first used).
_NO_KERNEL = _ops("empty.memory_format", "empty_strided.default", "new_empty.default",
                  "new_empty_strided.default", "empty_like.default", "_unsafe_view.default",
                  "resize_.default", "resize_as_.default", "set_.source_Storage",
                  "set_.source_Storage_storage_offset", "set_.source_Tensor",
                  "set_.default", "detach_.default",
                  "lift_fresh.default", "is_pinned.default", "_has_same_storage_numel.default")
_COPY = aten.copy_.default


# Ops that return no tensor and mutate nothing are metadata queries (``is_same_size``...),
# except these, which read device data.
_READS_WITHOUT_TENSOR_RESULT = _ops("_assert_async.default", "_assert_async.msg")
_QUERY_CACHE: Dict[Any, bool] = {}


def _is_metadata_query(func, eff) -> bool:
    hit = _QUERY_CACHE.get(func)
    if hit is None:
        returns_tensor = any("Tensor" in str(r.type) for r in func._schema.returns)
        hit = _QUERY_CACHE[func] = (not returns_tensor and not eff.mutates
                                    and func not in _SYNC_OPS
                                    and func not in _READS_WITHOUT_TENSOR_RESULT)
    return hit


_META_READS: Dict[Any, bool] = {}


def _metadata_reads(func) -> bool:
    """``*_like`` / ``new_*`` factories use their input's metadata only (as CSAN models)."""
    hit = _META_READS.get(func)
    if hit is None:
        base = func._schema.name.split("::", 1)[-1]
        hit = _META_READS[func] = base.endswith("_like") or base.startswith("new_")
    return hit


def _implicit_sync(func, args: tuple, kwargs: dict) -> bool:
    if func in _SYNC_OPS:
        return True
    if func in _BOOL_INDEX_OPS:
        indices = arg_value(args, kwargs, 1)
        return any(t.dtype in (torch.bool, torch.uint8) for t in iter_tensors(indices))
    if func in _REPEAT_INTERLEAVE:
        return kwargs.get("output_size") is None
    return False


def _flat(res: Any) -> List[Any]:
    if isinstance(res, (list, tuple)):
        return list(res)
    return [res]


def _has_dev(cap: _Capture, args: tuple, kwargs: dict) -> bool:
    dt = cap.dev_type
    for v in args:
        if isinstance(v, torch.Tensor):
            if v.device.type == dt:
                return True
        elif isinstance(v, (list, tuple)):
            for x in v:
                if isinstance(x, torch.Tensor) and x.device.type == dt:
                    return True
    for v in kwargs.values():
        if isinstance(v, torch.Tensor) and v.device.type == dt:
            return True
    dev = kwargs.get("device")
    return dev is not None and torch.device(dev).type == dt


class _CaptureMode(TorchDispatchMode):
    def __init__(self, cap: _Capture) -> None:
        super().__init__()
        self.cap = cap
        self._lift_stack: List[bool] = []  # re-entered for decompositions: a stack

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _dispatch(self, self.cap, func, args, kwargs or {})

    def __enter__(self):
        # torch.tensor(data, device="cuda"): build on the CPU, lift, then a visible .to()
        self._lift_stack.append(torch._C._only_lift_cpu_tensors())
        torch._C._set_only_lift_cpu_tensors(True)
        return super().__enter__()

    def __exit__(self, *exc):
        torch._C._set_only_lift_cpu_tensors(self._lift_stack.pop())
        return super().__exit__(*exc)


# TorchDispatchMode wraps __torch_dispatch__ to keep dynamo out; the capture is never
# compiled, and the wrapper is a measurable part of its per-op cost (as on the simulator).
_CaptureMode.__torch_dispatch__ = getattr(_CaptureMode.__torch_dispatch__, "__wrapped__",
                                          _CaptureMode.__torch_dispatch__)


def _dispatch(mode: _CaptureMode, cap: _Capture, func, args: tuple, kwargs: dict) -> Any:
    if cap.depth:  # paused: a nested runtime is open, or a harness-internal call
        return func(*args, **kwargs)
    special = _SPECIAL.get(func)
    if special is not None:
        return special(cap, func, args, kwargs)
    if not _has_dev(cap, args, kwargs):
        return _host_op(cap, func, args, kwargs)
    route = _ROUTES.get(func) or _route(func)
    if route is _COMPOSITE:
        with mode:
            return func.decompose(*args, **kwargs)
    if route is _PASS:
        return func(*args, **kwargs)
    return _launch(cap, func, args, kwargs, route)


_COMPOSITE, _PASS = "composite", "pass"
# func -> _COMPOSITE (decomposed), _PASS (no kernel: allocation, metadata, views) or the
# op's effects (a kernel to log). Asked for every op: classified once per overload.
_ROUTES: Dict[Any, Any] = {}


def _route(func) -> Any:
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        route: Any = _COMPOSITE
    elif func in _NO_KERNEL or torch.Tag.inplace_view in func.tags:
        route = _PASS
    else:
        eff = effects(func)
        route = _PASS if eff.is_view or _is_metadata_query(func, eff) else eff
    _ROUTES[func] = route
    return route


def _launch(cap: _Capture, func, args: tuple, kwargs: dict, eff) -> Any:
    reads: List[Access] = []
    writes: List[Access] = []
    in_ptrs = set()
    host_reads = []
    meta_only = _metadata_reads(func)
    for key, is_write in eff.tensor_args:
        for t in iter_tensors(arg_value(args, kwargs, key)):
            if t.device.type == cap.dev_type:
                a, ptr = cap.access(t)
                in_ptrs.add(ptr)
                if is_write:
                    writes.append(a)
                    if func is not _COPY:
                        reads.append(a)  # in-place ops read what they overwrite
                elif not meta_only:
                    reads.append(a)
            elif hostmem._PINNED:
                acc = hostmem.access_of(t)
                if acc is not None:  # a pinned CPU scalar read on the host at launch
                    host_reads.append(acc)
    out = func(*args, **kwargs)
    frame = None
    for o in _flat(out):
        if isinstance(o, torch.Tensor) and o.device.type == cap.dev_type:
            ptr = o.untyped_storage().data_ptr()
            if ptr not in in_ptrs:  # fresh memory, allocated for this op: it wrote it
                in_ptrs.add(ptr)
                frame = frame or user_frame(2)
                writes.append(cap.fresh_access(o, frame))
    syncs = _implicit_sync(func, args, kwargs)
    if not reads and not writes and not syncs and not host_reads:
        return out
    frame = frame or user_frame(2)
    for acc, name in host_reads:
        cap.note_host_access(acc, False, name, frame)
    sid = cap.cur()
    cap.op(sid, func.__name__, reads, writes, frame)
    if syncs:  # CUDA syncs the current stream to size the output
        cap.sync([cap.position(sid)], f"implicit sync: {func.__name__}", frame)
    return out


def _host_op(cap: _Capture, func, args: tuple, kwargs: dict) -> Any:
    """No device tensor involved: run it; register pinned allocations; report host
    accesses of watched pinned memory (views are metadata, not accesses)."""
    if kwargs.get("pin_memory") or func is aten._pin_memory.default:
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.device.type == "cpu" and cuda_is_pinned(out):
            return hostmem.register(out)
        return out
    if hostmem._PINNED and func not in _NO_KERNEL and torch.Tag.inplace_view not in func.tags \
            and not effects(func).is_view:
        hostmem.note_host_op(func, args, kwargs, cap.note_host_access)
    return func(*args, **kwargs)


# --- transfers ----------------------------------------------------------------------------

def _to_copy(cap: _Capture, func, args: tuple, kwargs: dict) -> Any:
    src = args[0]
    target = kwargs.get("device")
    src_dev = src.device.type == cap.dev_type
    dst_dev = (torch.device(target).type == cap.dev_type) if target is not None else src_dev
    if src_dev and not dst_dev:
        return _d2h_new(cap, func, args, kwargs)
    if not src_dev and dst_dev:
        return _h2d(cap, func, args, kwargs, src, None,
                    bool(kwargs.get("non_blocking", False)))
    if src_dev:
        return _launch(cap, func, args, kwargs, effects(func))
    return _host_op(cap, func, args, kwargs)


def _d2h_new(cap: _Capture, func, args: tuple, kwargs: dict) -> Any:
    """``x.to("cpu"[, non_blocking=True])``: a copy on the current stream into new host
    memory -- pinned when non_blocking (PyTorch pins it), then the host does not wait."""
    src = args[0]
    non_blocking = bool(kwargs.get("non_blocking", False))
    read, _ = cap.access(src)
    out = func(*args, **kwargs)
    frame = user_frame(2)
    writes: List[Access] = []
    async_copy = False
    if non_blocking and isinstance(out, torch.Tensor) and cuda_is_pinned(out):
        out = hostmem.register(out, f"pinned {str(out.dtype)[6:]}{list(out.shape)} (to cpu)")
        acc = cap.pinned_access(out)
        if acc is not None:
            writes.append(acc)
        async_copy = True
    sid = cap.cur()
    cap.op(sid, "copy D2H", [read], writes, frame, kind="copy")
    if not async_copy:
        cap.sync([cap.position(sid)], "blocking D2H (.cpu/.tolist)", frame)
    return out


def _h2d(cap: _Capture, func, args: tuple, kwargs: dict, src: torch.Tensor,
         dst: Optional[torch.Tensor], non_blocking: bool) -> Any:
    """H2D (``x.to("cuda")`` or ``dev.copy_(host)``): the copy reads a pinned source when
    it executes; a blocking copy syncs the current stream (memcpy_and_sync)."""
    reads: List[Access] = []
    pinned = cap.pinned_access(src)
    if pinned is not None:
        reads.append(pinned)
    writes: List[Access] = []
    in_ptr = None
    if dst is not None:
        a, in_ptr = cap.access(dst)
        writes.append(a)
    out = func(*args, **kwargs)
    frame = user_frame(2)
    if dst is None and isinstance(out, torch.Tensor):
        writes.append(cap.fresh_access(out, frame))
    sid = cap.cur()
    cap.op(sid, "copy H2D", reads, writes, frame, kind="copy")
    if not non_blocking and BLOCKING_H2D_SYNCS:
        cap.sync([cap.position(sid)], "blocking H2D", frame)
    return out


def _copy_(cap: _Capture, func, args: tuple, kwargs: dict) -> Any:
    dst, src = args[0], args[1]
    non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking", False))
    d_dev = dst.device.type == cap.dev_type
    s_dev = isinstance(src, torch.Tensor) and src.device.type == cap.dev_type
    if d_dev and s_dev:
        return _launch(cap, func, args, kwargs, effects(func))
    if d_dev:
        return _h2d(cap, func, args, kwargs, src, dst, non_blocking)
    if s_dev:
        read, _ = cap.access(src)
        pinned = cap.pinned_access(dst)
        out = func(*args, **kwargs)
        frame = user_frame(2)
        sid = cap.cur()
        cap.op(sid, "copy D2H", [read], [pinned] if pinned is not None else [], frame,
               kind="copy")
        if not (non_blocking and pinned is not None):
            cap.sync([cap.position(sid)], "blocking D2H (copy_ into pageable memory)", frame)
        return out
    return _host_op(cap, func, args, kwargs)


def _local_scalar_dense(cap: _Capture, func, args: tuple, kwargs: dict) -> Any:
    src = args[0]
    if src.device.type != cap.dev_type:
        return _host_op(cap, func, args, kwargs)
    read, _ = cap.access(src)
    out = func(*args, **kwargs)
    frame = user_frame(2)
    sid = cap.cur()
    cap.op(sid, "copy D2H (item)", [read], [], frame, kind="copy")
    cap.sync([cap.position(sid)], "blocking D2H (.item)", frame)
    return out


def _empty(cap: _Capture, func, args: tuple, kwargs: dict) -> Any:
    """Allocation only: no kernel runs (device memory: an ``AllocRecord``). Pinned host
    allocations are registered."""
    out = func(*args, **kwargs)
    if isinstance(out, torch.Tensor) and out.device.type == cap.dev_type:
        cap.allocated(out, user_frame(2))
    elif (kwargs.get("pin_memory") and isinstance(out, torch.Tensor)
            and out.device.type == "cpu" and cuda_is_pinned(out)):
        return hostmem.register(out)
    return out


def _record_stream(cap: _Capture, func, args: tuple, kwargs: dict) -> Any:
    """``t.record_stream(s)``: logged, then done for real (the allocator must defer)."""
    t, stream = args[0], args[1]
    if isinstance(t, torch.Tensor) and t.device.type == cap.dev_type:
        cap.record_stream(t, stream, user_frame(2))
    return func(*args, **kwargs)


_SPECIAL: Dict[Any, Callable[..., Any]] = {
    aten._to_copy.default: _to_copy,
    aten.copy_.default: _copy_,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.empty.memory_format: _empty,
    aten.empty_strided.default: _empty,
    aten.empty_like.default: _empty,
    aten.new_empty.default: _empty,
    aten.new_empty_strided.default: _empty,
    aten.record_stream.default: _record_stream,
}


# ---------------------------------------------------------------------------------------
# Stream / event API wrappers
#
# Installed once per class and never removed: each wrapper logs into the capture that is
# active (``_ACTIVE``, not paused) and is a plain pass-through otherwise. Swapping class
# attributes in and out around every traced run -- and keying event state on weak
# references -- segfaulted CPython 3.12 at the end of the second traced trial on the H200
# (``tools/gpu_bisect.py``: only the variant without per-run wrappers survived).

_EVENT_STATE = "_specrace_event"  # attribute on the event: (capture token, eid, position)


def _logging_capture() -> Optional["_Capture"]:
    cap = _ACTIVE
    return cap if cap is not None and not cap.depth else None


def _call_quietly(cap: "_Capture", orig, *a, **k):
    """Call the real API with logging paused (its inner calls pass through)."""
    cap.depth += 1
    try:
        return orig(*a, **k)
    finally:
        cap.depth -= 1


def _log_wait(cap: "_Capture", sid: int, pos: Any, frame) -> None:
    if isinstance(pos, CaptureToken):  # recorded inside a CUDA graph capture
        if pos.capture is cap.graph:
            cap.graph.wait(sid, pos)  # a fork or a join inside the graph: no stream op
        return
    # CUDA: waiting on a never-recorded event (or one recorded on an empty stream) is a
    # no-op; the simulator logs nothing there either.
    if pos is None or pos[1] == 0:
        return
    cap.op(sid, "wait_event", [], [], frame, kind="wait", wait_for=pos, duration=0.0)


def _at_position(st) -> Optional[Position]:
    """The stream position of an event's state, None for one recorded inside a capture
    (CUDA refuses a host wait on that; nothing to log)."""
    return None if st is None or isinstance(st[1], CaptureToken) else st[1]


def _ev_record(cap, orig, self, stream=None, *a, **k):
    res = _call_quietly(cap, orig, self, stream, *a, **k)
    sid = cap.stream_of(stream)
    if cap.graph is not None and cap.graph.takes(sid):
        cap.event_recorded(self, cap.graph.event(sid))  # a point inside the graph
        return res
    pos = cap.position(sid)
    eid = cap.event_recorded(self, pos)
    cap.trace.add(EventRecord(eid, pos, user_frame(3)))
    return res


def _ev_wait(cap, orig, self, stream=None, *a, **k):
    res = _call_quietly(cap, orig, self, stream, *a, **k)
    st = cap.event_state(self)
    _log_wait(cap, cap.stream_of(stream), st[1] if st else None, user_frame(3))
    return res


def _ev_query(cap, orig, self, *a, **k):
    res = _call_quietly(cap, orig, self, *a, **k)
    pos = _at_position(cap.event_state(self)) if res else None
    if pos is not None:  # a query() that returned True is a sync (CSAN misses it)
        cap.trace.add(QueryRecord("event.query", pos, user_frame(3)))
    return res


def _ev_synchronize(cap, orig, self, *a, **k):
    res = _call_quietly(cap, orig, self, *a, **k)
    pos = _at_position(cap.event_state(self))
    if pos is not None:
        cap.sync([pos], "event.synchronize", user_frame(3))
    return res


def _st_wait_event(cap, orig, self, event, *a, **k):
    res = _call_quietly(cap, orig, self, event, *a, **k)
    st = cap.event_state(event)
    _log_wait(cap, cap.stream_of(self), st[1] if st else None, user_frame(3))
    return res


def _st_wait_stream(cap, orig, self, stream, *a, **k):
    res = _call_quietly(cap, orig, self, stream, *a, **k)
    me, other = cap.stream_of(self), cap.stream_of(stream)
    if me != other and cap.graph is not None and cap.graph.takes(other):
        cap.graph.wait(me, cap.graph.event(other))  # a fork or a join inside the graph
    elif me != other:  # as the simulator: an internal event recorded, then one wait
        frame = user_frame(3)
        pos = cap.position(other)
        cap.trace.add(EventRecord(cap.new_eid(), pos, frame))
        _log_wait(cap, me, pos, frame)
    return res


def _st_query(cap, orig, self, *a, **k):
    res = _call_quietly(cap, orig, self, *a, **k)
    if res:
        cap.trace.add(QueryRecord("stream.query", cap.position(cap.stream_of(self)),
                                  user_frame(3)))
    return res


def _st_synchronize(cap, orig, self, *a, **k):
    res = _call_quietly(cap, orig, self, *a, **k)
    cap.sync([cap.position(cap.stream_of(self))], "stream.synchronize", user_frame(3))
    return res


def _mod_synchronize(cap, orig, *a, **k):
    res = _call_quietly(cap, orig, *a, **k)
    cap.sync([cap.position(s) for s in range(len(cap.seqs))], "device.synchronize",
             user_frame(3))
    return res


# CUDA graphs: the capture records what the graph's kernels touch (``_Capture.log_op``);
# each replay logs those ops again on the replaying stream. The graph's ops live on the
# graph object, tagged with the capture token like event state.

_GRAPH_STATE = "_specrace_graph"  # attribute on the graph: [capture token, gid, ops, replays]


def _g_capture_begin(cap, orig, self, *a, **k):
    res = _call_quietly(cap, orig, self, *a, **k)
    cap.graph = GraphCapture(cap.cur())  # CUDA itself enforces the capture rules
    return res


def _g_capture_end(cap, orig, self, *a, **k):
    graph, cap.graph = cap.graph, None
    res = _call_quietly(cap, orig, self, *a, **k)  # raises for an invalid capture
    if graph is not None:
        setattr(self, _GRAPH_STATE, [cap.token, next(cap.graph_ids), graph.ops, 0])
    return res


def _g_replay(cap, orig, self, *a, **k):
    res = _call_quietly(cap, orig, self, *a, **k)
    st = getattr(self, _GRAPH_STATE, None)
    if st is not None and st[0] == cap.token:  # captured in this run: its accesses are known
        st[3] += 1
        for op in replay_ops(st[2], cap.cur(), st[1], st[3], user_frame(3)):
            cap.log_op(op)
    return res


def _g_reset(cap, orig, self, *a, **k):
    res = _call_quietly(cap, orig, self, *a, **k)
    if getattr(self, _GRAPH_STATE, None) is not None:
        setattr(self, _GRAPH_STATE, None)
    return res


# (attribute, logger) for each wrapped API, on the event class, the stream class and the
# device module.
_EVENT_API = (("record", _ev_record), ("wait", _ev_wait), ("query", _ev_query),
              ("synchronize", _ev_synchronize))
_STREAM_API = (("wait_event", _st_wait_event), ("wait_stream", _st_wait_stream),
               ("query", _st_query), ("synchronize", _st_synchronize))
_MODULE_API = (("synchronize", _mod_synchronize),)
_GRAPH_API = (("capture_begin", _g_capture_begin), ("capture_end", _g_capture_end),
              ("replay", _g_replay), ("reset", _g_reset))


def _wrapper(orig: Callable[..., Any], log: Callable[..., Any], name: str) -> Callable[..., Any]:
    def wrapped(*a, **k):
        cap = _logging_capture()
        if cap is None:
            return orig(*a, **k)
        return log(cap, orig, *a, **k)

    wrapped.__name__ = name
    wrapped.__qualname__ = getattr(orig, "__qualname__", name)
    wrapped.__doc__ = getattr(orig, "__doc__", None)
    wrapped.__wrapped__ = orig
    wrapped._specrace_wrapper = True
    return wrapped


def ensure_api_wrapped(stream_cls: Any, event_cls: Any, module: Any,
                       graph_cls: Any = None) -> None:
    """Wrap the stream/event API of ``stream_cls`` / ``event_cls`` / ``module``, and the
    capture/replay API of ``graph_cls`` (``torch.cuda.CUDAGraph``), once."""
    tables = [(event_cls, _EVENT_API), (stream_cls, _STREAM_API), (module, _MODULE_API)]
    if graph_cls is not None:
        tables.append((graph_cls, _GRAPH_API))
    for owner, table in tables:
        for name, log in table:
            current = getattr(owner, name)
            if getattr(current, "_specrace_wrapper", False):
                continue
            setattr(owner, name, _wrapper(current, log, name))


@contextlib.contextmanager
def capturing(cap: "_Capture") -> Iterator["_Capture"]:
    """Make ``cap`` the capture the API wrappers log into, for the block."""
    global _ACTIVE
    outer, _ACTIVE = _ACTIVE, cap
    try:
        yield cap
    finally:
        _ACTIVE = outer


# ---------------------------------------------------------------------------------------
# The runtime

def _raw_stream_fn(index: int) -> Callable[[], int]:
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return lambda: raw(index)
    return lambda: torch.cuda.current_stream(index).cuda_stream


class CudaRuntime(Runtime):
    backend = "cuda"
    _dev_type = "cuda"  # whose tensors are device memory (the CPU tests swap in "cpu")

    def __init__(self, trace: bool = True) -> None:
        index = torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        self.trace = Trace()
        self.tracing = trace
        default = torch.cuda.default_stream(self.device).cuda_stream
        self._cap = _Capture(self.trace, _raw_stream_fn(index), default_handle=default,
                             dev_type=self._dev_type)
        self._cycles_per_ms: Optional[float] = None

    # --- streams ---------------------------------------------------------------------
    def label(self, stream, name: str) -> None:
        self._cap.stream_id(_handle_of(stream), name)

    def stream_id(self, stream=None) -> int:
        """The trace id of ``stream`` (None: the current stream)."""
        return self._cap.stream_of(stream)

    # --- stalls ----------------------------------------------------------------------
    def calibrate(self, force: bool = False) -> float:
        self._cycles_per_ms = calibrate(force)
        return self._cycles_per_ms

    @property
    def cycles_per_ms(self) -> float:
        if self._cycles_per_ms is None:
            self.calibrate()
        return self._cycles_per_ms  # type: ignore[return-value]

    def stall(self, ms: Optional[float] = None) -> None:
        """Hold the *current* stream busy for ``ms`` (None: ``DEFAULT_STALL_MS``), capped
        at ``MAX_STALL_MS``; logged as a stall op when tracing."""
        cycles = stall_cycles(ms, self.cycles_per_ms)
        if cycles > 0:
            torch.cuda._sleep(cycles)
        if self.tracing:
            cap = self._cap
            cap.op(cap.cur(), "stall", [], [], user_frame(2), kind="stall",
                   duration=_clamp_ms(ms) * 1000.0)

    watchdog = staticmethod(watchdog)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


@contextlib.contextmanager
def cuda_runtime(trace: bool = True) -> Iterator[CudaRuntime]:
    """The CUDA backend for one run; ``trace=False`` installs no capture at all.

    Runtimes nest (a reference run inside a trial): while an inner one is open, the outer
    capture records nothing, and its pinned-memory registry and host recorder are put
    back on exit.
    """
    if not torch.cuda.is_available():
        raise BackendError("--backend cuda: no CUDA device is available on this machine")
    rt = CudaRuntime(trace)
    rt.calibrate()
    outer = _ACTIVE
    saved_recorder = hostmem.RECORDER
    saved_pinned = hostmem.save()
    if outer is not None:
        outer.depth += 1  # pause the outer run's capture (mode and wrappers pass through)
    # A process that opened the simulator must ask CUDA about pinned memory explicitly.
    pinning = CudaPinning() if needs_cuda_pinning() else contextlib.nullcontext()
    try:
        if not trace:
            hostmem.RECORDER = None
            with torch.no_grad(), pinning:
                yield rt
            return
        cap = rt._cap
        hostmem.RECORDER = cap.note_host_access
        ensure_api_wrapped(torch.cuda.Stream, torch.cuda.Event, torch.cuda,
                           getattr(torch.cuda, "CUDAGraph", None))
        with capturing(cap), torch.no_grad(), pinning, _CaptureMode(cap):
            yield rt
    finally:
        if outer is not None:
            outer.depth -= 1
        hostmem.RECORDER = saved_recorder
        hostmem.restore(saved_pinned)
