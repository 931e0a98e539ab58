"""The simulator's rungs of the ``ops`` ladder: every aten op on a ``SimTensor`` (or
naming ``device="sim"``) becomes a stream op on the current simulated stream.

(Kernel launches are ``launch.py``.)

* views are metadata: computed at once on ``_buf`` and re-wrapped, aliasing the base;
* kernels get their outputs allocated now, filled with **poison** (device memory is
  garbage until a kernel writes it), and their computation queued as a closure; when the
  policy lets the stream run at once and the stream is idle, the op simply executes now
  (the fast path: no meta run, no poison, no closure);
* transfers (what each is: ``ops.classify_transfer``) follow CUDA: a blocking D2H syncs
  the current stream only; a non_blocking D2H into pinned memory is a stream op the host
  does not wait for; a non_blocking H2D from pinned memory reads its source when it
  executes, a pageable one snapshots it now;
* ops whose output shape depends on data (nonzero, boolean masks) sync the current
  stream and run eagerly, as CUDA does;
* every op records what it read and wrote (storage id, byte range) and the user frame
  that issued it, for the happens-before detector.
"""
from __future__ import annotations

from typing import Any, List

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.runtime import hostmem, ops
from harness.runtime.load import NONE
from harness.runtime.sim import load
from harness.runtime.trace import COPY_H2D, OpKind, OpRecord, user_frame
from harness.runtime.sim.allocator import poison_fill
from harness.runtime.sim.inference import host_write, inference_mode, view_in_inference_mode
from harness.runtime.sim.streams import current_device
from harness.runtime.sim.launch import launch
from harness.runtime.sim.tensor import (SimTensor, access, alias, new_storage, note_record_stream,
                     poisoned_empty, relaid, unwrap, unwrap_call)
from seams.vocab import shaped_name

aten = torch.ops.aten
_CPU = torch.device("cpu")


