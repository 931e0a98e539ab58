"""Ours, named as such: torch stand-ins for Model Runner V2's input-preparation Triton
kernels as later releases launch them (0.34.0 ``vllm/v1/worker/gpu/{buffer_utils,
input_batch,block_table}.py``) where their parameters or their work changed since 0.17.0
(``kernels``). Same rules as ``kernels`` (its docstring): vectorised over the grid, no
host syncs, masked stores to an overflow slot; ``seams`` picks, per release, the
stand-in whose parameters are the kernel's.

What changed, kernel by kernel:

* ``_apply_write_kernel``: a fused multi-group write (``MULTI_GROUP``: the output is a
  pointer table, the stride a tensor of strides, each write names its group);
* ``_prepare_prefill_inputs_kernel``: the next ``num_lookahead`` prompt tokens (0 past
  the prompt), one row of ``next_prefill_tokens`` each;
* ``_combine_sampled_and_draft_tokens_kernel``: ``NUM_NEW_SAMPLED_TOKENS`` (0 or 1), and
  the last sampled token kept off a slot that still holds the prompt's tail;
* ``_post_update_kernel``: rows with a negative request index are skipped, the drafts
  copied to their request rows, no output bins or query starts when ``None``;
* ``_post_update_num_computed_tokens_kernel`` (new): computed counts by the query;
* ``_gather_block_tables_kernel``: padded rows zeroed, sliding-window entries nulled;
* ``_compute_slot_mappings_kernel``: the token count read from ``query_start_loc``,
  groups without slot mapping and dummy requests (index -1) padded.
"""
from __future__ import annotations

import torch

from targets.vllm.engine.kernels import _masked_store as _store
from targets.vllm.mrv2.kernels import _count_sampled, _deref, _requests_of


def _i64(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int64)


def apply_write(grid, output_ptr, output_stride, write_indices_ptr, write_starts_ptr,
                write_contents_ptr, write_cu_lens_ptr, write_group_ids_ptr, BLOCK_SIZE=1024,
                MULTI_GROUP=False):
    """Program ``p`` writes its slice of the contents into row ``indices[p]`` from
    column ``starts[p]`` -- of the one output, or (``MULTI_GROUP``) of its group's."""
    n = grid[0]
    contents = write_contents_ptr.reshape(-1)
    c = torch.arange(contents.numel(), device=contents.device)
    cu = _i64(write_cu_lens_ptr[:n])
    prog = torch.bucketize(c, cu, right=True).clamp(max=n - 1)
    first = torch.cat([cu.new_zeros(1), cu[:-1]])[prog]
    col = _i64(write_starts_ptr[:n])[prog] + c - first
    row = _i64(write_indices_ptr[:n])[prog]
    mine = c < cu[n - 1]
    if not MULTI_GROUP:
        _store(output_ptr.view(-1), row * output_stride + col, contents, mine)
        return
    group = _i64(write_group_ids_ptr[:n])[prog]
    for g, out in enumerate(_deref(output_ptr)):
        stride = _i64(output_stride[g])
        _store(out.view(-1), row * stride + col, contents, mine & (group == g))


def prepare_prefill_inputs(grid, input_ids_ptr, next_prefill_tokens_ptr,
                           next_prefill_tokens_stride, num_lookahead, idx_mapping_ptr,
                           query_start_loc_ptr, all_token_ids_ptr, all_token_ids_stride,
                           prefill_lens_ptr, num_computed_tokens_ptr, BLOCK_SIZE=1024,
                           LOOKAHEAD_BLOCK=1):
    """A prefilling request's query tokens from its prompt, and the ``num_lookahead``
    prompt tokens after the chunk (0 past the prompt) into ``next_prefill_tokens``."""
    reqs = grid[0]
    idx = _i64(idx_mapping_ptr[:reqs])
    done = _i64(num_computed_tokens_ptr)[idx]
    prefill = _i64(prefill_lens_ptr)[idx]
    t, req, real, q = _requests_of(input_ids_ptr.numel(), query_start_loc_ptr, reqs)
    flat = all_token_ids_ptr.view(-1)
    last = flat.numel() - 1
    src = (idx[req] * all_token_ids_stride + done[req] + t - q[req]).clamp(0, last)
    prefilling = done < prefill
    _store(input_ids_ptr, t, flat[src], real & prefilling[req])
    la = torch.arange(num_lookahead, device=idx.device)[None, :]
    pos = (done + q[1:] - q[:-1])[:, None] + la
    tok = flat[(idx[:, None] * all_token_ids_stride + pos).clamp(0, last)]
    tok = torch.where(pos < prefill[:, None], tok, torch.zeros_like(tok))
    dst = la * next_prefill_tokens_stride + idx[:, None]
    _store(next_prefill_tokens_ptr.view(-1), dst.reshape(-1), tok.reshape(-1),
           prefilling[:, None].expand_as(dst).reshape(-1))


