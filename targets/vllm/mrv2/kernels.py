"""Ours, named as such: torch stand-ins for Model Runner V2's input-preparation Triton
kernels (0.17.0 ``vllm/v1/worker/gpu/{buffer_utils,input_batch,block_table}.py``).

Written from what each kernel computes per program (one request, or one staged write,
per program), as the V1 path's stand-ins are (``targets/vllm/engine/kernels.py``): each
is vectorised over the whole grid, and reads nothing back to the host -- no ``.item()``,
no boolean indexing, no shape that depends on device data -- so, like the kernel, it is
queued on the current stream and never syncs. Where a kernel's loop runs to a device
value (a query length, a row's block count), the stand-in runs over a bound the host
already knows (the buffer's size) and masks; masked stores go to a one-element overflow
slot (``_store``) instead of branching on data. The sampling, rejection, EAGLE and
grammar kernels are in ``spec_kernels``; ``seams`` binds them all.

Two things a Triton kernel does that torch cannot, and how the stand-ins stand in:

* raw device pointers: the block tables are handed over as a ``uint64`` tensor of
  their addresses (``BlockTables._make_ptr_tensor``). A stand-in cannot follow an
  address, so the runner registers which tensors each pointer table holds
  (``register_pointer_table``, from ``runner``), looked up by the table's identity --
  the addresses themselves are never read (on the simulator they are all 0).
* the kernels read UVA views of pinned host memory (``UvaBuffer``): on the simulator
  they are device tensors over the pinned buffer's own storage (``seams.uva_view``),
  read when the kernel *executes*, so the stand-ins need nothing special for them.
"""
from __future__ import annotations

import weakref
from typing import List

import torch

from targets.vllm.engine.kernels import _masked_store as _store

# id(pointer table) -> (a weak reference to it, the tensors whose addresses it holds)
_POINTER_TABLES: dict = {}


def register_pointer_table(ptrs: torch.Tensor, tensors: List[torch.Tensor]) -> None:
    """``ptrs`` holds the addresses of ``tensors`` (the runner calls this once per
    ``BlockTables``): what ``_deref`` hands a stand-in instead of the addresses."""
    _POINTER_TABLES[id(ptrs)] = (weakref.ref(ptrs), list(tensors))


def _deref(ptrs: torch.Tensor) -> List[torch.Tensor]:
    ref, tensors = _POINTER_TABLES.get(id(ptrs), (None, None))
    if ref is None or ref() is not ptrs:
        raise LookupError("a pointer table no runner registered: the stand-in cannot "
                          "follow raw device addresses (register_pointer_table)")
    return tensors


def _count_sampled(bins: torch.Tensor, row: torch.Tensor, stride: int,
                   sampled: torch.Tensor, valid: torch.Tensor) -> None:
    """``output_bin_counts[row, token] += 1`` for each valid sampled token, with no
    data-dependent shape: invalid entries are counted in a one-element overflow slot."""
    flat = bins.view(-1)
    at = (row[:, None] * stride + sampled.clamp(min=0)).reshape(-1)
    where = torch.where(valid.reshape(-1), at, torch.full_like(at, flat.numel()))
    ext = torch.cat([flat, flat.new_zeros(1)])
    ext.scatter_add_(0, where, torch.ones_like(where, dtype=flat.dtype))
    flat.copy_(ext[:-1])


def _requests_of(n: int, qsl: torch.Tensor, num_reqs: int):
    """For token slots 0..n-1: each one's request (clamped) and whether it is a real
    token of one (below ``qsl[num_reqs]``) -- without reading ``qsl`` on the host."""
    q = qsl[: num_reqs + 1].to(torch.int64)
    t = torch.arange(n, device=qsl.device)
    req = torch.bucketize(t, q[1:], right=True).clamp(max=max(num_reqs - 1, 0))
    return t, req, t < q[num_reqs], q


