"""The toy paged attention: what a forward reads and writes of the memory pools.

Shaped like the server's attention backends, which gather ``req_to_token`` into private
metadata when the forward starts (``init_forward_metadata``) and never read the shared
row again -- that is what lets the forward record shared-read-done right after it, and
the schedule stream rewrite rows behind the fine WAR fence:

1. ``init_forward_metadata`` (before read-done): each request's row, up to the batch's
   largest allocation -- translated through the SWA mapping where the pool has one --
   and its KV length (``kv_lens``, written by the forward stream alone) -> ``kv_indices``
   (the slots of its context) and ``window`` (the slots this step writes: a prefill's
   prompt positions, a verify's ``D`` draft positions), both private;
2. ``attend`` (after read-done): the step's tokens' KV into ``window``, then the context's
   KV through ``kv_indices`` -> per request ``(n, checksum)``, the positions it attended
   to and a positional checksum of the tokens it read there. The host gets it back with
   the result and the KV oracle checks it against the request's own history
   (``harness.oracle.stale``): a forward that read a row rewritten under it, or KV another
   request wrote into its slots, is caught there;
3. ``commit_accepted`` (verify only): the accepted nodes' KV moved to the front of the
   window -- whose slots are passed in, taken from the metadata, never re-read from
   ``req_to_token``: after read-done the scheduler may hand a finished request's row to
   another request (upstream's ``move_accept_tokens_to_target_kvcache`` says so) -- and
   ``kv_lens`` advanced.

Each step is one launch, as the server's fused kernels are: ``specrace::attn_metadata``,
``specrace::toy_attention`` and ``specrace::commit_accepted`` are ops declared to the
dispatcher with the buffers they write (``Tensor(a!)``), so both backends see exactly
which pools each reads and writes (the pattern of ``toys.verify``). The model's logits do
not depend on the attention (the toy target is a bigram model): the pools are judged
through what the attention read.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch

from seams.faults import fault_point

from toys.kernel_op import declare_kernel


@dataclass
class ForwardMetadata:
    rows: torch.Tensor  # (bs,) int64 pool rows
    kv_indices: torch.Tensor  # (bs, cols) slots of each row, gathered (private)
    n: torch.Tensor  # (bs,) positions with KV before this step
    window: torch.Tensor  # (bs, w) slots this step writes


def checksum(tokens: List[int]) -> int:
    """The host's side of ``attend``: the same positional checksum over a token list."""
    return sum((t + 1) * (p + 1) for p, t in enumerate(tokens))


# --- the kernels' bodies (looked up when the op runs: a mutation of a body runs) --------

def _metadata_kernel(req_to_token, full_to_swa, kv_lens, rows, start, kv_indices, n, window):
    cols = kv_indices.shape[1]
    slots = req_to_token[rows, :cols]
    # a hybrid SWA pool: the KV lives in the SWA slot each full slot is paired with
    kv_indices.copy_(slots if full_to_swa is None else full_to_swa[slots.to(torch.int64)])
    # a prefill's KV starts at its prefix (the schedule stream's count: 0 for a new row,
    # whatever its last owner left; an earlier chunk's end for the next chunk)
    n.copy_(kv_lens[rows] if start is None else start)
    at = (n[:, None] + torch.arange(window.shape[1], device=rows.device)[None, :])
    window.copy_(kv_indices.gather(1, at.clamp(max=cols - 1)))


def _attention_kernel(kv_buffer, window, tokens, lens, kv_indices, upto, out):
    # the step's KV first (padding to slot 0, as the server's padded tokens do; no
    # ``lens``: every column is a token)
    slots = window
    if lens is not None:
        col = torch.arange(tokens.shape[1], device=tokens.device)[None, :]
        slots = torch.where(col < lens[:, None], window, 0)
    kv_buffer.index_put_((slots.flatten(),), tokens.flatten().to(kv_buffer.dtype))
    # then the context, as far as ``upto``
    pos = torch.arange(1, kv_indices.shape[1] + 1, device=tokens.device)
    read = torch.where(pos[None, :] <= upto[:, None], kv_buffer[kv_indices] + 1, 0)
    out[:, 0] = upto
    out[:, 1] = (read * pos).sum(dim=1)


