"""The vocabulary bitmask a grammar hands the sampler (xgrammar's format): allocation and
the masking kernel's stand-in, shared by every engine over the toy world.

Bitmask format (xgrammar): int32 ``(rows, ceil(V/32))``; token ``t`` is allowed iff bit
``t % 32`` (LSB first) of word ``t // 32`` is set; -1 (all ones) leaves a row unconstrained.
"""
from __future__ import annotations

from typing import Any

import torch

from toys.memory import pin_for

BITS = 32


def bitmask_width(vocab_size: int) -> int:
    return (vocab_size + BITS - 1) // BITS


# ---------------------------------------------------------------------------------------
# Mask allocation and application (device-agnostic)

def allocate_vocab_mask(vocab_size: int, rows: int, device: Any) -> torch.Tensor:
    """A host int32 ``(rows, ceil(V/32))`` bitmask, all ones (every token allowed).

    It is pinned whenever the mask is headed for an accelerator: a non_blocking H2D copy
    from pageable memory silently degrades to a blocking one. CPU-only torch cannot pin at
    all, so a CPU target gets ordinary memory.
    """
    return torch.full((rows, bitmask_width(vocab_size)), -1, dtype=torch.int32,
                      pin_memory=pin_for(device))


def apply_vocab_mask(logits: torch.Tensor, vocab_mask: torch.Tensor) -> None:
    """Set ``logits[r, t] = -inf`` wherever bit ``t`` of row ``r`` is 0, in place.

    Plain torch ops on whatever device the logits live on (no xgrammar kernel, no host
    sync), so it queues on the current stream like any other sampler op.
    """
    rows, vocab_size = logits.shape
    shifts = torch.arange(BITS, dtype=torch.int32, device=vocab_mask.device)
    # (rows, W, 32): bit j of word w is token w*32 + j. An arithmetic shift of a negative
    # word keeps the sign bit in bit 0 after the shift, and "& 1" isolates it: correct.
    bits = (vocab_mask.unsqueeze(-1) >> shifts) & 1
    allowed = bits.reshape(vocab_mask.shape[0], -1)[:, :vocab_size]
    logits.masked_fill_(allowed == 0, float("-inf"))
