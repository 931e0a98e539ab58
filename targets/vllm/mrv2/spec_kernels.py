"""Ours, named as such: torch stand-ins for Model Runner V2's sampling, rejection, EAGLE
and grammar Triton kernels (0.17.0 ``vllm/v1/worker/gpu/sample/gumbel.py``,
``spec_decode/rejection_sample.py``, ``spec_decode/eagle/speculator.py``,
``structured_outputs.py``). Same rules as ``kernels`` (its docstring): vectorised over
the grid, no host syncs, masked stores to an overflow slot.
"""
from __future__ import annotations

import torch

from targets.vllm.engine.kernels import _masked_store as _store
from targets.vllm.mrv2.kernels import _one_token_per_request, _requests_of

# What a row sampled at a temperature above 0 gets: tl.rand's Philox stream is not
# reproduced here, and an invalid id fails loudly downstream rather than passing a
# sampled request off as a greedy one. The target runs greedy requests only.
NOT_GREEDY = -1


def gumbel_sample(grid, local_argmax_ptr, local_argmax_stride, local_max_ptr,
                  local_max_stride, logits_ptr, logits_stride, expanded_idx_mapping_ptr,
                  seeds_ptr, pos_ptr, temp_ptr, vocab_size, BLOCK_SIZE=1024,
                  APPLY_TEMPERATURE=False):
    """Per row and vocabulary block: the block's argmax and its value (the host side
    then takes the best block). At temperature 0 that is greedy decoding, exactly."""
    rows, blocks = grid[0], grid[1]
    logits = logits_ptr[:rows, :vocab_size].to(torch.float32)
    pad = blocks * BLOCK_SIZE - vocab_size
    if pad:
        logits = torch.cat([logits, logits.new_full((rows, pad), float("-inf"))], dim=1)
    value, at = logits.reshape(rows, blocks, BLOCK_SIZE).max(dim=-1)
    block = torch.arange(blocks, device=at.device)[None, :]
    token = block * BLOCK_SIZE + at
    greedy = temp_ptr.to(torch.float32)[expanded_idx_mapping_ptr[:rows].to(torch.int64)] == 0
    token = torch.where(greedy[:, None], token, torch.full_like(token, NOT_GREEDY))
    local_argmax_ptr[:rows, :blocks].copy_(token.to(local_argmax_ptr.dtype))
    local_max_ptr[:rows, :blocks].copy_(value.to(local_max_ptr.dtype))


def rejection_sample(grid, sampled_ptr, sampled_stride, num_sampled_ptr, target_sampled_ptr,
                     input_ids_ptr, cu_num_logits_ptr):
    """Each request keeps the target's tokens up to and including the first that differs
    from the draft after it (the draft tokens are the next input ids); all of them, bonus
    included, when every draft matched."""
    reqs = grid[0]
    width = sampled_ptr.shape[1]
    cu = cu_num_logits_ptr[: reqs + 1].to(torch.int64)
    start, n = cu[:-1], cu[1:] - cu[:-1]
    j = torch.arange(width, device=cu.device)[None, :]
    target = target_sampled_ptr.reshape(-1)
    ids = input_ids_ptr.reshape(-1)
    at = (start[:, None] + j).clamp(max=target.numel() - 1)
    tok = target[at].to(torch.int64)
    draft = ids[(at + 1).clamp(max=ids.numel() - 1)].to(torch.int64)
    mismatch = ((tok != draft) & (j < n[:, None] - 1)).to(torch.int32)
    rejected_before = (torch.cumsum(mismatch, dim=1) - mismatch) > 0
    write = (j < n[:, None]) & ~rejected_before
    rows = sampled_ptr[:reqs, :width]
    rows.copy_(torch.where(write, tok.to(rows.dtype), rows))
    num_sampled_ptr[:reqs].copy_(write.sum(dim=1).to(num_sampled_ptr.dtype))


