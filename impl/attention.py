"""The toy paged attention: what a forward reads and writes of the memory pools.

Shaped like the server's attention backends, which gather ``req_to_token`` into private
metadata when the forward starts (``init_forward_metadata``) and never read the shared
row again -- that is what lets the forward record shared-read-done right after it, and
the schedule stream rewrite rows behind the fine WAR fence:

1. ``init_forward_metadata`` (before read-done): each request's row and its KV length
   (``kv_lens``, written by the forward stream alone) -> ``kv_indices`` (the slots of its
   context) and ``window`` (the slots this step writes: a prefill's prompt positions, a
   verify's ``D`` draft positions), both private;
2. ``write_kv`` (after read-done): the step's tokens into ``window``;
3. ``attend``: the context's KV through ``kv_indices`` -> per request ``(n, checksum)``,
   the length it attended to and a positional checksum of the tokens it read. The host
   gets it back with the result and the KV oracle checks it against the request's own
   history (``harness.oracle.stale``): a forward that read a row rewritten under it, or
   KV another request wrote into its slots, is caught there;
4. ``commit_accepted`` (verify only): the accepted nodes' KV moved to the front of the
   window (read from the *window*, never from ``req_to_token``: after read-done the
   scheduler may hand a finished request's row to another request -- upstream's
   ``move_accept_tokens_to_target_kvcache`` says so), and ``kv_lens`` advanced.

The model's logits do not depend on the attention (the toy target is a bigram model):
the pools are judged through what the attention read, not through the tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from harness.faults import fault_point


@dataclass
class ForwardMetadata:
    rows: torch.Tensor  # (bs,) int64 pool rows
    kv_indices: torch.Tensor  # (bs, W) slots of each row, gathered (private)
    n: torch.Tensor  # (bs,) positions with KV before this step
    window: torch.Tensor  # (bs, w) slots this step writes


def checksum(tokens: List[int]) -> int:
    """The host's side of ``attend``: the same positional checksum over a token list."""
    return sum((t + 1) * (p + 1) for p, t in enumerate(tokens))


class ToyPagedAttention:
    def __init__(self, req_to_token_pool, kv_pool) -> None:
        self.req_to_token = req_to_token_pool.req_to_token
        self.kv = kv_pool

    def init_forward_metadata(self, rows: torch.Tensor, width: int,
                              prefill: bool) -> ForwardMetadata:
        """The forward's only reads of the shared pools (before read-done)."""
        fault_point("forward.before_attn_metadata")
        kv_indices = self.req_to_token[rows].to(torch.int64)
        if prefill:  # a new request: nothing written yet, whatever the row held before
            n = torch.zeros_like(rows)
        else:
            n = self.kv.kv_lens[rows]
        cols = (n[:, None] + torch.arange(width, device=rows.device)[None, :])
        window = kv_indices.gather(1, cols.clamp(max=kv_indices.shape[1] - 1))
        return ForwardMetadata(rows, kv_indices, n, window)

    def write_kv(self, meta: ForwardMetadata, tokens: torch.Tensor,
                 lens: torch.Tensor) -> None:
        """``tokens`` ``(bs, w)``: the first ``lens[i]`` of row ``i`` are written (padding
        goes to slot 0, as the server's padded tokens do)."""
        col = torch.arange(tokens.shape[1], device=tokens.device)[None, :]
        slots = torch.where(col < lens[:, None], meta.window, 0)
        self.kv.kv_buffer.index_put_((slots.flatten(),), tokens.flatten().to(torch.int64))

    def attend(self, meta: ForwardMetadata, upto: torch.Tensor) -> torch.Tensor:
        """``(bs, 2)`` int64: ``upto`` (positions attended to) and the checksum of the
        tokens read there."""
        vals = self.kv.kv_buffer[meta.kv_indices]
        pos = torch.arange(vals.shape[1], device=vals.device)[None, :]
        terms = torch.where(pos < upto[:, None], (vals + 1) * (pos + 1), 0)
        return torch.stack((upto, terms.sum(dim=1)), dim=1)

    def finish_prefill(self, meta: ForwardMetadata, lens: torch.Tensor) -> None:
        self.kv.kv_lens[meta.rows] = lens

    def commit_accepted(self, meta: ForwardMetadata, accept_index: torch.Tensor,
                        accept_lens: torch.Tensor) -> None:
        """The accepted path (root first) to the window's front; ``kv_lens += accept``."""
        bs, D = accept_index.shape
        row0 = (torch.arange(bs, device=accept_index.device) * D)[:, None]
        node = (accept_index - row0).clamp(min=0)
        moved = self.kv.kv_buffer[meta.window.gather(1, node)]
        j = torch.arange(D, device=accept_index.device)[None, :]
        dst = torch.where(j < accept_lens[:, None], meta.window[:, :D], 0)
        self.kv.kv_buffer.index_put_((dst.flatten(),), moved.flatten())
        self.kv.kv_lens[meta.rows] = meta.n + accept_lens.to(torch.int64)
