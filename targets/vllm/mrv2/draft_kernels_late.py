"""Ours, named as such: torch stand-ins for the EAGLE-family drafter's Triton kernels as
0.34.0 launches them (``vllm/v1/worker/gpu/spec_decode/target_dependent_ar/
speculator.py``, the base of its EAGLE, MTP and Gemma4 speculators; 0.17.0's were in
``spec_decode/eagle/speculator.py``, ``spec_kernels``). Same rules as ``kernels``.

The draft step counter (``current_draft_step``) and the model's length cap
(``max_model_len_ptr``) are device scalars the kernels read: the stand-ins read them
on the device too (an index or a mask computed from them), never on the host.
"""
from __future__ import annotations

import torch

from targets.vllm.engine.kernels import _masked_store as _store
from targets.vllm.mrv2.kernels import _one_token_per_request, _requests_of


def _i64(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int64)


def _rows(t: torch.Tensor, n: int, stride: int) -> torch.Tensor:
    """Elements 0, stride, 2 stride, ... of what a kernel reads at ``t``'s address: a
    strided column view (``draft_tokens[:, 0]``) is already that."""
    if t.dim() == 1 and (t.stride(0) == stride or n <= 1):
        return t[:n]
    if t.is_contiguous():
        return t.reshape(-1)[torch.arange(n, device=t.device) * stride]
    raise NotImplementedError("a strided kernel argument the stand-in cannot follow")


def prepare_prefill_inputs(grid, last_token_indices_ptr, draft_current_step_ptr,
                           draft_input_ids_ptr, draft_positions_ptr,
                           draft_query_start_loc_ptr, draft_seq_lens_ptr,
                           target_input_ids_ptr, target_positions_ptr, idx_mapping_ptr,
                           last_sampled_ptr, next_prefill_tokens_ptr, num_sampled_ptr,
                           num_rejected_ptr, query_start_loc_ptr, seq_lens_ptr,
                           max_num_reqs, BLOCK_SIZE=1024):
    """The drafter's first pass: each request's accepted query tokens shifted left by
    one, the next token (last sampled, or the next prompt token of a chunked prefill) at
    its last accepted slot (its ``last_token_indices``), the target's positions, query
    starts and lengths; the last program resets the draft step and pads the rest."""
    reqs = grid[0]
    idx = _i64(idx_mapping_ptr[:reqs])
    n = target_input_ids_ptr.numel()
    t, req, real, q = _requests_of(n, query_start_loc_ptr, reqs)
    qlen = q[1:] - q[:-1] - _i64(num_rejected_ptr[:reqs])
    sampled = _i64(num_sampled_ptr[:reqs]) > 0
    nxt = torch.where(sampled, _i64(last_sampled_ptr.reshape(-1)[idx]),
                      _i64(next_prefill_tokens_ptr.reshape(-1)[idx]))
    k = t - q[req]
    ids = target_input_ids_ptr.reshape(-1)
    shifted = ids[(t + 1).clamp(max=n - 1)]
    _store(draft_input_ids_ptr, t, shifted, real & (k < qlen[req] - 1))
    last = q[:-1] + qlen - 1
    _store(draft_input_ids_ptr, last, nxt, torch.ones_like(sampled))
    _store(draft_positions_ptr, t, _i64(target_positions_ptr.reshape(-1)[:n]),
           real & (k < qlen[req]))
    last_token_indices_ptr[:reqs].copy_(last.to(last_token_indices_ptr.dtype))
    last_token_indices_ptr[reqs:max_num_reqs].zero_()
    draft_query_start_loc_ptr[:reqs].copy_(q[:-1].to(draft_query_start_loc_ptr.dtype))
    draft_query_start_loc_ptr[reqs: max_num_reqs + 1].copy_(
        q[reqs].expand(max(max_num_reqs + 1 - reqs, 0))
        .to(draft_query_start_loc_ptr.dtype))
    draft_seq_lens_ptr[:reqs].copy_(seq_lens_ptr[:reqs].to(draft_seq_lens_ptr.dtype))
    draft_seq_lens_ptr[reqs:max_num_reqs].zero_()
    draft_current_step_ptr.reshape(-1)[:1].zero_()


