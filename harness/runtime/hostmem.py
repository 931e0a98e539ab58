"""Pinned host memory that the detector can watch.

A host read of a pinned buffer that a non_blocking D2H copy is still filling is the bug
class CSAN cannot see (it tracks device tensors only). Both backends therefore register
every pinned host allocation here, and report host accesses to it:

* ops that go through aten dispatch are reported by the backend's dispatch mode, which
  asks ``lookup`` whether a CPU tensor lives in pinned memory;
* ``tolist()`` / ``numpy()`` read memory without dispatching, so pinned tensors are made
  ``PinnedHostTensor`` -- a plain CPU tensor whose ``__torch_function__`` reports those
  reads and keeps views of pinned memory pinned.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from .trace import Frame, tensor_range, user_frame

# Storage ids are numbered per run: ``save()`` (a runtime opening) starts a fresh count and
# ``restore()`` puts the outer run's back, so the same run gives the same trace also when it
# is not the first in its process (pytest, the API).
_sid_counter = itertools.count(1)


def new_sid() -> int:
    """A fresh storage id (never reused within a run, unlike data pointers)."""
    return next(_sid_counter)


# storage data_ptr -> (sid, name, tensor). The entry holds the tensor so its memory cannot
# be freed and handed to an unrelated tensor while registered; ``clear()`` ends a run.
_PINNED: Dict[int, Tuple[int, str, torch.Tensor]] = {}

# Set by the active backend: recorder(access, write, name, frame) -> None
RECORDER: Optional[Callable[..., None]] = None


def register(t: torch.Tensor, name: str = "") -> "PinnedHostTensor":
    """Mark ``t`` (a CPU tensor standing for pinned memory) as watched; return it wrapped."""
    from . import native  # native code that writes pinned memory reports it from now on
    native.ensure_wrapped()
    storage = t.untyped_storage()
    ptr = storage.data_ptr()
    if ptr not in _PINNED:
        _PINNED[ptr] = (new_sid(), name or f"pinned {str(t.dtype)[6:]}{list(t.shape)}", t)
    if type(t) is PinnedHostTensor:
        return t
    return t.as_subclass(PinnedHostTensor)


def lookup(t: torch.Tensor) -> Optional[Tuple[int, str]]:
    """(sid, name) when ``t`` lives in watched pinned memory, else None."""
    if not _PINNED or t.device.type != "cpu":
        return None
    hit = _PINNED.get(t.untyped_storage().data_ptr())
    return None if hit is None else (hit[0], hit[1])


def access_of(t: torch.Tensor) -> Optional[Tuple[Tuple[int, int, int], str]]:
    hit = lookup(t)
    if hit is None:
        return None
    lo, hi = tensor_range(t)
    return (hit[0], lo, hi), hit[1]


def note_host(t: torch.Tensor, write: bool, frame: Optional[Frame] = None) -> None:
    """Report a host read/write of ``t`` if it is watched pinned memory."""
    rec = RECORDER
    if rec is None:
        return
    acc = access_of(t)
    if acc is not None:
        rec(acc[0], write, acc[1], frame or user_frame(3))


def note_host_op(func, args: tuple, kwargs: dict, record, depth: int = 3) -> None:
    """Report the pinned-memory arguments an aten op on host tensors reads or writes
    (from its schema) to ``record(access, write, name, frame)``. Shared by both backends'
    dispatch modes; callers skip metadata-only ops (views), which touch no data."""
    from .schema import arg_value, effects, iter_tensors
    if not _PINNED:
        return
    frame = None
    for key, is_write in effects(func).tensor_args:
        for t in iter_tensors(arg_value(args, kwargs, key)):
            acc = access_of(t)
            if acc is not None:
                frame = frame or user_frame(depth)
                record(acc[0], is_write, acc[1], frame)


def clear() -> None:
    _PINNED.clear()


Saved = Tuple[Dict[int, Tuple[int, str, torch.Tensor]], Any]


def save() -> Saved:
    """Detach the current registry and storage-id count: a run (nested or not) starts
    empty, numbering from 1; ``restore`` puts the outer state back."""
    global _sid_counter
    saved = (dict(_PINNED), _sid_counter)
    _PINNED.clear()
    _sid_counter = itertools.count(1)
    return saved


def restore(saved: Saved) -> None:
    global _sid_counter
    pinned, _sid_counter = saved
    _PINNED.clear()
    _PINNED.update(pinned)


_HOST_READS = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.__array__}


class PinnedHostTensor(torch.Tensor):
    """A CPU tensor in (real or simulated) pinned memory whose host reads are reported."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_READS and args and isinstance(args[0], torch.Tensor):
            note_host(args[0], False, user_frame(2))
        with torch._C.DisableTorchFunctionSubclass():
            res = func(*args, **kwargs)
        return _keep_pinned(res)


def _keep_pinned(res: Any) -> Any:
    if isinstance(res, torch.Tensor):
        if type(res) is torch.Tensor and lookup(res) is not None:
            return res.as_subclass(PinnedHostTensor)
        return res
    if isinstance(res, (tuple, list)) and res and isinstance(res[0], torch.Tensor):
        return type(res)(_keep_pinned(r) for r in res)
    return res
