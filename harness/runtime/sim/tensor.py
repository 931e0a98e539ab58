"""Ordinary torch code on the simulated device: ``SimTensor`` and the dispatch handler.

A ``SimTensor`` is a wrapper subclass whose ``_buf`` is a real CPU tensor -- the device
memory. Every aten op that touches one (or names ``device="sim"``) lands in ``handle``,
which turns it into a stream op on the current stream:

* views are metadata: computed at once on ``_buf`` and re-wrapped, aliasing the base;
* other ops get their outputs allocated now, filled with **poison** (device memory is
  garbage until a kernel writes it), and their computation queued as a closure; when the
  policy lets the stream run at once and the stream is idle, the op simply executes now
  (the fast path: no meta run, no poison, no closure);
* transfers follow CUDA: a blocking D2H syncs the current stream only; a non_blocking D2H
  into pinned memory is a stream op the host does not wait for; a non_blocking H2D from
  pinned memory reads its source when it executes, a pageable one snapshots it now;
* ops whose output shape depends on data (nonzero, boolean masks) sync the current
  stream and run eagerly, as CUDA does;
* every op records what it read and wrote (storage id, byte range) and the user frame
  that issued it, for the happens-before detector;
* device memory comes from the caching allocator (``allocator.py``): every wrapper on a
  storage holds its ``Storage`` handle, so the storage is freed when the last one dies,
  and its block may be handed to the next allocation on its stream.
"""
from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import hostmem
from ..schema import arg_value, effects, iter_tensors
from ..trace import OpRecord, tensor_range, user_frame
from .allocator import poison_fill
from .device import current_device

aten = torch.ops.aten
SIM: Optional[torch.device] = None  # torch.device("sim", 0), set by install()

def poisoned_empty(shape, stride, dtype) -> torch.Tensor:
    """Uninitialised *host* memory (device memory comes from the allocator)."""
    return poison_fill(torch.empty_strided(shape, stride, dtype=dtype))


class SimTensor(torch.Tensor):
    """A tensor on the simulated device. ``_buf`` is its (CPU) device memory."""

    _buf: torch.Tensor
    _sid: int
    _owner: Any  # the allocator's Storage handle (None: an empty tensor, no block)

    @staticmethod
    def __new__(cls, buf: torch.Tensor, sid: int):
        r = torch.Tensor._make_wrapper_subclass(
            cls, buf.size(), strides=buf.stride(), storage_offset=buf.storage_offset(),
            dtype=buf.dtype, device=SIM, requires_grad=False)
        r._buf = buf
        r._sid = sid
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return handle(func, args, kwargs or {})

    def tolist(self):
        return self.cpu().tolist()

    def numpy(self, *a, **k):
        raise TypeError("can't convert sim device type tensor to numpy. Use Tensor.cpu() first.")

    def record_stream(self, stream) -> None:
        _note_record_stream(self, stream, user_frame(2))

    def __repr__(self, *, tensor_contents=None) -> str:  # never syncs, never reads
        return f"SimTensor({list(self.shape)}, {self.dtype}, sid={self._sid})"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)


def _owned(buf: torch.Tensor, owner) -> SimTensor:
    t = SimTensor(buf, owner.sid if owner is not None else hostmem.new_sid())
    t._owner = owner
    return t


def new_storage(dev, shape, stride, dtype, frame, op: Optional[str] = None) -> SimTensor:
    """A fresh device tensor (uninitialised: poison, or a reused block's old data).
    ``op`` names it in reports (kernel outputs are named by ``_name_storages``)."""
    t = _owned(*dev.allocator.storage(shape, stride, dtype, frame))
    if op is not None:
        dev.trace.storage_sites[t._sid] = (op, dtype, t.shape, frame)
    return t


def adopt(dev, result: torch.Tensor, frame) -> SimTensor:
    """A kernel result computed at once (the idle-stream fast path), moved into a block."""
    return _owned(*dev.allocator.adopt(result, frame))