def combine_sampled_and_draft_tokens(grid, input_ids_ptr, idx_mapping_ptr,
                                     last_sampled_tokens_ptr, query_start_loc_ptr,
                                     seq_lens_ptr, prefill_len_ptr, draft_tokens_ptr,
                                     draft_tokens_stride, cu_num_logits_ptr,
                                     logits_indices_ptr, BLOCK_SIZE=1,
                                     NUM_NEW_SAMPLED_TOKENS=1):
    """The logits indices; for a decoding request the last sampled token (unless its
    first logit's slot still holds the prompt's tail) and its drafts in the last
    ``num_logits - NUM_NEW_SAMPLED_TOKENS`` query slots."""
    reqs = grid[0]
    idx = _i64(idx_mapping_ptr[:reqs])
    cu = _i64(cu_num_logits_ptr[: reqs + 1])
    n = logits_indices_ptr.numel()
    l = torch.arange(n, device=cu.device)
    b = torch.bucketize(l, cu[1:], right=True).clamp(max=max(reqs - 1, 0))
    k = l - cu[b]
    num_logits = (cu[1:] - cu[:-1])[b]
    qend = _i64(query_start_loc_ptr[1: reqs + 1])[b]
    slot = qend - num_logits + k
    logits_indices_ptr.copy_(slot.to(logits_indices_ptr.dtype))
    r = idx[b]
    seq = _i64(seq_lens_ptr[:reqs])[b]
    prefill = _i64(prefill_len_ptr)[r]
    mine = l < cu[reqs]
    decoding = mine & (seq > prefill)
    nns = NUM_NEW_SAMPLED_TOKENS
    sampled = decoding & (k == 0) & (seq - num_logits >= prefill) if nns > 0 else None
    if sampled is not None:
        _store(input_ids_ptr, slot, last_sampled_tokens_ptr.reshape(-1)[r], sampled)
    drafts = draft_tokens_ptr.reshape(-1)
    if drafts.numel():
        j = k - nns  # the draft's index: slots from query_end - num_drafts
        src = (r * draft_tokens_stride + j.clamp(min=0)).clamp(max=drafts.numel() - 1)
        _store(input_ids_ptr, slot, drafts[src], decoding & (j >= 0))


def post_update(grid, idx_mapping_ptr, num_computed_tokens_ptr, last_sampled_tokens_ptr,
                output_bin_counts_ptr, output_bin_counts_stride, sampled_tokens_ptr,
                sampled_tokens_stride, num_sampled_ptr, num_rejected_ptr,
                query_start_loc_ptr, all_token_ids_ptr, all_token_ids_stride,
                total_len_ptr, draft_tokens_ptr, draft_tokens_out_ptr, num_draft_tokens):
    """After sampling, per batch row with a request (index >= 0): its drafts to its
    request row, its last sampled token, its sampled tokens appended to
    ``all_token_ids`` (and counted), its total length, and its computed count advanced
    by the query less the rejected tokens."""
    reqs = grid[0]
    raw = _i64(idx_mapping_ptr[:reqs])
    ok = raw >= 0
    idx = raw.clamp(min=0)
    dev = idx.device
    if draft_tokens_ptr is not None and num_draft_tokens:
        i = torch.arange(num_draft_tokens, device=dev)[None, :]
        src = draft_tokens_ptr.reshape(-1)[(torch.arange(reqs, device=dev)[:, None]
                                            * num_draft_tokens + i).reshape(-1)]
        _store(draft_tokens_out_ptr.view(-1), (idx[:, None] * num_draft_tokens + i)
               .reshape(-1), src, ok[:, None].expand(reqs, num_draft_tokens).reshape(-1))
    total = _i64(total_len_ptr)[idx]
    ns = _i64(num_sampled_ptr[:reqs])
    width = sampled_tokens_ptr.shape[1]
    sampled = _i64(sampled_tokens_ptr[:reqs])
    j = torch.arange(width, device=dev)[None, :]
    valid = (j < ns[:, None]) & ok[:, None]
    some = (ns > 0) & ok
    last = sampled.gather(1, (ns - 1).clamp(0, width - 1)[:, None]).squeeze(1)
    _store(last_sampled_tokens_ptr.view(-1), idx, last, some)
    _store(total_len_ptr, idx, total + ns, some)
    if output_bin_counts_ptr is not None:
        _count_sampled(output_bin_counts_ptr, idx, output_bin_counts_stride, sampled, valid)
    dst = idx[:, None] * all_token_ids_stride + total[:, None] + j
    _store(all_token_ids_ptr.view(-1), dst.reshape(-1), sampled.reshape(-1),
           valid.reshape(-1))
    if query_start_loc_ptr is None:
        qlen = torch.zeros_like(ns)
    else:
        q = _i64(query_start_loc_ptr[: reqs + 1])
        qlen = q[1:] - q[:-1]
    delta = qlen - _i64(num_rejected_ptr[:reqs])
    done = _i64(num_computed_tokens_ptr)[idx]
    _store(num_computed_tokens_ptr, idx, done + delta, ok & (delta != 0))