def _one_token_per_request(grid, query_start_loc_ptr: torch.Tensor,
                           seq_lens_ptr: torch.Tensor, max_num_reqs: int) -> int:
    """What the last program of a draft decode step's input kernel lays out (its grid: a
    program per request, then that one): ``query_start_loc`` as 0..num_reqs -- one query
    token each, held at num_reqs past them -- and the unused lengths zeroed. Returns
    num_reqs, the number of requests the other programs serve."""
    reqs = grid[0] - 1
    i = torch.arange(max_num_reqs + 1, device=query_start_loc_ptr.device)
    query_start_loc_ptr[: max_num_reqs + 1].copy_(
        i.clamp(max=reqs).to(query_start_loc_ptr.dtype))
    seq_lens_ptr[reqs:max_num_reqs].zero_()
    return reqs


def apply_write(grid, output_ptr, output_stride, write_indices_ptr, write_starts_ptr,
                write_contents_ptr, write_cu_lens_ptr, BLOCK_SIZE=1024):
    """``StagedWriteTensor``'s diffs: program ``p`` writes its slice of the contents
    (``cu_lens[p-1]:cu_lens[p]``) into row ``indices[p]`` from column ``starts[p]``."""
    n = grid[0]
    contents = write_contents_ptr.reshape(-1)
    c = torch.arange(contents.numel(), device=contents.device)
    cu = write_cu_lens_ptr[:n].to(torch.int64)
    prog = torch.bucketize(c, cu, right=True).clamp(max=n - 1)
    first = torch.cat([cu.new_zeros(1), cu[:-1]])[prog]
    dst = (write_indices_ptr[:n].to(torch.int64)[prog] * output_stride
           + write_starts_ptr[:n].to(torch.int64)[prog] + c - first)
    flat = output_ptr.view(-1)
    _store(flat, dst, contents, c < cu[n - 1])


def prepare_prefill_inputs(grid, input_ids_ptr, next_prefill_tokens_ptr, idx_mapping_ptr,
                           query_start_loc_ptr, all_token_ids_ptr, all_token_ids_stride,
                           prefill_lens_ptr, num_computed_tokens_ptr, BLOCK_SIZE=1024):
    """A prefilling request's query tokens from its prompt (``all_token_ids`` from its
    computed count), and the prompt token after the chunk when the prefill goes on."""
    reqs = grid[0]
    idx = idx_mapping_ptr[:reqs].to(torch.int64)
    done = num_computed_tokens_ptr.to(torch.int64)[idx]
    prefill = prefill_lens_ptr.to(torch.int64)[idx]
    t, req, real, q = _requests_of(input_ids_ptr.numel(), query_start_loc_ptr, reqs)
    flat = all_token_ids_ptr.view(-1)
    last = flat.numel() - 1
    src = (idx[req] * all_token_ids_stride + done[req] + t - q[req]).clamp(0, last)
    _store(input_ids_ptr, t, flat[src], real & (done < prefill)[req])
    qlen = q[1:] - q[:-1]
    nxt = done + qlen
    nxt_tok = flat[(idx * all_token_ids_stride + nxt).clamp(0, last)]
    _store(next_prefill_tokens_ptr, idx, nxt_tok, (done < prefill) & (nxt < prefill))


def prepare_pos_seq_lens(grid, pos_ptr, seq_lens_ptr, idx_mapping_ptr, query_start_loc_ptr,
                         num_computed_tokens_ptr, max_num_reqs, BLOCK_SIZE=1024):
    """Each request's length (computed + scheduled) and its tokens' positions; the
    last program zeroes the unused lengths (for full CUDA graphs)."""
    reqs = grid[0] - 1
    idx = idx_mapping_ptr[:reqs].to(torch.int64)
    done = num_computed_tokens_ptr.to(torch.int64)[idx]
    t, req, real, q = _requests_of(pos_ptr.numel(), query_start_loc_ptr, reqs)
    seq_lens_ptr[:reqs].copy_((done + q[1:] - q[:-1]).to(seq_lens_ptr.dtype))
    seq_lens_ptr[reqs:max_num_reqs].zero_()
    _store(pos_ptr, t, done[req] + t - q[req], real)