class SimBackend(ops.Backend):
    @classmethod
    def _entry(cls, func: Any) -> Any:
        """The ladder's routing, but for the ``*_like`` / ``new_*`` factories that take a
        ``device=``: the ladder makes them kernels (they launch one on the input's
        device), while the device they make on is the argument's (``like_factory``)."""
        op, special, routed = super()._entry(func)
        if special is None and op.metadata_reads and _takes_device(func):
            routed = cls.like_factory
        return op, special, routed

    # --- the ladder ------------------------------------------------------------------
    def on_device(self, args: tuple, kwargs: dict) -> bool:
        for v in args:
            if type(v) is SimTensor:
                return True
            if isinstance(v, (list, tuple)):
                for x in v:
                    if type(x) is SimTensor:
                        return True
        if kwargs:
            for v in kwargs.values():
                if type(v) is SimTensor:
                    return True
            dev = kwargs.get("device")
            return dev is not None and torch.device(dev).type == "sim"
        return False

    def host_op(self, op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
        """An op on host tensors only: run it, report touches of watched pinned memory."""
        if op.route == ops.COMPOSITE:
            # Only inference tensors bring one here (they skip the autograd key, where
            # torch decomposes): run whole, ``pin_memory`` would pin on the CPU backend,
            # which cannot -- decomposed, its parts come back here (``_pin_memory``).
            return self.composite(op, args, kwargs)
        func = op.func
        if kwargs.get("pin_memory"):
            kwargs = dict(kwargs)
            del kwargs["pin_memory"]
            out = func(*args, **kwargs)
            return hostmem.register(out) if isinstance(out, torch.Tensor) else out
        if op.touches_data and hostmem.watching():
            hostmem.note_host_op(func, args, kwargs, current_device().note_host_access)
        return func(*args, **kwargs)

    def composite(self, op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
        with SimMode():
            return op.func.decompose(*args, **kwargs)

    def inplace_view(self, op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
        self_ = args[0]
        # Kernels already queued hold ``self._buf`` itself as an argument, so don't restride
        # that object: give the wrapper a fresh alias of the same memory and change *its*
        # metadata (else, under lazy, ``y = x * 10; x.t_()`` ran the multiply transposed).
        buf = self_._buf
        buf = buf.as_strided(buf.size(), buf.stride(), buf.storage_offset())
        op.func(buf, *unwrap(args[1:]), **unwrap(kwargs))
        self_._buf = buf
        relaid(self_)
        with torch._C._DisableTorchDispatch():
            op.func(self_, *args[1:], **kwargs)
        return self_

    def view(self, op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
        if inference_mode():
            return view_in_inference_mode(op, args, kwargs)
        bargs, bkwargs = unwrap_call(args, kwargs)
        out = op.func._op(*bargs, **bkwargs)  # (``OpOverload.__call__``'s own call)
        owner = op.effects.return_alias  # (``view_base``, written out: asked per view)
        base = (args[owner[0]] if type(owner[0]) is int else kwargs.get(owner[0])) \
            if owner and owner[0] is not None else args[0]
        if isinstance(out, torch.Tensor):
            return alias(out, base)
        return type(out)(alias(o, base) for o in out)

    def query(self, op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
        """A metadata question (``is_same_size``): no kernel, no sync, no access."""
        return op.func(*unwrap(args), **unwrap(kwargs))

    kernel = launch
    # ``_unsafe_view``, ``resize_``, ``set_``: the simulator has no storage aliasing outside
    # views, so it computes these as kernels (their outputs are fresh blocks).
    no_kernel = launch

    # --- transfers: ``ops.classify_transfer`` decided what the copy is; these are its
    # effects on the simulated device ----------------------------------------------------
    dev_type = "sim"

    @staticmethod
    def is_dev(t: Any) -> bool:
        return type(t) is SimTensor

    def d2d(self, op: ops.OpInfo, call: ops.TransferCall, args: tuple, kwargs: dict) -> Any:
        if call.dst is not None:  # dev.copy_(dev): a kernel writing dst
            return launch(self, op, (call.dst, call.src), {})
        # sim -> sim (a dtype or layout change): an ordinary kernel
        target = kwargs.get("device")
        rest = {k: v for k, v in kwargs.items()
                if k not in ("device", "non_blocking", "pin_memory")}
        return launch(self, op, args, {**rest, **({"device": target} if target else {})})

    def d2h_new(self, op: ops.OpInfo, call: ops.TransferCall, args: tuple,
                kwargs: dict) -> torch.Tensor:
        """``x.to("cpu")``: a copy kernel on the current stream into new host memory."""
        src = call.src
        if _device_type(kwargs["device"]) == "meta":  # (a D2H names its device)
            return _to_meta(op, src, kwargs)
        dtype = kwargs.get("dtype") or src.dtype
        host = poisoned_empty(src.shape, _contig_stride(src.shape), dtype)
        if call.pins_result:
            host = hostmem.register(host, f"pinned {shaped_name(dtype, src.shape)} (to cpu)")
        dst_acc = hostmem.access_of(host)
        sbuf = src._buf

        def kernel() -> None:
            host_write(host, sbuf)

        _copy(current_device(), call, [access(src)], [dst_acc[0]] if dst_acc else [], kernel,
              call.pins_result, user_frame(4))
        return host

    def d2h_into(self, op: ops.OpInfo, call: ops.TransferCall, args: tuple,
                 kwargs: dict) -> Any:
        """``host.copy_(dev)``: a copy kernel writing the host tensor when it executes."""
        dst, src = call.dst, call.src
        if dst.is_meta:
            # meta outranks every backend in torch's dispatch: the meta kernel checks the
            # shapes and copies nothing, on CUDA too -- no device read, no sync
            return dst.copy_(src._buf)
        dev = current_device()
        pinned = hostmem.access_of(dst)
        if pinned is not None:
            dev.trace.storage_names.setdefault(pinned[0][0], pinned[1])
        sbuf = src._buf

        def kernel() -> None:
            host_write(dst, sbuf)

        _copy(dev, call, [access(src)], [pinned[0]] if pinned else [], kernel,
              pinned is not None, user_frame(4))
        return dst

    def h2d_new(self, op: ops.OpInfo, call: ops.TransferCall, args: tuple,
                kwargs: dict) -> SimTensor:
        src = call.src
        dev = current_device()
        frame = user_frame(4)
        dtype = kwargs.get("dtype") or src.dtype
        out = new_storage(dev, src.shape, _contig_stride(src.shape), dtype, frame, COPY_H2D)
        _h2d(dev, call, out, src, frame)
        return out

    def h2d_into(self, op: ops.OpInfo, call: ops.TransferCall, args: tuple,
                 kwargs: dict) -> SimTensor:
        dst, src = call.dst, call.src
        if src.dim() > 0 and src.shape != dst.shape:
            src = src.expand(dst.shape)
        _h2d(current_device(), call, dst, src, user_frame(4))
        return dst

    def d2h_item(self, op: ops.OpInfo, call: ops.TransferCall, args: tuple,
                 kwargs: dict) -> Any:
        src = call.src
        box: List[Any] = []
        sbuf = src._buf

        def kernel() -> None:
            box.append(sbuf.item())

        _copy(current_device(), call, [access(src)], [], kernel, False, user_frame(4))
        return box[0]

    # --- other specials ----------------------------------------------------------------
    def empty(self, op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
        """Allocation only: no kernel runs, so device memory holds poison until written."""
        func = op.func
        kwargs = dict(kwargs)
        pinned = kwargs.pop("pin_memory", False)
        device = kwargs.get("device")
        if func in (aten.new_empty.default, aten.new_empty_strided.default) and device is None:
            device = args[0].device
            kwargs.setdefault("dtype", args[0].dtype)
        if device is not None and torch.device(device).type == "sim":
            kwargs["device"] = _CPU
            layout = func(*unwrap(args), **kwargs)  # the CPU factory gives shape and strides
            return new_storage(current_device(), layout.shape, layout.stride(), layout.dtype,
                               user_frame(3), func.__name__)
        # (``new_empty(dev_tensor, device="cpu")``: the device tensor lends its dtype only;
        # passed on as itself, it would come back here)
        out = func(*unwrap(args), **kwargs)
        # Fresh pinned memory is as undefined as device memory; poison it so a host read
        # before the copy lands is loud and deterministic.
        return hostmem.register(poison_fill(out)) if pinned else out

    def empty_like(self, op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
        """``empty_like`` allocates like ``empty``: on the device it is poison, not zeros
        (run as a kernel it would hand back whatever the CPU allocator had -- often zeros,
        hiding the empty-for-zeros bug)."""
        src = args[0]
        device = kwargs.get("device")
        on_sim = (torch.device(device).type == "sim" if device is not None
                  else type(src) is SimTensor)
        kw = dict(kwargs)
        pinned = kw.pop("pin_memory", False)
        if on_sim:
            kw["device"] = _CPU  # the CPU factory gives the layout
        # (else the host or the meta device, named or the input's: ``empty_like(t,
        # device="meta")`` is a meta tensor, not a CPU one)
        base = src._buf if type(src) is SimTensor else src
        buf = op.func(base, *args[1:], **kw)
        if on_sim:
            return new_storage(current_device(), buf.shape, buf.stride(), buf.dtype,
                               user_frame(3), op.func.__name__)
        return hostmem.register(poison_fill(buf)) if pinned else buf

    def like_factory(self, op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
        """``zeros_like`` / ``full_like`` / ``rand_like`` / ``new_zeros``...: factories that
        read their input's metadata only (shape, dtype, strides for ``preserve_format``).
        The tensor is made where ``device=`` says, else where the input is -- so
        ``zeros_like(host, device="sim")`` is a kernel filling fresh device memory, and
        ``zeros_like(dev, device="cpu")`` (or ``"meta"``) a host factory: the device tensor
        lends its layout, nothing is read on the device and nothing waits for it.
        (``empty_like`` / ``new_empty`` allocate without a kernel: ``empty_like``, ``empty``.)
        """
        target = kwargs.get("device")
        if target is None or _device_type(target) == "sim":
            # fresh device memory: pinning is for host memory, ignored as ``empty`` does
            if "pin_memory" in kwargs:
                kwargs = {k: v for k, v in kwargs.items() if k != "pin_memory"}
            return launch(self, op, args, kwargs)
        bargs, bkwargs = unwrap_call(args, kwargs)
        return self.host_op(op, bargs, bkwargs)  # (which pins on ``pin_memory=True``)

    def first_arg(self, op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
        return args[0] if args else None  # lift_fresh, detach_: nothing to do

    def record_stream(self, op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
        # ``SimTensor.record_stream`` handles the method; the aten spelling only ever
        # carries a ``torch.Stream``, which cannot name a simulated stream
        # (``note_record_stream`` ignores what is not one of ours).
        if type(args[0]) is SimTensor:
            note_record_stream(args[0], args[1], user_frame(3))
        return None

    def pin(self, op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
        return hostmem.register(args[0].clone())

    def is_pinned(self, op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
        return hostmem.lookup(args[0]) is not None


# --- transfer helpers --------------------------------------------------------------------

def _copy(dev, call: ops.TransferCall, reads: list, writes: list, kernel: Any,
          pinned_host: bool, frame, direction: str = "d2h") -> None:
    """Queue the copy on the current stream (behind a load's bulk copy of the same
    direction, if one runs: ``sim.load``); sync that stream when the host waits for it."""
    if dev.load is not NONE:
        load.before_copy(dev, direction)
    dev.enqueue(OpRecord(dev.current.sid, call.op_name, reads, writes, frame,
                         kind=OpKind.COPY, fn=kernel))
    if call.host_waits(pinned_host):
        dev.sync_current(call.sync_label, frame)


def _h2d(dev, call: ops.TransferCall, dst: SimTensor, src: torch.Tensor, frame) -> None:
    if src.is_meta:  # torch refuses at the call; queued, it was a sticky device error
        raise NotImplementedError("Cannot copy out of meta tensor; no data!")
    pinned = hostmem.access_of(src)
    if call.non_blocking and pinned is not None:
        source = src.detach()  # read when the copy executes: the staging-buffer reuse race
        reads = [pinned[0]]
        dev.trace.storage_names.setdefault(pinned[0][0], pinned[1])
    else:
        source = src.detach().clone()  # pageable: CUDA stages it before returning
        reads = []
    dbuf = dst._buf
    if pinned is not None and not call.non_blocking:
        dev.note_host_access(pinned[0], False, pinned[1], frame)

    def kernel() -> None:
        dbuf.copy_(source)

    # torch's blocking H2D is a copy plus a sync of the current stream (memcpy_and_sync):
    # the host waits for everything queued there, as on CUDA.
    _copy(dev, call, reads, [access(dst)], kernel, pinned is not None, frame, "h2d")


def _takes_device(func: Any) -> bool:
    return any(a.name == "device" for a in func._schema.arguments)


def _device_type(device: Any) -> str:
    """The type of a ``device=`` argument (a ``torch.device`` or a string)."""
    return device.type if isinstance(device, torch.device) else torch.device(device).type


def _to_meta(op: ops.OpInfo, src: SimTensor, kwargs: dict) -> torch.Tensor:
    """``x.to("meta")`` of a device tensor: a plain meta tensor of its layout (``_to_copy``
    on the device memory decides dtype and strides as torch would; a copy into meta copies
    nothing). Metadata only: no kernel, no device access, no sync -- as on CUDA."""
    kw = {k: v for k, v in kwargs.items() if k not in ("non_blocking", "pin_memory")}
    return op.func._op(src._buf, **kw)


def _contig_stride(shape) -> tuple:
    stride, acc = [], 1
    for s in reversed(list(shape)):
        stride.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(stride))


class SimMode(TorchDispatchMode):
    """Routes factories naming ``device="sim"`` (and host ops on pinned memory) to the
    simulator's backend."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # ``types``: the tensor subclasses among the arguments, as torch found them. (torch
        # passes a dict, empty or not: ``kwargs or {}`` made a second one per op)
        return BACKEND.dispatch(func, args, {} if kwargs is None else kwargs,
                                SimTensor in types)

    def __enter__(self):
        self._prev_lift = torch._C._only_lift_cpu_tensors()
        torch._C._set_only_lift_cpu_tensors(True)
        return super().__enter__()

    def __exit__(self, *exc):
        torch._C._set_only_lift_cpu_tensors(self._prev_lift)
        return super().__exit__(*exc)


# TorchDispatchMode wraps every subclass's __torch_dispatch__ to keep dynamo out; the
# simulator is never compiled, and the wrapper costs ~10% of an op here.
SimMode.__torch_dispatch__ = getattr(SimMode.__torch_dispatch__, "__wrapped__",
                                     SimMode.__torch_dispatch__)

BACKEND = SimBackend()
