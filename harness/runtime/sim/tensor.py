"""``SimTensor``: a tensor on the simulated device, and its storage plumbing.

A ``SimTensor`` is a wrapper subclass whose ``_buf`` is a real CPU tensor -- the device
memory. Every aten op that touches one lands in the simulator's backend
(``sim/dispatch.py``, classified by the shared ``ops`` ladder). Device memory comes from
the caching allocator (``allocator.py``): every wrapper on a storage holds its
``Storage`` handle, so the storage is freed when the last one dies, and its block may be
handed to the next allocation on its stream.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Tuple

import torch

from harness.runtime import hostmem
from harness.runtime.trace import tensor_range, user_frame
from harness.runtime.sim.allocator import poison_fill

if TYPE_CHECKING:
    from harness.runtime.ops import Backend

SIM: Optional[torch.device] = None  # torch.device("sim", 0), set by install()
BACKEND: Optional[Backend] = None  # the simulator's ops.Backend (sim/dispatch.py), set by install()


def poisoned_empty(shape, stride, dtype) -> torch.Tensor:
    """Uninitialised *host* memory (device memory comes from the allocator)."""
    return poison_fill(torch.empty_strided(shape, stride, dtype=dtype))


# (cls, size, strides, storage_offset, memory_format, dtype, layout, device): positional,
# as torch's argument parser takes them fastest -- a wrapper is made for every op.
_wrapper = torch.Tensor._make_wrapper_subclass
_STRIDED = torch.strided


class SimTensor(torch.Tensor):
    """A tensor on the simulated device. ``_buf`` is its (CPU) device memory."""

    # Slots, not the instance dict: a wrapper is made for every op, and these are read for
    # every kernel argument (~0.05 of the wrapper floor per op in ``bench runtime``).
    # ``_buf``: the device memory; ``_sid``: its storage id; ``_owner``: the allocator's
    # ``Storage`` handle (None: an empty tensor, no block); ``_acc`` / ``_mk``: ``access``
    # and ``layout_key``, cached (None until asked). Every constructor sets all five.
    __slots__ = ("_buf", "_sid", "_owner", "_acc", "_mk")

    @staticmethod
    def __new__(cls, buf: torch.Tensor, sid: int):
        r = _wrapper(cls, buf.size(), buf.stride(), buf.storage_offset(), None, buf.dtype,
                     _STRIDED, SIM)
        r._buf = buf
        r._sid = sid
        r._acc = r._mk = r._owner = None
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # (one is a SimTensor; for ``kwargs``, see ``SimMode.__torch_dispatch__``)
        return BACKEND.dispatch(func, args, {} if kwargs is None else kwargs, True)

    def __deepcopy__(self, memo: dict) -> "SimTensor":
        # torch's deep copy of a wrapper subclass clones it, then deep-copies the fields
        # over the clone -- its storage id, device memory and ``Storage`` handle (with the
        # allocator and its trace) -- leaving a second owner of the first's storage id.
        # The clone alone is the copy: a kernel on the current stream, as on CUDA.
        out = memo[id(self)] = self.clone()
        return out

    def tolist(self):
        return self.cpu().tolist()

    def numpy(self, *a, **k):
        raise TypeError("can't convert sim device type tensor to numpy. Use Tensor.cpu() first.")

    def record_stream(self, stream) -> None:
        note_record_stream(self, stream, user_frame(2))

    @property
    def is_cuda(self) -> bool:
        # One rule: the simulator is the GPU it stands for. Code under test that asks a
        # tensor whether it is on a GPU (sglang's record_stream_each, its async D2H, the
        # fused EAGLE paths) takes its GPU path, and ``record_stream`` above is the
        # allocator's deferred free. (``device.type`` stays "sim": code that names the
        # device by type sees the simulator -- docs/limits.md.)
        return True

    def __repr__(self, *, tensor_contents=None) -> str:  # never syncs, never reads
        return f"SimTensor({list(self.shape)}, {self.dtype}, sid={self._sid})"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)


def _owned(buf: torch.Tensor, owner) -> SimTensor:
    """The first tensor on a fresh storage (its access is the allocator's)."""
    if owner is None:
        t = SimTensor(buf, hostmem.new_sid())
    else:
        t = SimTensor(buf, owner.sid)
        t._acc = owner.access
    t._owner = owner
    return t


def _placed(buf: torch.Tensor, owner, shape, stride, dtype) -> SimTensor:
    """``_owned`` for a storage the allocator just placed with this layout (offset 0):
    the wrapper is made from the layout the caller already has, not asked of ``buf``."""
    if owner is None:
        return _owned(buf, None)
    t = _wrapper(SimTensor, shape, stride, 0, None, dtype, _STRIDED, SIM)
    t._buf = buf
    t._sid = owner.sid
    t._acc = owner.access
    t._owner = owner
    t._mk = None
    return t


def new_storage(dev, shape, stride, dtype, frame, op: Optional[str] = None) -> SimTensor:
    """A fresh device tensor (uninitialised: poison, or a reused block's old data).
    ``op`` names it in reports (kernel outputs are named by the backend)."""
    buf, owner = dev.allocator.storage(shape, stride, dtype, frame, op=op)
    return _placed(buf, owner, shape, stride, dtype)


def adopt(dev, result: torch.Tensor, frame, op: str) -> SimTensor:
    """A kernel result computed at once (the idle-stream fast path), moved into a block;
    ``op`` names it in reports."""
    shape, dtype = result.shape, result.dtype
    if result.storage_offset() == 0 and result.is_contiguous():
        # most results: the block's layout is the result's own
        stride = result.stride()
        # (positional: asked for most ops, and a keyword call costs its name matching)
        buf, owner = dev.allocator.storage(shape, stride, dtype, frame, 0, False,
                                           result.nbytes, True, result, op)
        if owner is not None and buf is not result:
            buf.copy_(result)
        return _placed(buf, owner, shape, stride, dtype)
    return _owned(*dev.allocator.adopt(result, frame, op))


def alias(buf: torch.Tensor, base: Any) -> SimTensor:
    """A view: new metadata over ``base``'s storage (and its hold on the block)."""
    if type(base) is not SimTensor:
        return _owned(buf, None)
    t = SimTensor(buf, base._sid)
    t._owner = base._owner
    return t


def note_record_stream(t: SimTensor, stream, frame) -> None:
    owner = t._owner
    if owner is not None and getattr(stream, "_dev", None) is owner.allocator.dev:
        owner.allocator.record_stream(owner, stream, frame)


def access(t: SimTensor) -> Tuple[int, int, int]:
    """(sid, lo, hi) of ``t``; cached, since a tensor's layout only changes through an
    in-place view op (which drops the cache: ``relaid``)."""
    acc = t._acc
    if acc is None:
        lo, hi = tensor_range(t._buf)
        acc = t._acc = (t._sid, lo, hi)
    return acc


def device_access(t: torch.Tensor) -> Optional[Tuple[int, int, int]]:
    """``access`` of a device tensor, None for a host one (``ops.data_accesses`` asks it of
    every kernel argument)."""
    if type(t) is not SimTensor:
        return None
    return t._acc or access(t)


def layout_key(t: SimTensor) -> tuple:
    """(shape, stride, dtype, is_cpu) of ``t``, the meta cache's key for it (``meta.py``);
    cached as ``access`` is."""
    key = t._mk
    if key is None:
        key = t._mk = (t.shape, t.stride(), t.dtype, False)
    return key


def relaid(t: SimTensor) -> None:
    """``t``'s layout changed (an in-place view op): forget what was cached from it."""
    t._acc = t._mk = None


# Argument plumbing (one level deep is all aten needs; pytree was 30% of the spike's time)

def unwrap(v: Any) -> Any:
    if type(v) is SimTensor:
        return v._buf
    if isinstance(v, (list, tuple)):  # (a tensor list: the one level aten nests)
        return type(v)([x._buf if type(x) is SimTensor else unwrap(x) for x in v])
    if isinstance(v, torch.device) and v.type == "sim":
        return torch.device("cpu")
    if isinstance(v, dict):
        return {k: unwrap(x) for k, x in v.items()}
    return v


NESTED = (list, tuple, dict, torch.device)  # what ``unwrap`` looks into


def unwrap_call(args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
    """``unwrap`` of a call's arguments, without a generic call per plain argument (asked
    for every op)."""
    out = []
    for v in args:
        if type(v) is SimTensor:
            out.append(v._buf)
        elif isinstance(v, NESTED):
            out.append(unwrap(v))
        else:
            out.append(v)
    return tuple(out), ({k: unwrap(v) for k, v in kwargs.items()} if kwargs else kwargs)


def kernel_arg(v: Any) -> Any:
    """An argument as a queued kernel keeps it: device memory for a device tensor, and a
    copy, taken now, of a host tensor (a launch argument: a later host write is not seen)."""
    if type(v) is SimTensor:
        return v._buf
    if isinstance(v, torch.Tensor):
        return v.clone()
    if isinstance(v, (list, tuple)):
        return type(v)(kernel_arg(x) for x in v)
    if isinstance(v, torch.device) and v.type == "sim":
        return torch.device("cpu")
    if isinstance(v, dict):
        return {k: kernel_arg(x) for k, x in v.items()}
    return v