def combine_sampled_and_draft_tokens(grid, input_ids_ptr, idx_mapping_ptr,
                                     last_sampled_tokens_ptr, query_start_loc_ptr,
                                     seq_lens_ptr, prefill_len_ptr, draft_tokens_ptr,
                                     draft_tokens_stride, cu_num_logits_ptr,
                                     logits_indices_ptr, BLOCK_SIZE=1):
    """The logits indices (each request's last ``1 + drafts`` query slots), and for a
    decoding request the last sampled token and its drafts written into those slots."""
    reqs = grid[0]
    idx = idx_mapping_ptr[:reqs].to(torch.int64)
    cu = cu_num_logits_ptr[: reqs + 1].to(torch.int64)
    n = logits_indices_ptr.numel()
    l = torch.arange(n, device=cu.device)
    b = torch.bucketize(l, cu[1:], right=True).clamp(max=reqs - 1)
    k = l - cu[b]
    num_logits = (cu[1:] - cu[:-1])[b]
    slot = query_start_loc_ptr[1: reqs + 1].to(torch.int64)[b] - num_logits + k
    logits_indices_ptr.copy_(slot.to(logits_indices_ptr.dtype))
    r = idx[b]
    decoding = (seq_lens_ptr[:reqs].to(torch.int64)
                > prefill_len_ptr.to(torch.int64)[idx])[b]
    width = draft_tokens_stride
    drafts = draft_tokens_ptr.reshape(-1)
    if drafts.numel() == 0:  # no speculation: only the last sampled token
        draft = torch.zeros_like(k)
    else:
        draft = drafts[(r * width + (k - 1).clamp(min=0)).clamp(max=drafts.numel() - 1)]
    tok = torch.where(k == 0, last_sampled_tokens_ptr.reshape(-1)[r], draft)
    _store(input_ids_ptr, slot, tok, decoding & (l < cu[reqs]))


def get_num_sampled_and_rejected(grid, num_sampled_ptr, num_rejected_ptr, seq_lens_ptr,
                                 cu_num_logits_ptr, idx_mapping_ptr, prefill_len_ptr):
    """A chunked prefill samples and rejects nothing; otherwise what was not sampled of
    the request's logits was rejected."""
    reqs = grid[0]
    idx = idx_mapping_ptr[:reqs].to(torch.int64)
    chunked = seq_lens_ptr[:reqs].to(torch.int64) < prefill_len_ptr.to(torch.int64)[idx]
    sampled = num_sampled_ptr[:reqs].to(torch.int64)
    sampled = torch.where(chunked, torch.zeros_like(sampled), sampled)
    cu = cu_num_logits_ptr[: reqs + 1].to(torch.int64)
    rejected = torch.where(chunked, torch.zeros_like(sampled), cu[1:] - cu[:-1] - sampled)
    num_sampled_ptr[:reqs].copy_(sampled.to(num_sampled_ptr.dtype))
    num_rejected_ptr[:reqs].copy_(rejected.to(num_rejected_ptr.dtype))


def post_update(grid, idx_mapping_ptr, num_computed_tokens_ptr, last_sampled_tokens_ptr,
                output_bin_counts_ptr, output_bin_counts_stride, sampled_tokens_ptr,
                sampled_tokens_stride, num_sampled_ptr, num_rejected_ptr,
                query_start_loc_ptr, all_token_ids_ptr, all_token_ids_stride,
                total_len_ptr):
    """After sampling: each request's last sampled token, its sampled tokens appended to
    ``all_token_ids`` (and counted in its output bins), its total length, and its
    computed count advanced by the query less the rejected tokens."""
    reqs = grid[0]
    idx = idx_mapping_ptr[:reqs].to(torch.int64)
    total = total_len_ptr.to(torch.int64)[idx]
    ns = num_sampled_ptr[:reqs].to(torch.int64)
    width = sampled_tokens_ptr.shape[1]
    sampled = sampled_tokens_ptr[:reqs].to(torch.int64)
    j = torch.arange(width, device=idx.device)[None, :]
    valid = j < ns[:, None]
    some = ns > 0
    last = sampled.gather(1, (ns - 1).clamp(0, width - 1)[:, None]).squeeze(1)
    _store(last_sampled_tokens_ptr.view(-1), idx, last, some)
    _store(total_len_ptr, idx, total + ns, some)
    _count_sampled(output_bin_counts_ptr, idx, output_bin_counts_stride, sampled, valid)
    dst = idx[:, None] * all_token_ids_stride + total[:, None] + j
    _store(all_token_ids_ptr.view(-1), dst.reshape(-1), sampled.reshape(-1),
           valid.reshape(-1))
    q = query_start_loc_ptr[: reqs + 1].to(torch.int64)
    done = num_computed_tokens_ptr.to(torch.int64)[idx]
    advanced = done + q[1:] - q[:-1] - num_rejected_ptr[:reqs].to(torch.int64)
    _store(num_computed_tokens_ptr, idx, advanced, torch.ones_like(some))


