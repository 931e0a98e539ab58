"""A deterministic toy target model on the device.

An embedding gather followed by a projection to logits over the toy vocabulary. The
weights make the greedy continuation a fixed successor map with short cycles, so text
repeats and n-gram drafts are often accepted. An out-of-range token id fails inside the
embedding gather, as on the real server (on CUDA a device-side assert, on the simulator
a device error) -- never a silent clamp.
"""
from __future__ import annotations

import torch

from toys.vocab import EOS_ID, VOCAB_SIZE


def _cycles(vocab_size: int):
    """Partition tokens 1..V-1 into consecutive blocks of 3..7 tokens."""
    blocks, start, size = [], 1, 3
    while start < vocab_size:
        end = min(start + size, vocab_size)
        blocks.append((start, end))
        start, size = end, 3 + (size + 1) % 5
    return blocks


def successor(token: int, vocab_size: int = VOCAB_SIZE) -> int:
    """The greedy next token: each block of tokens is a cycle, so continuations repeat;
    a few tokens lead to EOS so that some requests finish by the stop token."""
    if token == EOS_ID:
        return 1
    if token % 29 == 0:
        return EOS_ID
    for start, end in _cycles(vocab_size):
        if start <= token < end:
            return start + (token - start + 1) % (end - start)
    raise ValueError(f"token {token} out of range")


_WEIGHTS: dict = {}  # "the checkpoint": computed once per process, uploaded per engine


def _weights(vocab_size: int, hidden: int, seed: int):
    key = (vocab_size, hidden, seed)
    if key not in _WEIGHTS:
        _WEIGHTS[key] = _make_weights(vocab_size, hidden, seed)
    return _WEIGHTS[key]


def _make_weights(vocab_size: int, hidden: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(vocab_size, hidden, generator=g)
    # The projection maps each token's embedding to a peak at its successor; the
    # least-squares solve keeps it a real (dense) matmul rather than a lookup.
    target = torch.full((vocab_size, vocab_size), -1.0)
    target += 0.01 * torch.randn(vocab_size, vocab_size, generator=g)
    for t in range(vocab_size):
        target[t, successor(t, vocab_size)] = 4.0
    proj = torch.linalg.lstsq(emb, target).solution
    return emb, proj


class ToyTargetModel:
    def __init__(self, device, vocab_size: int = VOCAB_SIZE, hidden: int = 128,
                 seed: int = 0) -> None:
        emb, proj = _weights(vocab_size, hidden, seed)
        self.vocab_size = vocab_size
        self.embed = emb.to(device)
        self.proj = proj.to(device)
        # Weights are uploaded on the loading stream; every stream may read them from
        # now on, so wait for the upload as a server does after loading a checkpoint.
        torch.get_device_module(device).synchronize()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits ``(n, V)`` for flat ``input_ids`` ``(n,)``."""
        return self.forward_with_hidden(input_ids)[1]

    def forward_with_hidden(self, input_ids: torch.Tensor):
        """``(hidden (n, H), logits (n, V))``: the hidden states a request with
        ``return_hidden_states`` gets back."""
        hidden = torch.nn.functional.embedding(input_ids, self.embed)
        return hidden, hidden @ self.proj