def prepare_decode_inputs(grid, draft_tokens_ptr, draft_tokens_stride, target_seq_lens_ptr,
                          num_rejected_ptr, input_ids_ptr, positions_ptr,
                          sample_src_positions_ptr, query_start_loc_ptr, seq_lens_ptr,
                          max_model_len, max_num_reqs, BLOCK_SIZE=1024,
                          ADVANCE_DRAFT_POSITIONS=True):
    """The first decode step: one query token per request (its first draft), its
    sampling key one further, its length the accepted length (+1 and the position one
    further when positions advance, both capped); the last program lays out
    ``query_start_loc`` as 0..num_reqs and zeroes the unused lengths."""
    reqs = _one_token_per_request(grid, query_start_loc_ptr, seq_lens_ptr, max_num_reqs)
    input_ids_ptr[:reqs].copy_(_rows(draft_tokens_ptr, reqs, draft_tokens_stride)
                               .to(input_ids_ptr.dtype))
    if sample_src_positions_ptr is not None:  # (0.27.1 keys no draft sampling by it)
        sample_src_positions_ptr[:reqs].add_(1)
    length = _i64(target_seq_lens_ptr[:reqs]) - _i64(num_rejected_ptr[:reqs])
    if ADVANCE_DRAFT_POSITIONS:
        pos = _i64(positions_ptr[:reqs])
        positions_ptr[:reqs].copy_((pos + 1).clamp(max=max_model_len - 1)
                                   .to(positions_ptr.dtype))
        length = (length + 1).clamp(max=max_model_len)
    seq_lens_ptr[:reqs].copy_(length.to(seq_lens_ptr.dtype))


def update_draft_inputs(grid, output_draft_tokens_ptr, output_draft_tokens_stride,
                        next_input_hidden_states_ptr, next_input_hidden_states_stride,
                        input_ids_ptr, positions_ptr, sample_src_positions_ptr,
                        seq_lens_ptr, draft_tokens_ptr, current_draft_step_ptr,
                        hidden_states_ptr, hidden_states_stride, hidden_size,
                        max_model_len_ptr, num_speculative_steps, BLOCK_SIZE=1024,
                        ADVANCE_DRAFT_POSITIONS=True):
    """A decode step's draft into ``draft_tokens[:, step]``; unless it was the last
    step, the next step's input: the draft, its hidden state, its sampling key, and its
    position and length one further (capped) -- ``step`` read on the device."""
    reqs = grid[0]
    dev = draft_tokens_ptr.device
    step = _i64(current_draft_step_ptr.reshape(-1)[:1])  # [1], on the device
    r = torch.arange(reqs, device=dev)
    draft = draft_tokens_ptr.reshape(-1)[:reqs]
    _store(output_draft_tokens_ptr.view(-1), r * output_draft_tokens_stride + step, draft,
           torch.ones_like(r) > 0)
    more = (step < num_speculative_steps - 1).expand(reqs)  # [reqs], on the device

    def keep(dst, value):
        dst.copy_(torch.where(more.reshape(-1, *([1] * (dst.dim() - 1))),
                              value.to(dst.dtype), dst))

    if sample_src_positions_ptr is not None:
        keep(sample_src_positions_ptr[:reqs], sample_src_positions_ptr[:reqs] + 1)
    keep(input_ids_ptr[:reqs], draft)
    keep(next_input_hidden_states_ptr[:reqs, :hidden_size],
         hidden_states_ptr[:reqs, :hidden_size])
    if ADVANCE_DRAFT_POSITIONS:
        cap = (max_model_len_ptr if isinstance(max_model_len_ptr, int)  # 0.33.0: a value
               else _i64(max_model_len_ptr.reshape(-1)[:1]))
        keep(positions_ptr[:reqs], (_i64(positions_ptr[:reqs]) + 1).clamp(max=cap - 1))
        keep(seq_lens_ptr[:reqs], (_i64(seq_lens_ptr[:reqs]) + 1).clamp(max=cap))
