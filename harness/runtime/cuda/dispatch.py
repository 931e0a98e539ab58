"""The CUDA capture's rungs of the ``ops`` ladder: CUDA runs every op; the dispatch mode
records what it did for the happens-before detector.

* a kernel is an ``OpRecord`` on the current stream with the ladder's reads/writes (views,
  allocations and metadata queries run nothing and record nothing);
* a transfer (what it is, and whether the host waits: ``ops.classify_transfer``) is a
  copy op on the current stream;
* host syncs (blocking D2H, ``.item()``, data-dependent output shapes such as ``nonzero``
  / boolean masks) append a ``SyncRecord`` on the current stream after the op; a
  ``non_blocking`` D2H into pinned memory is an op writing the pinned buffer, which is
  registered in ``hostmem`` so later host reads (``tolist()``, ``.item()``, ...) show up
  as ``HostAccess`` records -- the reads CSAN cannot see;
* ``record_stream`` reaches the mode as ``aten.record_stream``: a ``RecordStreamRecord``.

Blocking H2D copies (``x.to("cuda")``, ``torch.tensor(..., device="cuda")``) are
``memcpy_and_sync`` in PyTorch, so they sync the current stream, as on the simulator.
"""
from __future__ import annotations

from typing import Any, List, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.runtime import hostmem, ops
from harness.runtime.pinning import cuda_is_pinned
from harness.runtime.trace import Access, OpKind, user_frame
from harness.runtime.cuda.capture import Capture
from seams.vocab import shaped_name

aten = torch.ops.aten