def prepare_eagle_inputs(grid, last_token_indices_ptr, eagle_input_ids_ptr,
                         eagle_positions_ptr, target_input_ids_ptr, target_positions_ptr,
                         idx_mapping_ptr, last_sampled_ptr, next_prefill_tokens_ptr,
                         num_sampled_ptr, num_rejected_ptr, query_start_loc_ptr,
                         BLOCK_SIZE=1024):
    """The drafter's input: each request's accepted query tokens shifted left by one,
    the next token (the last sampled, or the next prompt token of a chunked prefill)
    at its last accepted slot, the target's positions kept; that slot is where the
    drafter samples."""
    reqs = grid[0]
    idx = idx_mapping_ptr[:reqs].to(torch.int64)
    n = target_input_ids_ptr.numel()
    t, req, real, q = _requests_of(n, query_start_loc_ptr, reqs)
    qlen = q[1:] - q[:-1] - num_rejected_ptr[:reqs].to(torch.int64)
    sampled = num_sampled_ptr[:reqs].to(torch.int64) > 0
    nxt = torch.where(sampled, last_sampled_ptr.reshape(-1)[idx].to(torch.int64),
                      next_prefill_tokens_ptr[idx].to(torch.int64))
    k = t - q[req]
    ids = target_input_ids_ptr.reshape(-1)
    shifted = ids[(t + 1).clamp(max=n - 1)].to(torch.int64)
    _store(eagle_input_ids_ptr, t, shifted, real & (k < qlen[req] - 1))
    last = q[:-1] + qlen - 1
    last_token_indices_ptr[:reqs].copy_(last.to(last_token_indices_ptr.dtype))
    _store(eagle_input_ids_ptr, last, nxt, torch.ones_like(sampled))
    _store(eagle_positions_ptr, t, target_positions_ptr.reshape(-1)[:n].to(torch.int64),
           real & (k < qlen[req]))


def prepare_eagle_decode(grid, draft_tokens_ptr, output_hidden_states_ptr,
                         output_hidden_states_stride, last_token_indices_ptr,
                         target_seq_lens_ptr, num_rejected_ptr, input_ids_ptr,
                         positions_ptr, input_hidden_states_ptr,
                         input_hidden_states_stride, query_start_loc_ptr, seq_lens_ptr,
                         hidden_size, max_model_len, max_num_reqs, BLOCK_SIZE=1024):
    """The first decode step's inputs: one query token per request (its first draft),
    the hidden state of the slot it was sampled from, the next position and the
    accepted length + 1 (both clamped to the model's length); the last program lays out
    ``query_start_loc`` as 0..num_reqs and zeroes the unused lengths."""
    reqs = _one_token_per_request(grid, query_start_loc_ptr, seq_lens_ptr, max_num_reqs)
    input_ids_ptr[:reqs].copy_(draft_tokens_ptr[:reqs].to(input_ids_ptr.dtype))
    src = last_token_indices_ptr[:reqs].to(torch.int64)
    input_hidden_states_ptr[:reqs, :hidden_size].copy_(
        output_hidden_states_ptr[:, :hidden_size][src])
    pos = positions_ptr[:reqs].to(torch.int64)
    positions_ptr[:reqs].copy_((pos + 1).clamp(max=max_model_len - 1)
                               .to(positions_ptr.dtype))
    length = (target_seq_lens_ptr[:reqs].to(torch.int64)
              - num_rejected_ptr[:reqs].to(torch.int64) + 1).clamp(max=max_model_len)
    seq_lens_ptr[:reqs].copy_(length.to(seq_lens_ptr.dtype))


def update_eagle_inputs(grid, input_ids_ptr, positions_ptr, input_hidden_states_ptr,
                        input_hidden_states_stride, seq_lens_ptr, max_model_len,
                        draft_tokens_ptr, output_hidden_states_ptr,
                        output_hidden_states_stride, hidden_size, BLOCK_SIZE=1024):
    """A later decode step's inputs: the step's draft and hidden state in, position and
    length one further (clamped)."""
    reqs = grid[0]
    input_ids_ptr[:reqs].copy_(draft_tokens_ptr[:reqs].to(input_ids_ptr.dtype))
    input_hidden_states_ptr[:reqs, :hidden_size].copy_(
        output_hidden_states_ptr[:reqs, :hidden_size])
    pos = positions_ptr[:reqs].to(torch.int64)
    positions_ptr[:reqs].copy_((pos + 1).clamp(max=max_model_len - 1)
                               .to(positions_ptr.dtype))
    length = (seq_lens_ptr[:reqs].to(torch.int64) + 1).clamp(max=max_model_len)
    seq_lens_ptr[:reqs].copy_(length.to(seq_lens_ptr.dtype))


def apply_grammar_bitmask(grid, logits_ptr, logits_stride, logits_indices_ptr, bitmask_ptr,
                          bitmask_stride, vocab_size, BLOCK_SIZE=8192):
    """Each masked logits row: -inf wherever the packed bitmask's bit is 0."""
    masks = grid[0]
    v = torch.arange(vocab_size, device=logits_ptr.device)
    words = bitmask_ptr[:masks].to(torch.int64)[:, v // 32]
    banned = ((words >> (v % 32)[None, :]) & 1) == 0
    rows = logits_indices_ptr[:masks].to(torch.int64)[:, None].expand(masks, vocab_size)
    current = logits_ptr[:, :vocab_size].gather(0, rows)
    masked = torch.where(banned, torch.full_like(current, float("-inf")), current)
    logits_ptr[:, :vocab_size].scatter_(0, rows, masked)
