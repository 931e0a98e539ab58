"""``torch.inference_mode`` on the simulated device.

The mode's rules are the host program's, and torch checks them on the wrappers
(``SimTensor``): a tensor made inside the mode is an inference tensor, which refuses
in-place updates outside it; a view has its base's inference-ness. Device memory (every
wrapper's ``_buf``) is never an inference tensor: it outlives the mode, and kernels -- and
the next owner of its block -- write it in place after the program has left it
(``allocator._device_memory``). What the device writes, it writes as the hardware does,
outside the mode's checks (``host_write``).
"""
from __future__ import annotations

from typing import Any

import torch

from harness.runtime import ops
from harness.runtime.sim.tensor import alias, unwrap_call

inference_mode = torch.is_inference_mode_enabled  # (asked for every view: one C call)
_InferenceMode = torch._C._InferenceMode


def view_base(op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
    """The argument a view op's outputs alias. The schema names it (``return_alias``),
    but for a list of views (``split``, ``unbind``: ``Tensor(a)[]``), whose annotation sits
    on the element type and is not read there: then it is the first argument, the one
    tensor such a view op takes. (Taken for a fresh storage, the pieces hid every race
    through them, and let the base's block go back to the pool under them.)"""
    owner = op.effects.return_alias
    if not owner or owner[0] is None:
        return args[0]
    return args[owner[0]] if type(owner[0]) is int else kwargs.get(owner[0])


def view_in_inference_mode(op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
    """A view made inside the mode: its device memory as any other (a dtype view made in
    the mode would be an inference tensor), its wrapper with its base's inference-ness, as
    torch gives every view. A view of a normal tensor is a normal tensor, whose version
    counter autograd then shares with the base -- which a wrapper made in the mode refuses:
    "Cannot set version_counter for inference tensor". (Outside the mode, a view of an
    inference tensor comes out normal where torch's stays inference and refuses in-place
    updates: not modelled, as it would cost every view a second question.)"""
    base = view_base(op, args, kwargs)
    bargs, bkwargs = unwrap_call(args, kwargs)
    with _InferenceMode(False):
        out = op.func._op(*bargs, **bkwargs)
    with _InferenceMode(base.is_inference()):
        if isinstance(out, torch.Tensor):
            return alias(out, base)
        return type(out)(alias(o, base) for o in out)


def host_write(host: torch.Tensor, src: torch.Tensor) -> None:
    """A D2H copy landing in host memory, as the copy engine writes it. An inference
    tensor refuses in-place updates outside the mode, but that is torch's check of the host
    program, made when the copy was issued -- and the copy may land after the program has
    left the mode (inside it, every in-place update is allowed)."""
    with _InferenceMode(True):
        host.copy_(src)