def alias(buf: torch.Tensor, base: Any) -> SimTensor:
    """A view: new metadata over ``base``'s storage (and its hold on the block)."""
    if type(base) is not SimTensor:
        return _owned(buf, None)
    t = SimTensor(buf, base._sid)
    t._owner = base._owner
    return t


def _note_record_stream(t: SimTensor, stream, frame) -> None:
    owner = t._owner
    if owner is not None and getattr(stream, "_dev", None) is owner.allocator.dev:
        owner.allocator.record_stream(owner, stream, frame)


def access(t: SimTensor) -> Tuple[int, int, int]:
    """(sid, lo, hi) of ``t``; cached, since a tensor's layout only changes through an
    in-place view op (which drops the cache)."""
    acc = t.__dict__.get("_acc")
    if acc is None:
        lo, hi = tensor_range(t._buf)
        acc = t._acc = (t._sid, lo, hi)
    return acc


# ---------------------------------------------------------------------------------------
# Argument plumbing (one level deep is all aten needs; pytree was 30% of the spike's time)

def _unwrap(v: Any) -> Any:
    if type(v) is SimTensor:
        return v._buf
    if isinstance(v, (list, tuple)):
        return type(v)(_unwrap(x) for x in v)
    if isinstance(v, torch.device) and v.type == "sim":
        return torch.device("cpu")
    if isinstance(v, dict):
        return {k: _unwrap(x) for k, x in v.items()}
    return v


def _has_sim(args: tuple, kwargs: dict) -> bool:
    for v in args:
        if type(v) is SimTensor:
            return True
        if isinstance(v, (list, tuple)):
            for x in v:
                if type(x) is SimTensor:
                    return True
    for v in kwargs.values():
        if type(v) is SimTensor:
            return True
    dev = kwargs.get("device")
    return dev is not None and torch.device(dev).type == "sim"


def _check_devices(args: tuple, kwargs: dict, name: str) -> None:
    """CUDA refuses a (non-scalar) CPU tensor mixed with device tensors; so do we."""
    for v in list(args) + list(kwargs.values()):
        for t in iter_tensors(v):
            if type(t) is not SimTensor and t.dim() > 0 and t.device.type == "cpu":
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two "
                    f"devices, sim:0 and cpu! (in {name})")


def _snapshot_host(v: Any) -> Any:
    """Host tensors captured by a queued kernel are its launch arguments: copy them now."""
    if isinstance(v, torch.Tensor) and type(v) is not SimTensor:
        return v.clone()
    if isinstance(v, (list, tuple)):
        return type(v)(_snapshot_host(x) for x in v)
    if isinstance(v, dict):
        return {k: _snapshot_host(x) for k, x in v.items()}
    return v


def _accesses(func, args, kwargs) -> Tuple[List, List]:
    reads: List = []
    writes: List = []
    for key, is_write in effects(func).tensor_args:
        for t in iter_tensors(arg_value(args, kwargs, key)):
            if type(t) is SimTensor:
                a = access(t)
                (writes if is_write else reads).append(a)
                if is_write and func is not aten.copy_.default:
                    reads.append(a)  # in-place ops read what they overwrite
    return reads, writes


# ---------------------------------------------------------------------------------------
# Meta runs: output metadata without computing (for ops queued behind pending work)

_META_CACHE: Dict[Any, Any] = {}
_DATA_DEPENDENT = object()


