"""Pinned host memory in a process that has installed the simulator.

Renaming PrivateUse1 to ``sim`` is permanent for the process, and from then on torch
treats PrivateUse1 as *the* accelerator (``at::getAccelerator`` prefers a registered
PrivateUse1). A Python backend cannot provide the pinned-memory allocator torch then asks
it for, so, measured on the H200 (torch 2.11) and on CPU torch 2.13:

* ``t.pin_memory()`` raises ``NotImplementedError ... getPinnedMemoryAllocator``;
* ``t.is_pinned()`` answers False for memory that *is* pinned (the CUDA host allocator
  still serves ``torch.empty(..., pin_memory=True)`` and non_blocking D2H copies);
* ``torch.tensor(data, pin_memory=True)`` pins inside C++, past every dispatch mode, so the
  simulator never sees it.

The fix, one per backend:

* **CUDA** (only when the simulator is installed in this process): ``CudaPinning``, a
  torch-function mode the CUDA runtime keeps on, sends ``pin_memory()`` and
  ``is_pinned()`` to CUDA explicitly; ``cuda_is_pinned`` is the same question for the
  harness's own checks.
* **Simulator**: ``torch.tensor`` is wrapped once at install; with ``pin_memory=True`` on a
  running simulator it builds the tensor unpinned and pins it through ``pin_memory()``,
  which the simulator's dispatch handler does see (and registers as watched pinned
  memory).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten
_CUDA = torch.device("cuda")


def sim_installed() -> bool:
    """Has this process renamed PrivateUse1 to ``sim``?"""
    return torch._C._get_privateuse1_backend_name() == "sim"


def needs_cuda_pinning() -> bool:
    """Must CUDA be named explicitly for pinned memory in this process?"""
    return sim_installed() and torch.backends.cuda.is_built()


def cuda_is_pinned(t: torch.Tensor) -> bool:
    """``t.is_pinned()``, asked of CUDA even when PrivateUse1 is the accelerator."""
    if t.device.type != "cpu":
        return False
    if needs_cuda_pinning():
        return bool(aten.is_pinned.default(t, _CUDA))
    try:
        return t.is_pinned()
    except (RuntimeError, NotImplementedError):  # no accelerator can pin here
        return False


class CudaPinning(TorchFunctionMode):
    """``pin_memory()`` / ``is_pinned()`` on CUDA in a process with the simulator."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.pin_memory and args[0].device.type == "cpu":
            t = args[0]
            return t if cuda_is_pinned(t) else aten._pin_memory.default(t, _CUDA)
        if func is torch.Tensor.is_pinned:
            return cuda_is_pinned(args[0])
        return func(*args, **kwargs)


# --- the simulator's torch.tensor ----------------------------------------------------------

_SIM_ACTIVE: Callable[[], bool] = lambda: False  # set by the simulator at install


def install_sim_tensor_factory(active: Callable[[], bool]) -> None:
    """Wrap ``torch.tensor`` once: pinned requests on a running simulator are pinned
    through ``pin_memory()``; every other call is the original, unchanged."""
    global _SIM_ACTIVE
    _SIM_ACTIVE = active
    original = torch.tensor
    if getattr(original, "_specrace_wrapper", False):
        return

    @functools.wraps(original)
    def tensor(*args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs.get("pin_memory") and _SIM_ACTIVE():
            kwargs = dict(kwargs)
            del kwargs["pin_memory"]
            return original(*args, **kwargs).pin_memory()
        return original(*args, **kwargs)

    tensor._specrace_wrapper = True
    torch.tensor = tensor
    from seams import process
    process.note("torch.tensor-pinning")
