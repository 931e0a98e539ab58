"""Pinned host memory that the detector can watch.

A host read of a pinned buffer that a non_blocking D2H copy is still filling is the bug
class CSAN cannot see (it tracks device tensors only). Both backends therefore register
every pinned host allocation here, and report host accesses to it:

* ops that go through aten dispatch are reported by the backend's dispatch mode, which
  asks ``lookup`` whether a CPU tensor lives in pinned memory;
* ``tolist()`` reads memory without dispatching, so pinned tensors are made
  ``PinnedHostTensor`` -- a plain CPU tensor whose ``__torch_function__`` reports those
  reads and keeps views of pinned memory pinned;
* ``numpy()`` gives a ``PinnedArray`` (``pinned_numpy``): the same memory, whose every
  later read and write through numpy is reported -- servers take that view once and use
  it every step.
"""
from __future__ import annotations

from typing import Any, Iterator, Optional, Tuple

import torch

from seams.context import current
from harness.runtime import native, pinned_numpy
from harness.runtime.trace import Frame, tensor_range, user_frame
from seams.vocab import shaped_name

# The registry and the storage-id count are the current run's (``seams.context``): a
# runtime opening starts both afresh, so the same run gives the same trace also when it is
# not the first in its process (pytest, the API). A registry entry is
# data_ptr -> (sid, name, tensor): it holds the tensor so its memory cannot be freed and
# handed to an unrelated tensor while registered. The run's ``recorder(access, write,
# name, frame)`` is set by the backend.


def new_sid() -> int:
    """A fresh storage id (never reused within a run, unlike data pointers)."""
    return next(current().sids)


def sid_source() -> Iterator[int]:
    """The current run's storage-id count itself, for a device that lives in this run
    and takes an id per allocation (``next()`` of it is ``new_sid()``, one frame less)."""
    return current().sids


def watching() -> bool:
    """Is any pinned memory registered in this run? (The cheap test hot paths ask.)"""
    return bool(current().pinned)


# Where is ``t``, asked of a ``PinnedHostTensor`` without a trip through its
# ``__torch_function__`` per question (its device, storage, offset, sizes, strides...).
_METADATA_ONLY = torch._C.DisableTorchFunctionSubclass


def register(t: torch.Tensor, name: str = "") -> "PinnedHostTensor":
    """Mark ``t`` (a CPU tensor standing for pinned memory) as watched; return it wrapped."""
    native.ensure_wrapped(note_host)  # native code writing pinned memory reports it now on
    pinned = current().pinned
    with _METADATA_ONLY():
        ptr = t.untyped_storage().data_ptr()
        if ptr not in pinned:
            pinned[ptr] = (new_sid(), name or f"pinned {shaped_name(t.dtype, t.shape)}", t)
    if type(t) is PinnedHostTensor:
        return t
    return t.as_subclass(PinnedHostTensor)


def lookup(t: torch.Tensor) -> Optional[Tuple[int, str]]:
    """(sid, name) when ``t`` lives in watched pinned memory, else None."""
    pinned = current().pinned
    if not pinned:
        return None
    with _METADATA_ONLY():
        if t.device.type != "cpu":
            return None
        hit = pinned.get(t.untyped_storage().data_ptr())
    return None if hit is None else (hit[0], hit[1])


def access_of(t: torch.Tensor) -> Optional[Tuple[Tuple[int, int, int], str]]:
    hit = lookup(t)
    if hit is None:
        return None
    with _METADATA_ONLY():
        lo, hi = tensor_range(t)
    return (hit[0], lo, hi), hit[1]


def note_host(t: torch.Tensor, write: bool, frame: Optional[Frame] = None) -> None:
    """Report a host read/write of ``t`` if it is watched pinned memory."""
    rec = current().recorder
    if rec is None:
        return
    acc = access_of(t)
    if acc is not None:
        rec(acc[0], write, acc[1], frame or user_frame(3))


def note_host_op(func, args: tuple, kwargs: dict, record, depth: int = 3) -> None:
    """Report the pinned-memory arguments an aten op on host tensors reads or writes
    (from its schema) to ``record(access, write, name, frame)``. Shared by both backends'
    dispatch modes; callers skip metadata-only ops (views), which touch no data."""
    from harness.runtime.schema import arg_value, effects, iter_tensors
    if not current().pinned:
        return
    frame = None
    for key, is_write in effects(func).tensor_args:
        for t in iter_tensors(arg_value(args, kwargs, key)):
            acc = access_of(t)
            if acc is not None:
                frame = frame or user_frame(depth)
                record(acc[0], is_write, acc[1], frame)


def clear() -> None:
    """Forget this run's pinned registry."""
    current().pinned.clear()


_HOST_READS = {torch.Tensor.tolist, torch.Tensor.__array__}


class PinnedHostTensor(torch.Tensor):
    """A CPU tensor in (real or simulated) pinned memory whose host reads are reported."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_READS and args and isinstance(args[0], torch.Tensor):
            note_host(args[0], False, user_frame(2))
        with torch._C.DisableTorchFunctionSubclass():
            res = func(*args, **kwargs)
        if func is torch.Tensor.numpy:
            return _numpy_view(args[0], res)
        return _keep_pinned(res)


def _numpy_view(t: torch.Tensor, array: Any) -> Any:
    """``t.numpy()`` as a ``PinnedArray`` when ``t`` is watched (reads and writes through
    it reported from now on), else as numpy made it."""
    with _METADATA_ONLY():
        base = t.untyped_storage().data_ptr()
    hit = current().pinned.get(base)
    if hit is None:
        return array
    return pinned_numpy.view_of(array, (hit[0], hit[1], base))


def _keep_pinned(res: Any) -> Any:
    if isinstance(res, torch.Tensor):
        if type(res) is torch.Tensor and lookup(res) is not None:
            return res.as_subclass(PinnedHostTensor)
        return res
    if isinstance(res, (tuple, list)) and res and isinstance(res[0], torch.Tensor):
        return type(res)(_keep_pinned(r) for r in res)
    return res
