"""Ours, named as such: torch stand-ins for Model Runner V2's logprobs Triton kernels
(``vllm/v1/worker/gpu/sample/logprob.py`` and ``prompt_logprob.py``, 0.16.0 - 0.34.0),
which requests asking for logprobs or prompt logprobs launch. Same rules as ``kernels``
(its docstring): vectorised over the grid, no host syncs, masked stores; ``seams`` binds
each where the release defines the kernel with these parameters (``table.KERNELS``).
"""
from __future__ import annotations

import torch

from targets.vllm.engine.kernels import _masked_store as _store
from targets.vllm.mrv2.kernels import _requests_of


def _log_softmax_at(logits_ptr, rows: int, vocab_size: int, ids: torch.Tensor):
    """Each row's log-softmax at ``ids`` [rows, k], in float32 as the kernel computes it
    (the row's max, then the log of its sum of exponentials)."""
    logits = logits_ptr[:rows, :vocab_size].to(torch.float32)
    top = logits.max(dim=-1, keepdim=True).values
    lse = torch.log(torch.exp(logits - top).sum(dim=-1, keepdim=True))
    return logits.gather(1, ids.to(torch.int64)) - top - lse


def topk_log_softmax(grid, output_ptr, logits_ptr, logits_stride, topk_ids_ptr, topk,
                     vocab_size, BLOCK_SIZE=1024, PADDED_TOPK=1):
    """0.16.0 - 0.23.0 (read there): row ``r``'s log-softmax at its ``topk`` token ids."""
    rows = grid[0]
    ids = topk_ids_ptr.reshape(-1)[: rows * topk].reshape(rows, topk)
    out = _log_softmax_at(logits_ptr, rows, vocab_size, ids)
    output_ptr.reshape(-1)[: rows * topk].copy_(out.reshape(-1))


def topk_log_softmax_blocked(grid, output_ptr, logits_ptr, logits_stride, topk_ids_ptr,
                             topk, vocab_size, BLOCK_SIZE=1024, TOPK_BLOCK_SIZE=1):
    """0.27.1 (read there): the same, the ids walked in blocks of ``TOPK_BLOCK_SIZE``
    (a launch detail: the values written are the same)."""
    topk_log_softmax(grid, output_ptr, logits_ptr, logits_stride, topk_ids_ptr, topk,
                     vocab_size, BLOCK_SIZE)


def topk_log_softmax_strided(grid, output_ptr, logits_ptr, logits_stride, topk_ids_ptr,
                             topk_ids_stride, topk, vocab_size, BLOCK_SIZE=1024,
                             TOPK_BLOCK_SIZE=1):
    """0.34.0: the same, the ids read through their own row stride."""
    rows = grid[0]
    ids = topk_ids_ptr[:rows, :topk]
    out = _log_softmax_at(logits_ptr, rows, vocab_size, ids)
    output_ptr.reshape(-1)[: rows * topk].copy_(out.reshape(-1))


def ranks(grid, output_ptr, logits_ptr, logits_stride, token_ids_ptr, vocab_size,
          BLOCK_SIZE=8192):
    """Row ``r``'s rank of its token: how many of its logits are at least that token's."""
    rows = grid[0]
    logits = logits_ptr[:rows, :vocab_size]
    x = logits.gather(1, token_ids_ptr[:rows].to(torch.int64).reshape(rows, 1))
    output_ptr[:rows].copy_((logits >= x).sum(dim=-1).to(output_ptr.dtype))


def prompt_logprobs_token_ids(grid, prompt_logprobs_token_ids_ptr, query_start_loc_ptr,
                              idx_mapping_ptr, num_computed_tokens_ptr, all_token_ids_ptr,
                              all_token_ids_stride, BLOCK_SIZE=1024):
    """Each scheduled token's next prompt token: for batch row ``b`` (request
    ``idx_mapping[b]``), token ``i`` of its query gets the request's token at
    ``num_computed_tokens + 1 + i`` (the logprob is of the token after it)."""
    out = prompt_logprobs_token_ids_ptr
    t, b, real, q = _requests_of(out.numel(), query_start_loc_ptr, grid[0])
    req = idx_mapping_ptr.to(torch.int64)[b]
    pos = num_computed_tokens_ptr.to(torch.int64)[req] + 1 + (t - q[b])
    width = all_token_ids_ptr.shape[1]
    src = all_token_ids_ptr[req, pos.clamp(max=width - 1)]
    _store(out, t, src, real & (pos < width))


def prompt_logprobs_prefill_token_ids(grid, prompt_logprobs_token_ids_ptr,
                                      query_start_loc_ptr, idx_mapping_ptr,
                                      num_computed_tokens_ptr, prefill_token_ids_ptr,
                                      prefill_token_ids_stride, BLOCK_SIZE=1024):
    """0.16.0's spelling: the request's tokens are its prefill token ids."""
    prompt_logprobs_token_ids(grid, prompt_logprobs_token_ids_ptr, query_start_loc_ptr,
                              idx_mapping_ptr, num_computed_tokens_ptr,
                              prefill_token_ids_ptr, prefill_token_ids_stride, BLOCK_SIZE)
