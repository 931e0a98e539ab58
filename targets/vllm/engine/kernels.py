"""Ours, named as such: torch stand-ins for the Triton kernels on vLLM's spec-decode path.

vLLM launches a Triton kernel as ``kernel[grid](*args, **kwargs)``. On the simulator (and
on a machine without Triton) each kernel the greedy EAGLE-family path launches is replaced
by a function of the same parameters, bound under the module-level names the launching
modules use (``KERNEL_SEAMS``; the contract checks each name and parameter list before a
run). 0.17.0 has no kernel-override seam of its own (``vllm.triton_utils.dispatcher``
arrives later), so the names are rebound for the run and put back after.

Each stand-in is vectorised and reads nothing back to the host -- no ``.item()``, no
boolean indexing -- so, like the kernel, it is queued on the current stream and never
syncs: the asynchrony the races live in is kept. Masked stores write a one-element
overflow slot instead of branching on data.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
from typing import Callable, Dict, Iterator, Tuple

import torch


class GridKernel:
    """``stand_in[grid](*args, **kwargs)``, the way a ``@triton.jit`` function launches."""

    def __init__(self, name: str, fn: Callable) -> None:
        self.name, self.fn = name, fn

    def __getitem__(self, grid):
        grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
        return lambda *args, **kwargs: self.fn(grid, *args, **kwargs)


def _masked_store(dst: torch.Tensor, idx: torch.Tensor, val: torch.Tensor,
                  mask: torch.Tensor) -> None:
    """``dst[idx[mask]] = val[mask]`` for a 1-D ``dst``, with no data-dependent shape."""
    n = dst.numel()
    ext = torch.cat([dst, dst.new_zeros(1)])
    where = torch.where(mask, idx.to(torch.int64), torch.full_like(idx, n, dtype=torch.int64))
    ext.scatter_(0, where.reshape(-1), val.reshape(-1).to(dst.dtype))
    dst.copy_(ext[:n])


def rejection_greedy_sample(grid, output_token_ids_ptr, cu_num_draft_tokens_ptr,
                            draft_token_ids_ptr, target_argmax_ptr, bonus_token_ids_ptr,
                            is_greedy_ptr, max_spec_len, uniform_probs_ptr=None,
                            synthetic_conditional_rates_ptr=None, SYNTHETIC_MODE=False):
    """Each request keeps its drafts up to the first that differs from the target's
    argmax (which it takes instead), and the bonus token when all matched. (0.23.0 added
    a synthetic acceptance-rate mode, a benchmarking aid the target never turns on: its
    three trailing parameters are taken and the mode refused.)"""
    if SYNTHETIC_MODE:
        raise NotImplementedError("the rejection stand-in has no synthetic mode")
    out, reqs, width = output_token_ids_ptr, grid[0], max_spec_len
    dev = out.device
    cu = cu_num_draft_tokens_ptr[:reqs].to(torch.int64)
    start = torch.cat([cu.new_zeros(1), cu[:-1]])
    num = cu - start
    j = torch.arange(width, device=dev)
    valid = j[None, :] < num[:, None]
    if draft_token_ids_ptr.numel() == 0:
        draft = target = torch.zeros((reqs, width), dtype=torch.int64, device=dev)
    else:
        idx = (start[:, None] + j[None, :]).clamp(max=draft_token_ids_ptr.numel() - 1)
        draft = draft_token_ids_ptr[idx].to(torch.int64)
        target = target_argmax_ptr[idx].to(torch.int64)
    mismatch = ((draft != target) & valid).to(torch.int32)
    rejected_before = (torch.cumsum(mismatch, dim=1) - mismatch) > 0
    write = valid & ~rejected_before
    all_match = mismatch.sum(dim=1) == 0
    if is_greedy_ptr is not None:
        write = write & is_greedy_ptr[:reqs, None]
        all_match = all_match & is_greedy_ptr[:reqs]
    out[:, :width] = torch.where(write, target.to(out.dtype), out[:, :width])
    current = out.gather(1, num[:, None])
    bonus = bonus_token_ids_ptr.reshape(reqs, 1).to(out.dtype)
    out.scatter_(1, num[:, None], torch.where(all_match[:, None], bonus, current))


def eagle_prepare_next_token_padded(grid, sampled_token_ids_ptr, discard_request_mask_ptr,
                                    backup_next_token_ids_ptr, next_token_ids_ptr,
                                    valid_sampled_tokens_count_ptr, vocab_size,
                                    num_sampled_tokens_per_req, num_reqs,
                                    stride_sampled_token_ids, BLOCK_SIZE_TOKENS=None):
    """The last valid sampled token of each request (its backup when none or discarded),
    and how many were valid."""
    reqs, width = num_reqs, num_sampled_tokens_per_req
    tok = sampled_token_ids_ptr[:reqs, :width].to(torch.int64)
    valid = (tok != -1) & (tok < vocab_size)
    count = valid.sum(dim=1)
    col = torch.arange(width, device=tok.device)
    last = torch.where(valid, col[None, :], torch.full_like(tok, -1)).max(dim=1).values
    last_tok = tok.gather(1, last.clamp(min=0)[:, None]).squeeze(1)
    backup = backup_next_token_ids_ptr[:reqs].to(torch.int64)
    discard = discard_request_mask_ptr[:reqs]
    nxt = torch.where(discard | (count == 0), backup, last_tok)
    count = torch.where(discard, torch.zeros_like(count), count)
    next_token_ids_ptr[:reqs].copy_(nxt.to(next_token_ids_ptr.dtype))
    valid_sampled_tokens_count_ptr[:reqs].copy_(count.to(valid_sampled_tokens_count_ptr.dtype))


def eagle_prepare_inputs_padded(grid, cu_num_draft_tokens_ptr, valid_sampled_tokens_count_ptr,
                                query_start_loc_gpu_ptr, token_indices_to_sample_ptr,
                                num_rejected_tokens_gpu_ptr=None, num_reqs=None):
    """Per request: how many of its query tokens were rejected, and which token the
    drafter samples from (the last accepted one). 0.13.0's kernel has no rejected-count
    output (``spec_decode/utils.py:21-58``; 0.14.0 added it, with the drafter's use of
    it): launched positionally there, its fifth argument is ``num_reqs``, and only the
    sample indices are written, as that kernel writes them."""
    if num_reqs is None:  # 0.13.0's five-argument launch
        num_reqs, num_rejected_tokens_gpu_ptr = num_rejected_tokens_gpu_ptr, None
    cu = cu_num_draft_tokens_ptr[:num_reqs].to(torch.int64)
    drafts = cu - torch.cat([cu.new_zeros(1), cu[:-1]])
    rejected = drafts + 1 - valid_sampled_tokens_count_ptr[:num_reqs].to(torch.int64)
    rejected = torch.where(drafts > 0, rejected, torch.zeros_like(rejected))
    last = query_start_loc_gpu_ptr[1: num_reqs + 1].to(torch.int64) - 1
    token_indices_to_sample_ptr[:num_reqs].copy_((last - rejected).to(
        token_indices_to_sample_ptr.dtype))
    if num_rejected_tokens_gpu_ptr is not None:
        num_rejected_tokens_gpu_ptr[:num_reqs].copy_(
            rejected.to(num_rejected_tokens_gpu_ptr.dtype))


def copy_and_expand_eagle_inputs(grid, target_token_ids_ptr, target_positions_ptr,
                                 next_token_ids_ptr, out_input_ids_ptr, out_positions_ptr,
                                 out_is_rejected_token_mask_ptr, out_is_masked_token_mask_ptr,
                                 out_new_token_indices_ptr, out_hidden_state_mapping_ptr,
                                 query_start_loc_ptr, query_end_loc_ptr, padding_token_id,
                                 parallel_drafting_token_id, total_input_tokens,
                                 num_padding_slots_per_request, shift_input_ids,
                                 BLOCK_SIZE_TOKENS):
    """The drafter's input: each request's valid tokens, its bonus token, parallel-
    drafting slots and rejected padding, laid out with their positions and masks."""
    reqs, blocks = grid[0], grid[1]
    pad = num_padding_slots_per_request
    dev = target_token_ids_ptr.device
    qsl = query_start_loc_ptr.to(torch.int64)
    q_start, q_next = qsl[:reqs], qsl[1: reqs + 1]
    q_end = query_end_loc_ptr[:reqs].to(torch.int64)
    r = torch.arange(reqs, device=dev)
    if shift_input_ids:
        n_valid, in_off, out_start = q_end - q_start, 1, q_start + r * (pad - 1)
    else:
        n_valid, in_off, out_start = q_end - q_start + 1, 0, q_start + r * pad
    total = n_valid + pad + (q_next - q_end - 1)
    j = torch.arange(blocks * BLOCK_SIZE_TOKENS, device=dev)[None, :]
    nv = n_valid[:, None]
    in_bounds = j < total[:, None]
    is_valid, is_bonus = j < nv, j == nv
    is_parallel = (j > nv) & (j < nv + pad)
    is_rejected = j >= nv + pad
    out_idx = out_start[:, None] + j
    in_idx = (q_start[:, None] + in_off + j).clamp(max=total_input_tokens - 1)
    tok = torch.where(is_valid & in_bounds, target_token_ids_ptr[in_idx].to(torch.int64),
                      torch.zeros_like(in_idx))
    tok = torch.where(is_bonus, next_token_ids_ptr[:reqs, None].to(torch.int64), tok)
    tok = torch.where(is_parallel, torch.full_like(tok, parallel_drafting_token_id), tok)
    tok = torch.where(is_rejected, torch.full_like(tok, padding_token_id), tok)
    start_pos = target_positions_ptr[q_start].to(torch.int64)
    pos = torch.where(is_rejected, torch.zeros_like(j), start_pos[:, None] + j)
    is_new = (j >= nv) & (j < nv + pad)
    if shift_input_ids:
        n_in = (q_next - q_start)[:, None]
        _masked_store(out_hidden_state_mapping_ptr, q_start[:, None] + j, out_idx, j < n_in)
    _masked_store(out_input_ids_ptr, out_idx, tok, in_bounds)
    _masked_store(out_positions_ptr, out_idx, pos, in_bounds)
    _masked_store(out_is_rejected_token_mask_ptr, out_idx, is_rejected & in_bounds, in_bounds)
    _masked_store(out_is_masked_token_mask_ptr, out_idx, is_parallel & in_bounds, in_bounds)
    _masked_store(out_new_token_indices_ptr, r[:, None] * pad + (j - nv), out_idx,
                  is_new & in_bounds)


def eagle_step_slot_mapping_metadata(grid, positions_ptr, block_table_ptr,
                                     block_table_stride, seq_lens_ptr,
                                     out_clamped_positions_ptr, out_slot_mapping_ptr,
                                     block_size, max_model_len, n_blocks_per_req, PAD_ID,
                                     batch_size):
    """One autoregressive draft step (0.18.0 on): each request's next position (0 past
    the model's length), its slot from the block table (padding past the length, and for
    graph-padding rows), and its length + 1 (1 past the length)."""
    n = batch_size
    pos = positions_ptr[:n].to(torch.int64) + 1
    exceeds = pos >= max_model_len
    clamped = torch.where(exceeds, torch.zeros_like(pos), pos)
    block = (clamped // block_size).clamp(max=n_blocks_per_req - 1)
    block_id = block_table_ptr[:n].to(torch.int64).gather(1, block[:, None]).squeeze(1)
    slot = torch.where(exceeds, torch.full_like(pos, PAD_ID),
                       block_id * block_size + clamped % block_size)
    length = torch.where(exceeds, torch.ones_like(pos), seq_lens_ptr[:n].to(torch.int64) + 1)
    out_clamped_positions_ptr[:n].copy_(clamped.to(out_clamped_positions_ptr.dtype))
    out_slot_mapping_ptr[:n].copy_(slot.to(out_slot_mapping_ptr.dtype))
    out_slot_mapping_ptr[n: grid[0]].fill_(PAD_ID)
    seq_lens_ptr[:n].copy_(length.clamp(max=max_model_len).to(seq_lens_ptr.dtype))


def compute_slot_mapping(grid, num_tokens, max_num_tokens, query_start_loc_ptr,
                         positions_ptr, block_table_ptr, block_table_stride, block_size,
                         slot_mapping_ptr, KV_CACHE_BLOCK_SIZE=None, BLOCKS_PER_KV_BLOCK=1,
                         TOTAL_CP_WORLD_SIZE=1, TOTAL_CP_RANK=0,
                         CP_KV_CACHE_INTERLEAVE_SIZE=1, PAD_ID=-1, BLOCK_SIZE=1024):
    """Each scheduled token's KV slot from its request's block table (0.19.0 on), the
    rest of the buffer padding. One context-parallel rank only. 0.27.1 added
    ``KV_CACHE_BLOCK_SIZE`` / ``BLOCKS_PER_KV_BLOCK`` (a KV-cache block split into
    several kernel blocks, the table holding the kernel blocks): absent, one kernel block
    per KV block, as before."""
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("the slot-mapping stand-in has one context-parallel rank")
    kv_block = block_size if KV_CACHE_BLOCK_SIZE is None else KV_CACHE_BLOCK_SIZE
    reqs = grid[0] - 1
    qsl = query_start_loc_ptr[: reqs + 1].to(torch.int64)
    tok = torch.arange(num_tokens, device=positions_ptr.device)
    req = torch.bucketize(tok, qsl[1:], right=True).clamp(max=max(reqs - 1, 0))
    pos = positions_ptr[:num_tokens].to(torch.int64)
    offset = pos % kv_block
    index = (pos // kv_block) * BLOCKS_PER_KV_BLOCK + offset // block_size
    block = block_table_ptr[req, index].to(torch.int64)
    slot = block * block_size + offset % block_size
    mine = tok < qsl[reqs]
    out = slot_mapping_ptr[:num_tokens]
    out.copy_(torch.where(mine, slot, out.to(torch.int64)).to(out.dtype))
    slot_mapping_ptr[num_tokens:max_num_tokens].fill_(PAD_ID)


# kernel name -> (its stand-in, the module that defines it, the modules that may launch
# it): the stand-in is bound in each of these that names the kernel in the release (the
# contract asks that one does, and that no driven module launches it unbound). 0.23.0
# moved the drafter's body from eagle.py into llm_base_proposer.py, with its launches.
_SPEC = "vllm.v1.spec_decode"
_DRAFTER = (f"{_SPEC}.eagle", f"{_SPEC}.llm_base_proposer")
KERNEL_SEAMS: Dict[str, Tuple[Callable, str, Tuple[str, ...]]] = {
    "rejection_greedy_sample_kernel": (rejection_greedy_sample,
                                       "vllm.v1.sample.rejection_sampler",
                                       ("vllm.v1.sample.rejection_sampler",)),
    "eagle_prepare_next_token_padded_kernel": (eagle_prepare_next_token_padded,
                                               f"{_SPEC}.utils", _DRAFTER),
    "eagle_prepare_inputs_padded_kernel": (eagle_prepare_inputs_padded, f"{_SPEC}.utils",
                                           _DRAFTER),
    "copy_and_expand_eagle_inputs_kernel": (copy_and_expand_eagle_inputs, f"{_SPEC}.utils",
                                            _DRAFTER),
    # 0.18.0 on: the drafter's per-step update, launched by a helper in its own module
    "eagle_step_slot_mapping_metadata_kernel": (eagle_step_slot_mapping_metadata,
                                                f"{_SPEC}.utils", (f"{_SPEC}.utils",)),
    # 0.19.0 on: the target's slot mapping, on the device
    "_compute_slot_mapping_kernel": (compute_slot_mapping, "vllm.v1.worker.block_table",
                                     ("vllm.v1.worker.block_table",)),
}
# Compiled ops (``torch.ops._C``, absent from a python-only install) whose callers vLLM
# routes by ``tensor.is_cuda`` -- True for a simulated GPU tensor -- and for which vLLM
# ships its own torch implementation: (module, the op's wrapper, upstream's torch one).
# The penalties' repetition op is reached by any request with a penalty.
OP_FALLBACKS: Tuple[Tuple[str, str, str], ...] = (
    ("vllm._custom_ops", "apply_repetition_penalties_cuda",
     "apply_repetition_penalties_torch"),
)

# Kernels a release may not have yet: bound (and checked) only where it defines them
# (the drafter's input expansion for parallel drafting: not in 0.13.0 / 0.14.0).
OPTIONAL_KERNELS = ("eagle_step_slot_mapping_metadata_kernel", "_compute_slot_mapping_kernel",
                    "copy_and_expand_eagle_inputs_kernel")


def _next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """The stand-ins bound under every launching module's name for the block, and
    ``OP_FALLBACKS`` to upstream's torch versions; Triton's
    ``next_power_of_2`` (the drafter sizes its blocks with it) given to vLLM's Triton
    placeholder where Triton is absent."""
    import vllm.triton_utils as triton_utils
    saved = []
    for name, (fn, _defined, launchers) in KERNEL_SEAMS.items():
        for module in launchers:
            if importlib.util.find_spec(module) is None:
                continue  # a candidate launcher this release does not have
            mod = importlib.import_module(module)
            if not hasattr(mod, name):
                continue  # not launched from here in this release (the contract checked)
            saved.append((mod, name, getattr(mod, name)))
            setattr(mod, name, GridKernel(name, fn))
    for module, op, fallback in OP_FALLBACKS:
        mod = importlib.import_module(module)
        saved.append((mod, op, getattr(mod, op)))
        setattr(mod, op, getattr(mod, fallback))  # upstream's own torch version
    triton = triton_utils.triton
    added = not hasattr(triton, "next_power_of_2")
    if added:
        triton.next_power_of_2 = _next_power_of_2
    try:
        yield
    finally:
        for mod, name, before in saved:
            setattr(mod, name, before)
        if added:
            del triton.next_power_of_2