def post_update_num_computed_tokens(grid, idx_mapping_ptr, num_computed_tokens_ptr,
                                    query_start_loc_ptr):
    """Each request's computed count advanced by its query length."""
    reqs = grid[0]
    idx = _i64(idx_mapping_ptr[:reqs])
    q = _i64(query_start_loc_ptr[: reqs + 1])
    done = _i64(num_computed_tokens_ptr)[idx]
    _store(num_computed_tokens_ptr, idx, done + q[1:] - q[:-1], torch.ones_like(idx) > 0)


def gather_block_tables(grid, batch_idx_to_req_idx, src_block_table_ptrs,
                        dst_block_table_ptrs, block_table_strides, num_blocks_ptr,
                        num_blocks_stride, num_reqs, num_computed_tokens_ptr,
                        sliding_window_reach_ptr, block_sizes_ptr, MASK_SLIDING_WINDOW=False,
                        BLOCK_SIZE=1024):
    """Per KV-cache group: the batch's block-table rows, each up to its request's
    block count (entries wholly below a sliding window nulled), and the rows past the
    batch (up to the grid's) zeroed."""
    groups, rows = grid[0], grid[1]
    idx = _i64(batch_idx_to_req_idx[:num_reqs])
    for g, (src, dst) in enumerate(zip(_deref(src_block_table_ptrs),
                                       _deref(dst_block_table_ptrs))):
        if g >= groups:
            break
        count = _i64(num_blocks_ptr[g])[idx]
        cols = torch.arange(src.shape[1], device=idx.device)[None, :]
        got = src[idx]
        if MASK_SLIDING_WINDOW:
            reach = _i64(sliding_window_reach_ptr[g])
            first = _i64(num_computed_tokens_ptr)[idx]
            null = torch.where(reach > 0, (first - reach).clamp(min=0)
                               // _i64(block_sizes_ptr[g]), torch.zeros_like(first))
            got = torch.where(cols >= null[:, None], got, torch.zeros_like(got))
        mine = dst[:num_reqs]
        mine.copy_(torch.where(cols < count[:, None], got, mine))
        dst[num_reqs:rows].zero_()


def compute_slot_mappings(grid, max_num_tokens, idx_mapping, query_start_loc, pos,
                          block_table_ptrs, block_table_strides, block_sizes,
                          slot_mapping_enabled, dcp_sharded, slot_mappings_ptr,
                          slot_mappings_stride, cp_rank, CP_SIZE=1, CP_INTERLEAVE=1,
                          PAD_ID=-1, TRITON_BLOCK_SIZE=1024):
    """Per KV-cache group: each real token's KV slot from its request's block-table
    row (a dummy request, index -1, or a group without slot mapping: the pad), and the
    pad from the batch's last token to ``max_num_tokens``. One context-parallel rank."""
    if CP_SIZE != 1:
        raise NotImplementedError("the slot-mapping stand-in has one context-parallel rank")
    groups, reqs = grid[0], grid[1] - 1
    if reqs == 0:  # the last program alone: the pad from query_start_loc[0]
        slot_mappings_ptr[:groups, :max_num_tokens].fill_(PAD_ID)
        return
    raw = _i64(idx_mapping[:reqs])
    t, req, real, _q = _requests_of(max_num_tokens, query_start_loc, reqs)
    flat_pos = pos.reshape(-1)
    p = _i64(flat_pos[t.clamp(max=flat_pos.numel() - 1)])
    for g, table in enumerate(_deref(block_table_ptrs)):
        if g >= groups:
            break
        size = _i64(block_sizes[g])
        enabled = (slot_mapping_enabled[g] if slot_mapping_enabled is not None
                   else torch.ones((), dtype=torch.bool, device=p.device))  # (0.27.1: all)
        r = raw[req]
        col = torch.where(enabled, p // size, torch.zeros_like(p)).clamp(
            0, table.shape[1] - 1)
        block = _i64(table)[r.clamp(min=0), col]
        slot = torch.where(enabled & (r >= 0) & real, block * size + p % size,
                           torch.full_like(p, PAD_ID))
        slot_mappings_ptr[g, :max_num_tokens].copy_(slot.to(slot_mappings_ptr.dtype))
