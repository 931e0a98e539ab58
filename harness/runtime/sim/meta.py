"""Meta runs: an op's output layout without computing it, for ops queued behind pending
work (their outputs are allocated now, their kernels run later).

``meta_outputs`` answers ``DATA_DEPENDENT`` for ops whose output shape depends on data
(or that have no meta kernel): the simulator syncs and runs those at once, as CUDA does.
Results are cached by the arguments' layouts.
"""
from __future__ import annotations

from typing import Any, Dict, NamedTuple

import torch

from harness.runtime.sim.tensor import SimTensor, layout_key

# (``func._op``, the arguments' keys) -> outputs. ``_op`` rather than ``func``: the
# overload's hash is Python code, its ``_op``'s is not (and it is what that hash hashes).
_META_CACHE: Dict[Any, Any] = {}
DATA_DEPENDENT = object()
_MISS = object()


class Meta(NamedTuple):
    shape: tuple
    stride: tuple
    dtype: torch.dtype


def _meta_key(v: Any) -> Any:
    if type(v) is SimTensor:
        return layout_key(v)
    if isinstance(v, torch.Tensor):  # a host tensor (cpu) is a different argument
        return (v.shape, v.stride(), v.dtype, v.is_cpu)
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


def meta_outputs(func, args: tuple, kwargs: dict) -> Any:
    """``Meta`` (or a sequence of optional ``Meta``) for the op's outputs, or
    ``DATA_DEPENDENT``; a user error (shapes, dtypes) raises here, on the host."""
    try:
        key = (func._op, tuple([_meta_key(a) for a in args]),
               tuple(sorted((k, _meta_key(v)) for k, v in kwargs.items())) if kwargs else ())
        out = _META_CACHE.get(key, _MISS)  # (hashed once)
    except TypeError:  # an unhashable argument: not cached
        key, out = None, _MISS
    if out is not _MISS:
        return out
    if not func._schema.returns:  # writes its arguments only (a fused kernel's shape)
        return ()
    margs = tuple(_to_meta(a) for a in args)
    mkwargs = {k: _to_meta(v) for k, v in kwargs.items()}
    if "device" in mkwargs:
        mkwargs["device"] = torch.device("meta")
    try:
        with torch._C._DisableTorchDispatch():
            out = func(*margs, **mkwargs)
        out = _summary(out) if _all_tensors(out) else DATA_DEPENDENT
    except Exception as exc:  # data-dependent shape or no meta kernel: run it for real
        if is_user_error(exc):
            raise
        out = DATA_DEPENDENT
    if key is not None:
        _META_CACHE[key] = out
    return out


def is_user_error(exc: Exception) -> bool:
    """Shape/dtype errors are raised at the call, on the host, as CUDA does."""
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


def _summary(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return Meta(tuple(out.shape), out.stride(), out.dtype)
    return type(out)(None if x is None else Meta(tuple(x.shape), x.stride(), x.dtype)
                     for x in out)