def _commit_kernel(kv_buffer, kv_lens, rows, window, targets, n, accept_index, accept_lens):
    bs, D = accept_index.shape
    row0 = (torch.arange(bs, device=rows.device) * D)[:, None]
    node = (accept_index - row0).clamp(min=0)
    moved = kv_buffer[window.gather(1, node)]
    j = torch.arange(D, device=rows.device)[None, :]
    dst = torch.where(j < accept_lens[:, None], targets[:, :D], 0)
    kv_buffer.index_put_((dst.flatten(),), moved.flatten())
    kv_lens[rows] = n + accept_lens.to(kv_lens.dtype)


declare_kernel("attn_metadata(Tensor req_to_token, Tensor? full_to_swa, Tensor kv_lens, "
               "Tensor rows, Tensor? start, "
               "Tensor(a!) kv_indices, Tensor(b!) n, Tensor(c!) window) -> ()",
               lambda *a: _metadata_kernel(*a))
declare_kernel("toy_attention(Tensor(a!) kv_buffer, Tensor window, Tensor tokens, "
               "Tensor? lens, Tensor kv_indices, Tensor upto, Tensor(b!) out) -> ()",
               lambda *a: _attention_kernel(*a))
declare_kernel("commit_accepted(Tensor(a!) kv_buffer, Tensor(b!) kv_lens, Tensor rows, "
               "Tensor window, Tensor targets, Tensor n, Tensor accept_index, "
               "Tensor accept_lens) -> ()", lambda *a: _commit_kernel(*a))


class ToyPagedAttention:
    def __init__(self, req_to_token_pool, kv_pool) -> None:
        self.req_to_token = req_to_token_pool.req_to_token
        self.kv = kv_pool

    def init_forward_metadata(self, rows: torch.Tensor, reqs, width: int, prefill: bool,
                              prefix_lens: Optional[torch.Tensor] = None) -> ForwardMetadata:
        """The forward's only reads of the shared pools (before read-done): each row's
        columns up to the batch's largest allocation (host bookkeeping, as the server
        sizes its metadata from host-side lengths), and the window of ``width`` -- from
        a prefill's ``prefix_lens`` (``ExtendInputs``), else from the KV the row holds."""
        if prefill and prefix_lens is None:
            raise ValueError("a prefill's metadata needs its prefix lengths")
        fault_point("forward.before_attn_metadata")
        cols = max(max(r.kv_allocated for r in reqs), 1)
        bs, device = rows.shape[0], rows.device
        kv_indices = torch.empty((bs, cols), dtype=torch.int64, device=device)
        n = torch.empty((bs,), dtype=torch.int64, device=device)
        window = torch.empty((bs, width), dtype=torch.int64, device=device)
        torch.ops.specrace.attn_metadata(self.req_to_token, self.kv.full_to_swa,
                                         self.kv.kv_lens, rows,
                                         prefix_lens if prefill else None, kv_indices, n,
                                         window)
        return ForwardMetadata(rows, kv_indices, n, window)

    def attend(self, meta: ForwardMetadata, tokens: torch.Tensor, lens, upto: torch.Tensor
               ) -> torch.Tensor:
        """Write the first ``lens[i]`` of ``tokens`` ``(bs, w)`` into row ``i``'s window
        (``lens`` None: all of them), then read the context's first ``upto[i]``
        positions: ``(bs, 2)`` int64 ``(upto, checksum)``."""
        out = torch.empty((tokens.shape[0], 2), dtype=torch.int64, device=tokens.device)
        torch.ops.specrace.toy_attention(self.kv.kv_buffer, meta.window, tokens, lens,
                                         meta.kv_indices, upto, out)
        return out

    def attend_prefill(self, meta: ForwardMetadata, extend) -> torch.Tensor:
        """A prefill (or one chunk of it; ``extend``: ``ExtendInputs``): the chunk's KV
        written after its prefix, the context up to its end attended to, and each row's
        KV length set to that end."""
        upto = extend.prefix_lens + extend.lens
        out = self.attend(meta, extend.ids, extend.lens, upto)
        self.kv.kv_lens[meta.rows] = upto
        return out

    def commit_accepted(self, meta: ForwardMetadata, accept_index: torch.Tensor,
                        accept_lens: torch.Tensor) -> None:
        """The accepted path (root first) to the window's front; ``kv_lens += accept``."""
        targets = meta.window
        torch.ops.specrace.commit_accepted(self.kv.kv_buffer, self.kv.kv_lens, meta.rows,
                                           meta.window, targets, meta.n, accept_index,
                                           accept_lens)
