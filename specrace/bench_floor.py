"""The floors under ``bench runtime``'s simulator figure, measured in the same run.

Every op on the simulated device enters Python once, through ``__torch_dispatch__``. Two
do-nothing versions of that entry price the design itself on the same op mix:

* ``mode``    -- a ``TorchDispatchMode`` that only calls the op (plain CPU tensors);
* ``wrapper`` -- a wrapper subclass on the ``sim`` device that only unwraps its
  arguments, runs the op on the inner CPU tensors and wraps the result: what any
  simulator built on Python dispatch pays before it simulates anything.

The simulator's own cost is its figure minus the wrapper floor.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_CPU = torch.device("cpu")


class _NoOpMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


# as the simulator's mode (sim/dispatch.py): without TorchDispatchMode's dynamo wrapper
_NoOpMode.__torch_dispatch__ = getattr(_NoOpMode.__torch_dispatch__, "__wrapped__",
                                       _NoOpMode.__torch_dispatch__)


def _inner(v: Any) -> Any:
    if type(v) is BareWrapper:
        return v._inner
    if isinstance(v, (list, tuple)):
        return type(v)(_inner(x) for x in v)
    if isinstance(v, torch.device):
        return _CPU
    return v


class BareWrapper(torch.Tensor):
    """A tensor on the ``sim`` device that does nothing but unwrap, run and rewrap."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        r = torch.Tensor._make_wrapper_subclass(
            cls, inner.size(), strides=inner.stride(), storage_offset=inner.storage_offset(),
            dtype=inner.dtype, device=torch.device("sim", 0), requires_grad=False)
        r._inner = inner
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        out = func(*_inner(args), **{k: _inner(v) for k, v in (kwargs or {}).items()})
        if isinstance(out, torch.Tensor):
            return BareWrapper(out)
        if isinstance(out, (list, tuple)):
            return type(out)(BareWrapper(o) if isinstance(o, torch.Tensor) else o for o in out)
        return out


def no_op_mode() -> TorchDispatchMode:
    return _NoOpMode()


def bare_wrapper(t: torch.Tensor) -> torch.Tensor:
    from harness.runtime.sim import install
    install()  # the ``sim`` device type
    return BareWrapper(t)