def _meta_key(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return (v.shape, v.stride(), v.dtype, v.device.type == "cpu" and type(v) is not SimTensor)
    if isinstance(v, (list, tuple)):
        return (type(v),) + tuple(_meta_key(x) for x in v)
    if isinstance(v, (int, float, bool)):
        return (type(v), v)  # 1, 1.0 and True hash equal but give different dtypes
    return v


def _to_meta(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    if isinstance(v, (list, tuple)):
        return type(v)(_to_meta(x) for x in v)
    if isinstance(v, torch.device):
        return torch.device("meta")
    return v


def _meta_outputs(func, args, kwargs) -> Any:
    try:
        key = (func, tuple(_meta_key(a) for a in args),
               tuple(sorted((k, _meta_key(v)) for k, v in kwargs.items())) if kwargs else ())
        hash(key)
    except TypeError:
        key = None
    if key is not None and key in _META_CACHE:
        return _META_CACHE[key]
    margs = tuple(_to_meta(a) for a in args)
    mkwargs = {k: _to_meta(v) for k, v in kwargs.items()}
    if "device" in mkwargs:
        mkwargs["device"] = torch.device("meta")
    try:
        with torch._C._DisableTorchDispatch():
            out = func(*margs, **mkwargs)
        if not _all_tensors(out):
            out = _DATA_DEPENDENT
        else:
            out = _meta_summary(out)
    except Exception as exc:  # data-dependent shape or no meta kernel: run it for real
        if _is_user_error(exc):
            raise
        out = _DATA_DEPENDENT
    if key is not None:
        _META_CACHE[key] = out
    return out


def _is_user_error(exc: Exception) -> bool:
    # Shape/dtype errors are raised at the call, on the host, as CUDA does.
    msg = str(exc)
    return isinstance(exc, (RuntimeError, IndexError, ValueError)) and (
        "shape" in msg or "size" in msg or "dimension" in msg or "dtype" in msg
        or "match" in msg) and "data-dependent" not in msg and "meta" not in msg.lower()


def _all_tensors(out: Any) -> bool:
    if isinstance(out, torch.Tensor):
        return True
    if isinstance(out, (list, tuple)):
        return all(isinstance(x, torch.Tensor) or x is None for x in out)
    return False


class _Meta(NamedTuple):
    shape: tuple
    stride: tuple
    dtype: torch.dtype


def _meta_summary(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return _Meta(tuple(out.shape), out.stride(), out.dtype)
    return type(out)(None if x is None else _Meta(tuple(x.shape), x.stride(), x.dtype)
                     for x in out)


# ---------------------------------------------------------------------------------------
# The handler

def handle(func, args: tuple, kwargs: dict) -> Any:
    special = _SPECIAL.get(func)
    if special is not None:
        return special(func, args, kwargs)
    if not _has_sim(args, kwargs):
        return _host_op(func, args, kwargs)
    if _is_composite(func):
        with SimMode():
            return func.decompose(*args, **kwargs)
    if torch.Tag.inplace_view in func.tags:
        return _inplace_view(func, args, kwargs)
    eff = effects(func)
    if eff.is_view:
        return _view(func, args, kwargs)
    _check_devices(args, kwargs, func.name())
    return _launch(func, args, kwargs, eff)


_COMPOSITE: Dict[Any, bool] = {}


def _is_composite(func) -> bool:
    """CompositeImplicitAutograd ops are decomposed (cached: asked for every op)."""
    c = _COMPOSITE.get(func)
    if c is None:
        c = _COMPOSITE[func] = torch._C._dispatch_has_kernel_for_dispatch_key(
            func.name(), "CompositeImplicitAutograd")
    return c


_METADATA_ONLY: Dict[Any, bool] = {}


def _metadata_only(func) -> bool:
    """Ops that touch no tensor data: views, in-place restrides, ``new_*`` / ``*_like``
    factories (as CSAN classifies them). Taking a view of a pinned buffer whose D2H copy
    is still pending is not a host read -- recording one was a false race report."""
    m = _METADATA_ONLY.get(func)
    if m is None:
        base = func.name().split("::")[-1].split(".")[0]
        m = _METADATA_ONLY[func] = (
            effects(func).is_view or torch.Tag.inplace_view in func.tags
            or base.startswith("new_") or base.endswith("_like"))
    return m


def _host_op(func, args, kwargs) -> Any:
    """An op on host tensors only: run it, report touches of watched pinned memory."""
    if kwargs.get("pin_memory"):
        kwargs = dict(kwargs)
        del kwargs["pin_memory"]
        out = func(*args, **kwargs)
        return hostmem.register(out) if isinstance(out, torch.Tensor) else out
    if hostmem._PINNED and not _metadata_only(func):
        hostmem.note_host_op(func, args, kwargs, current_device().note_host_access)
    return func(*args, **kwargs)


def _inplace_view(func, args, kwargs) -> Any:
    if func is aten.detach_.default:
        return args[0]
    self = args[0]
    # Kernels already queued hold ``self._buf`` itself as an argument, so don't restride
    # that object: give the wrapper a fresh alias of the same memory and change *its*
    # metadata (else, under lazy, ``y = x * 10; x.t_()`` ran the multiply transposed).
    buf = self._buf
    buf = buf.as_strided(buf.size(), buf.stride(), buf.storage_offset())
    func(buf, *_unwrap(args[1:]), **_unwrap(kwargs))
    self._buf = buf
    self.__dict__.pop("_acc", None)
    with torch._C._DisableTorchDispatch():
        func(self, *args[1:], **kwargs)
    return self


def _view(func, args, kwargs) -> Any:
    out = func(*_unwrap(args), **_unwrap(kwargs))
    eff = effects(func)
    base = arg_value(args, kwargs, eff.return_alias[0]) if eff.return_alias else None
    if isinstance(out, torch.Tensor):
        return alias(out, base)
    return type(out)(alias(o, base) for o in out)


def _launch(func, args, kwargs, eff) -> Any:
    dev = current_device()
    stream = dev.current
    frame = user_frame(3)
    reads, writes = _accesses(func, args, kwargs)
    name = func.__name__ if hasattr(func, "__name__") else str(func)
    idle = not stream.pending and dev.policy.runs_at_enqueue(dev, stream)

    meta = None
    if not idle:
        meta = _meta_outputs(func, args, kwargs)
        if meta is _DATA_DEPENDENT:
            # CUDA syncs the host here (nonzero, boolean masks, .equal); so do we.
            dev.host_sync([(stream.sid, stream.enq)], f"implicit sync: {name}")
            idle = True

    if idle:
        # Run the kernel now, then let the policy decide nothing else; the op is recorded
        # exactly as a queued one would be.
        bargs = _unwrap(args)
        bkwargs = _unwrap(kwargs)
        try:
            result = func(*bargs, **bkwargs)
        except Exception as exc:
            # A kernel failing on its *data* (an out-of-range gather index) is a device-side
            # error: CUDA reports it at the next sync, not at the launch, on every schedule.
            # So take the queued path below, whose kernel fails when it executes and leaves
            # the sticky error. Errors the host would raise (shapes, dtypes) raise here.
            if meta is not None or _is_user_error(exc):
                raise
            meta = _meta_outputs(func, args, kwargs)
            if meta is _DATA_DEPENDENT:
                raise
            idle = False
        if idle:
            outs = _wrap_outputs(dev, result, args, kwargs, eff, frame)
            new = _new_outputs(outs, args, kwargs)
            _name_storages(dev, new, name, frame)
            writes = writes + [access(o) for o in new]
            op = OpRecord(stream.sid, name, reads, writes, frame)
            _enqueue_executed(dev, op)
            return outs

    outs = _alloc_outputs(dev, meta, args, kwargs, eff, frame)
    new = _new_outputs(outs, args, kwargs)
    _name_storages(dev, new, name, frame)
    writes = writes + [access(o) for o in new]
    bargs = _unwrap(_snapshot_host(args))
    bkwargs = _unwrap(_snapshot_host(kwargs))
    out_bufs = [o._buf for o in new]

    def kernel() -> None:
        res = func(*bargs, **bkwargs)
        fresh = [r for r in _flat(res) if r is not None and not _aliases_arg(r, bargs, bkwargs)]
        for dst, src in zip(out_bufs, fresh):
            dst.copy_(src)

    dev.enqueue(OpRecord(stream.sid, name, reads, writes, frame, fn=kernel))
    return outs


def _name_storages(dev, outs, op_name: str, frame) -> None:
    sites = dev.trace.storage_sites
    for o in outs:
        sites[o._sid] = (op_name, o.dtype, o.shape, frame)


def _enqueue_executed(dev, op: OpRecord) -> None:
    """Enqueue an op whose effect already happened (the idle-stream fast path)."""
    policy_point = dev.policy.on_point
    s = dev.streams[op.stream]
    # The op ran at enqueue; book it in as enqueued-then-executed without re-running it.
    s.enq += 1
    op.seq = s.enq
    dev.host_clock += 1.0
    op.enq = dev.host_clock
    dev.trace.add(op)
    s.pending.append(op)
    dev.run_head(s)
    if dev.pending_ops():  # nothing is queued anywhere: the policy has nothing to decide
        policy_point(dev, s)


def _flat(res: Any) -> List[Any]:
    if isinstance(res, torch.Tensor):
        return [res]
    if isinstance(res, (list, tuple)):
        return list(res)
    return [res]


def _aliases_arg(r: torch.Tensor, bargs, bkwargs) -> bool:
    for v in list(bargs) + list(bkwargs.values()):
        if v is r:
            return True
    return False


def _wrap_outputs(dev, result, args, kwargs, eff, frame) -> Any:
    """Map a real result back to wrappers: aliased returns are the argument wrappers,
    fresh ones move into blocks of the allocator."""
    items = _flat(result)
    wrapped = []
    for i, r in enumerate(items):
        owner = eff.return_alias[i] if i < len(eff.return_alias) else None
        if owner is not None:
            wrapped.append(arg_value(args, kwargs, owner))
        elif isinstance(r, torch.Tensor):
            wrapped.append(adopt(dev, r, frame))
        else:
            wrapped.append(r)
    # Non-sequence results (a tensor, or a Python bool/int from ops like aten.equal) are
    # returned as themselves: ``type(False)([False])`` would be ``bool([False]) == True``.
    if not isinstance(result, (list, tuple)):
        return wrapped[0]
    return type(result)(wrapped)


def _alloc_outputs(dev, meta, args, kwargs, eff, frame) -> Any:
    single = isinstance(meta, _Meta)
    metas = [meta] if single else list(meta)
    outs = []
    for i, m in enumerate(metas):
        owner = eff.return_alias[i] if i < len(eff.return_alias) else None
        if owner is not None:
            outs.append(arg_value(args, kwargs, owner))
        elif m is None:
            outs.append(None)
        else:
            shape, stride, dtype = m
            outs.append(new_storage(dev, shape, stride, dtype, frame))
    return outs[0] if single else (tuple(outs) if isinstance(meta, tuple) else outs)


def _new_outputs(outs, args, kwargs) -> List[SimTensor]:
    inputs = {id(t) for v in list(args) + list(kwargs.values()) for t in iter_tensors(v)}
    return [o for o in _flat(outs) if type(o) is SimTensor and id(o) not in inputs]


# ---------------------------------------------------------------------------------------
# Transfers and other ops with device semantics of their own

def _to_copy(func, args, kwargs) -> Any:
    src = args[0]
    target = kwargs.get("device")
    target_type = torch.device(target).type if target is not None else src.device.type
    non_blocking = bool(kwargs.get("non_blocking", False))
    rest = {k: v for k, v in kwargs.items() if k not in ("device", "non_blocking", "pin_memory")}
    if type(src) is SimTensor and target_type == "cpu":
        return _d2h_new(src, non_blocking, rest)
    if type(src) is not SimTensor and target_type == "sim":
        return _h2d_new(src, non_blocking, rest)
    if type(src) is SimTensor:  # sim -> sim (dtype/layout change): an ordinary kernel
        return _launch(func, args, {**rest, **({"device": target} if target else {})},
                       effects(func))
    return _host_op(func, args, kwargs)


def _d2h_new(src: SimTensor, non_blocking: bool, rest: dict) -> torch.Tensor:
    """``x.to("cpu")``: a copy kernel on the current stream into new host memory."""
    dev = current_device()
    stream = dev.current
    dtype = rest.get("dtype") or src.dtype
    host = poisoned_empty(src.shape, _contig_stride(src.shape), dtype)
    if non_blocking:
        host = hostmem.register(host, f"pinned {str(dtype)[6:]}{list(src.shape)} (to cpu)")
    dst_acc = hostmem.access_of(host)
    sbuf = src._buf

    def kernel() -> None:
        host.copy_(sbuf)

    dev.enqueue(OpRecord(stream.sid, "copy D2H", [access(src)], [dst_acc[0]] if dst_acc else [],
                         user_frame(4), kind="copy", fn=kernel))
    if not non_blocking:
        dev.sync_current("blocking D2H (.cpu/.tolist)")
    return host


def _h2d_new(src: torch.Tensor, non_blocking: bool, rest: dict) -> SimTensor:
    dev = current_device()
    dtype = rest.get("dtype") or src.dtype
    out = new_storage(dev, src.shape, _contig_stride(src.shape), dtype, user_frame(4),
                      "copy H2D")
    _h2d_into(dev, out, src, non_blocking)
    return out


def _h2d_into(dev, dst: SimTensor, src: torch.Tensor, non_blocking: bool) -> None:
    pinned = hostmem.access_of(src)
    if non_blocking and pinned is not None:
        source = src.detach()  # read when the copy executes: the staging-buffer reuse race
        reads = [pinned[0]]
        dev.trace.storage_names.setdefault(pinned[0][0], pinned[1])
    else:
        source = src.detach().clone()  # pageable: CUDA stages it before returning
        reads = []
    dbuf = dst._buf
    if pinned is not None and not non_blocking:
        dev.note_host_access(pinned[0], False, pinned[1], user_frame(4))

    def kernel() -> None:
        dbuf.copy_(source)

    dev.enqueue(OpRecord(dev.current.sid, "copy H2D", reads, [access(dst)], user_frame(4),
                         kind="copy", fn=kernel))
    if not non_blocking:
        # torch's blocking H2D is a copy plus a sync of the current stream
        # (memcpy_and_sync): the host waits for everything queued there, as on CUDA.
        dev.sync_current("blocking H2D")


def _contig_stride(shape) -> Tuple[int, ...]:
    stride, acc = [], 1
    for s in reversed(list(shape)):
        stride.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(stride))


def _copy_(func, args, kwargs) -> Any:
    dst, src = args[0], args[1]
    non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking", False))
    dev = current_device()
    d_sim, s_sim = type(dst) is SimTensor, type(src) is SimTensor
    if d_sim and s_sim:
        return _launch(func, (dst, src), {}, effects(func))
    if d_sim:
        if src.dim() > 0 and src.shape != dst.shape:
            src = src.expand(dst.shape)
        _h2d_into(dev, dst, src, non_blocking)
        return dst
    if s_sim:
        pinned = hostmem.access_of(dst)
        dbuf, sbuf = dst, src._buf

        def kernel() -> None:
            dbuf.copy_(sbuf)

        dev.enqueue(OpRecord(dev.current.sid, "copy D2H", [access(src)],
                             [pinned[0]] if pinned else [], user_frame(3), kind="copy",
                             fn=kernel))
        if pinned is not None:
            dev.trace.storage_names.setdefault(pinned[0][0], pinned[1])
        if not (non_blocking and pinned is not None):
            dev.sync_current("blocking D2H (copy_ into pageable memory)")
        return dst
    return _host_op(func, args, kwargs)


def _local_scalar_dense(func, args, kwargs) -> Any:
    src = args[0]
    if type(src) is not SimTensor:
        return _host_op(func, args, kwargs)
    dev = current_device()
    box: List[Any] = []
    sbuf = src._buf

    def kernel() -> None:
        box.append(sbuf.item())

    dev.enqueue(OpRecord(dev.current.sid, "copy D2H (item)", [access(src)], [], user_frame(3),
                         kind="copy", fn=kernel))
    dev.sync_current("blocking D2H (.item)")
    return box[0]


def _empty(func, args, kwargs) -> Any:
    """Allocation only: no kernel runs, so device memory holds poison until written."""
    kwargs = dict(kwargs)
    pinned = kwargs.pop("pin_memory", False)
    device = kwargs.get("device")
    if func in (aten.new_empty.default, aten.new_empty_strided.default) and device is None:
        device = args[0].device
        kwargs.setdefault("dtype", args[0].dtype)
    if device is not None and torch.device(device).type == "sim":
        kwargs["device"] = torch.device("cpu")
        layout = func(*_unwrap(args), **kwargs)  # the CPU factory gives shape and strides
        return new_storage(current_device(), layout.shape, layout.stride(), layout.dtype,
                           user_frame(3), func.__name__)
    out = func(*args, **kwargs)
    # Fresh pinned memory is as undefined as device memory; poison it so a host read
    # before the copy lands is loud and deterministic.
    return hostmem.register(poison_fill(out)) if pinned else out


def _empty_like(func, args, kwargs) -> Any:
    """``empty_like`` allocates like ``empty``: on the device it is poison, not zeros.

    (Routed through ``_launch`` it would run CPU ``empty_like`` as a kernel and hand back
    whatever the CPU allocator had -- often zeros, hiding the empty-for-zeros bug.)
    """
    src = args[0]
    device = kwargs.get("device")
    on_sim = torch.device(device).type == "sim" if device is not None else type(src) is SimTensor
    kw = dict(kwargs)
    pinned = kw.pop("pin_memory", False)
    kw["device"] = torch.device("cpu")
    base = src._buf if type(src) is SimTensor else src
    buf = func(base, *args[1:], **kw)
    if on_sim:
        return new_storage(current_device(), buf.shape, buf.stride(), buf.dtype,
                           user_frame(3), func.__name__)
    return hostmem.register(poison_fill(buf)) if pinned else buf


def _noop_first(func, args, kwargs) -> Any:
    return args[0] if args else None


def _record_stream(func, args, kwargs) -> Any:
    # ``SimTensor.record_stream`` handles the method; the aten spelling only ever carries
    # a ``torch.Stream``, which cannot name a simulated stream (``_note_record_stream``
    # ignores what is not one of ours).
    if type(args[0]) is SimTensor:
        _note_record_stream(args[0], args[1], user_frame(3))
    return None


def _pin(func, args, kwargs) -> Any:
    return hostmem.register(args[0].clone())


def _is_pinned(func, args, kwargs) -> Any:
    return hostmem.lookup(args[0]) is not None


_SPECIAL = {
    aten.empty.memory_format: _empty,
    aten.empty_strided.default: _empty,
    aten.new_empty.default: _empty,
    aten.new_empty_strided.default: _empty,
    aten.empty_like.default: _empty_like,
    aten._to_copy.default: _to_copy,
    aten.copy_.default: _copy_,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.lift_fresh.default: _noop_first,
    aten.detach_.default: _noop_first,
    aten.record_stream.default: _record_stream,
    aten._pin_memory.default: _pin,
    aten.is_pinned.default: _is_pinned,
}


class SimMode(TorchDispatchMode):
    """Routes factories naming ``device="sim"`` (and host ops on pinned memory) to ``handle``."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return handle(func, args, kwargs or {})

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