class CudaBackend(ops.Backend):
    def __init__(self, cap: Capture, mode: "CaptureMode") -> None:
        self.cap = cap
        self.mode = mode
        self.dev_type = cap.dev_type

    # --- the ladder ------------------------------------------------------------------
    def on_device(self, args: tuple, kwargs: dict) -> bool:
        dt = self.dev_type
        for v in args:
            if isinstance(v, torch.Tensor):
                if v.device.type == dt:
                    return True
            elif isinstance(v, (list, tuple)):
                for x in v:
                    if isinstance(x, torch.Tensor) and x.device.type == dt:
                        return True
        if kwargs:
            for v in kwargs.values():
                if isinstance(v, torch.Tensor) and v.device.type == dt:
                    return True
            dev = kwargs.get("device")
            return dev is not None and torch.device(dev).type == dt
        return False

    def host_op(self, op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
        """No device tensor involved: run it; register pinned allocations; report host
        accesses of watched pinned memory (views are metadata, not accesses)."""
        func = op.func
        if kwargs.get("pin_memory") or func is aten._pin_memory.default:
            out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor) and out.device.type == "cpu" and cuda_is_pinned(out):
                return hostmem.register(out)
            return out
        if op.touches_data and hostmem.watching():
            hostmem.note_host_op(func, args, kwargs, self.cap.note_host_access)
        return func(*args, **kwargs)

    def composite(self, op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
        with self.mode:
            return op.func.decompose(*args, **kwargs)

    def passes(self, op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
        """No kernel: allocation, metadata, views -- CUDA does it, nothing to record."""
        return op.func(*args, **kwargs)

    inplace_view = view = no_kernel = query = passes

    def kernel(self, op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
        cap = self.cap
        host_reads: List[Any] = []
        other = None
        if hostmem.watching():  # the hot path builds no closure while no pinned memory is
            def other(t: torch.Tensor, _op) -> None:
                acc = hostmem.access_of(t)
                if acc is not None:  # a pinned CPU scalar read on the host at launch
                    host_reads.append(acc)

        reads, writes = ops.data_accesses(op, args, kwargs, self._device_access, other)
        out = op.func(*args, **kwargs)
        frame = None
        for o in (out if isinstance(out, (list, tuple)) else (out,)):
            if (isinstance(o, torch.Tensor) and o.device.type == self.dev_type
                    and not self._aliases_input(o, args, reads, writes)):
                # fresh memory, allocated for this op: it wrote it
                frame = frame or user_frame(2)
                writes.append(cap.fresh_access(o, frame))
        syncs = op.sync is not None and ops.syncs_host(op, args, kwargs)
        if not reads and not writes and not syncs and not host_reads:
            return out
        frame = frame or user_frame(2)
        for acc, name in host_reads:
            cap.note_host_access(acc, False, name, frame)
        sid = cap.cur()
        cap.op(sid, op.name, reads, writes, frame)
        if syncs:  # CUDA syncs the current stream to size the output
            cap.sync([cap.position(sid)], ops.implicit_sync_label(op.name), frame)
        return out

    def _aliases_input(self, o: torch.Tensor, args: tuple, reads: List[Access],
                       writes: List[Access]) -> bool:
        """Is output ``o`` in the storage of an argument (an in-place or ``out=`` op)
        rather than memory allocated for the op?"""
        if args and o is args[0]:  # in-place ops return self: the common case, cheaply
            return True
        sid = self.cap.ptr_sid.get(o.untyped_storage().data_ptr())
        if sid is None:
            return False
        return any(a[0] == sid for a in writes) or any(a[0] == sid for a in reads)

    def is_dev(self, t: torch.Tensor) -> bool:
        return t.device.type == self.dev_type

    def _device_access(self, t: torch.Tensor) -> Optional[Any]:
        """The capture's access of a device tensor, None for a host one."""
        return self.cap.sid_access(t) if t.device.type == self.dev_type else None

    # --- transfers: ``ops.classify_transfer`` decided what the copy is; CUDA does it,
    # these record it ----------------------------------------------------------------------
    def d2d(self, op: ops.OpInfo, call: ops.TransferCall, args: tuple, kwargs: dict) -> Any:
        return self.kernel(op, args, kwargs)

    def d2h_new(self, op: ops.OpInfo, call: ops.TransferCall, args: tuple,
                kwargs: dict) -> Any:
        """``x.to("cpu"[, non_blocking=True])``: a copy on the current stream into new host
        memory -- pinned when non_blocking (PyTorch pins it), then the host does not wait."""
        cap = self.cap
        read, _ = cap.access(call.src)
        out = op.func(*args, **kwargs)
        frame = user_frame(2)
        writes: List[Access] = []
        pinned = call.pins_result and isinstance(out, torch.Tensor) and cuda_is_pinned(out)
        if pinned:
            out = hostmem.register(out, f"pinned {shaped_name(out.dtype, out.shape)} (to cpu)")
            acc = cap.pinned_access(out)
            if acc is not None:
                writes.append(acc)
        self._copy(call, [read], writes, frame, pinned)
        return out

    def d2h_into(self, op: ops.OpInfo, call: ops.TransferCall, args: tuple,
                 kwargs: dict) -> Any:
        cap = self.cap
        read, _ = cap.access(call.src)
        pinned = cap.pinned_access(call.dst)
        out = op.func(*args, **kwargs)
        self._copy(call, [read], [pinned] if pinned is not None else [], user_frame(2),
                   pinned is not None)
        return out

    def h2d_new(self, op: ops.OpInfo, call: ops.TransferCall, args: tuple,
                kwargs: dict) -> Any:
        """``x.to("cuda")``: the copy reads a pinned source when it executes and writes
        fresh device memory; a blocking copy syncs the current stream (memcpy_and_sync)."""
        cap = self.cap
        pinned = cap.pinned_access(call.src)
        out = op.func(*args, **kwargs)
        frame = user_frame(2)
        writes = [cap.fresh_access(out, frame)] if isinstance(out, torch.Tensor) else []
        self._copy(call, [pinned] if pinned is not None else [], writes, frame,
                   pinned is not None)
        return out

    def h2d_into(self, op: ops.OpInfo, call: ops.TransferCall, args: tuple,
                 kwargs: dict) -> Any:
        """``dev.copy_(host)``: as ``h2d_new``, into the device tensor."""
        cap = self.cap
        pinned = cap.pinned_access(call.src)
        writes = [cap.access(call.dst)[0]]
        out = op.func(*args, **kwargs)
        self._copy(call, [pinned] if pinned is not None else [], writes, user_frame(2),
                   pinned is not None)
        return out

    def d2h_item(self, op: ops.OpInfo, call: ops.TransferCall, args: tuple,
                 kwargs: dict) -> Any:
        cap = self.cap
        read, _ = cap.access(call.src)
        out = op.func(*args, **kwargs)
        self._copy(call, [read], [], user_frame(2), False)
        return out

    def _copy(self, call: ops.TransferCall, reads: List[Access], writes: List[Access],
              frame, pinned_host: bool) -> None:
        """The copy op on the current stream, and the host's sync when it waits for it."""
        cap = self.cap
        sid = cap.cur()
        cap.op(sid, call.op_name, reads, writes, frame, kind=OpKind.COPY)
        if call.host_waits(pinned_host):
            cap.sync([cap.position(sid)], call.sync_label, frame)

    # --- other specials ----------------------------------------------------------------
    def empty(self, op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
        """Allocation only: no kernel runs (device memory: an ``AllocRecord``). Pinned host
        allocations are registered."""
        out = op.func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.device.type == self.dev_type:
            self.cap.allocated(out, user_frame(2))
        elif (kwargs.get("pin_memory") and isinstance(out, torch.Tensor)
                and out.device.type == "cpu" and cuda_is_pinned(out)):
            return hostmem.register(out)
        return out

    empty_like = empty

    def record_stream(self, op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
        """``t.record_stream(s)``: logged, then done for real (the allocator must defer)."""
        t, stream = args[0], args[1]
        if isinstance(t, torch.Tensor) and t.device.type == self.dev_type:
            self.cap.record_stream(t, stream, user_frame(2))
        return op.func(*args, **kwargs)


class CaptureMode(TorchDispatchMode):
    """The dispatch mode of a traced CUDA run: every aten op goes to its ``CudaBackend``
    (unless the capture is paused: a nested runtime is open, or a harness-internal call)."""

    def __init__(self, cap: Capture) -> None:
        super().__init__()
        self.cap = cap
        self.backend = CudaBackend(cap, self)
        self._lift_stack: List[bool] = []  # re-entered for decompositions: a stack

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.cap.depth:
            return func(*args, **(kwargs or {}))
        return self.backend.dispatch(func, args, kwargs or {})

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
CaptureMode.__torch_dispatch__ = getattr(CaptureMode.__torch_dispatch__, "__wrapped__",
                                         CaptureMode.__torch_dispatch__)
