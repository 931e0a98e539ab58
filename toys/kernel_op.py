"""One way to declare a fused kernel to the dispatcher, for every ``specrace::`` op.

The op is declared like a native kernel: its schema says what it writes (``Tensor(a!)``),
which is all a dispatch-level tracer needs -- one read/write set at one point of one
stream, as for a fused kernel's single launch. (``torch.library.custom_op`` would add
Python autograd and version-counter hops, ~100 us a call.) Each op writes its arguments
only, so its meta implementation computes nothing. FRAGMENT: a second import of a module
declaring ops must not fail the definition.
"""
from __future__ import annotations

from typing import Callable

import torch

_LIB = torch.library.Library("specrace", "FRAGMENT")


def declare_kernel(schema: str, body: Callable[..., None]) -> None:
    """Declare ``specrace::<schema>`` with ``body`` as its implementation. Pass a body that
    looks its kernel up when the op runs (``lambda *a: _kernel(*a)``): a patched kernel (a
    mutation) then runs."""
    name = schema.split("(", 1)[0]
    _LIB.define(schema)
    _LIB.impl(name, body, "CompositeExplicitAutograd")
    _LIB.impl(name, lambda *a: None, "Meta")