def expand_idx_mapping(grid, idx_mapping_ptr, expanded_idx_mapping_ptr,
                       expanded_local_pos_ptr, cu_num_logits_ptr, BLOCK_SIZE=1):
    """Each logit's request state index and its position within its request."""
    reqs = grid[0]
    cu = cu_num_logits_ptr[: reqs + 1].to(torch.int64)
    l = torch.arange(expanded_idx_mapping_ptr.numel(), device=cu.device)
    b = torch.bucketize(l, cu[1:], right=True).clamp(max=reqs - 1)
    mine = l < cu[reqs]
    _store(expanded_idx_mapping_ptr, l, idx_mapping_ptr[:reqs].to(torch.int64)[b], mine)
    _store(expanded_local_pos_ptr, l, l - cu[b], mine)


def gather_block_tables(grid, batch_idx_to_req_idx, src_block_table_ptrs,
                        dst_block_table_ptrs, block_table_strides, num_blocks_ptr,
                        num_blocks_stride, BLOCK_SIZE=1024):
    """Per KV-cache group: the batch's rows of the block table, in batch order, each up
    to its request's block count."""
    groups, reqs = grid[0], grid[1]
    idx = batch_idx_to_req_idx[:reqs].to(torch.int64)
    for g, (src, dst) in enumerate(zip(_deref(src_block_table_ptrs),
                                       _deref(dst_block_table_ptrs))):
        if g >= groups:
            break
        count = num_blocks_ptr[g].to(torch.int64)[idx]
        cols = torch.arange(src.shape[1], device=idx.device)[None, :]
        rows = dst[:reqs]
        rows.copy_(torch.where(cols < count[:, None], src[idx], rows))


def compute_slot_mappings(grid, num_tokens, max_num_tokens, idx_mapping, query_start_loc,
                          pos, block_table_ptrs, block_table_strides, block_sizes,
                          slot_mappings_ptr, slot_mappings_stride, cp_rank, CP_SIZE=1,
                          CP_INTERLEAVE=1, PAD_ID=-1, TRITON_BLOCK_SIZE=1024):
    """Per KV-cache group: each token's KV slot from its request's (source) block table
    row; the last program pads the rest of the buffer. One context-parallel rank."""
    if CP_SIZE != 1:
        raise NotImplementedError("the slot-mapping stand-in has one context-parallel rank")
    groups, reqs = grid[0], grid[1] - 1
    idx = idx_mapping[:reqs].to(torch.int64)
    t, req, real, _q = _requests_of(num_tokens, query_start_loc, reqs)
    p = pos[:num_tokens].to(torch.int64)
    for g, table in enumerate(_deref(block_table_ptrs)):
        if g >= groups:
            break
        size = block_sizes[g].to(torch.int64)
        col = (p // size).clamp(max=table.shape[1] - 1)
        block = table.to(torch.int64)[idx[req], col]
        out = slot_mappings_ptr[g]
        _store(out[:num_tokens], t, block * size + p % size, real)
        out[num_tokens:max_num_tokens].fill_(PAD_ID)
