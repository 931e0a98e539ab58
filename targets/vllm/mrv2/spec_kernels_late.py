"""Ours, named as such: torch stand-ins for Model Runner V2's sampling, rejection, drafter
and grammar Triton kernels as later releases launch them (0.34.0 ``sample/gumbel.py``,
``sample/greedy_argmax.py``, ``spec_decode/rejection_sampler{,_utils}.py``,
``spec_decode/target_dependent_ar/speculator.py``, ``structured_outputs.py``). Same
rules as ``kernels`` (its docstring); ``seams`` picks them per release.

The target runs greedy requests only. Where a kernel branches on a request's
temperature, the stand-in computes the greedy branch exactly and marks a row sampled at
a temperature above 0 with ``NOT_GREEDY`` (an invalid id, failing loudly downstream),
as ``spec_kernels.gumbel_sample`` does; modes a launch selects on the host that the
target never turns on (the draft logits cache, synthetic / block / "fly" verification,
watermarking) are refused with ``NotImplementedError``.

0.34.0's rejection sampling is four kernels (per-block target statistics; the accept
loop; the resample of the rejected or bonus position; its insertion), where 0.17.0 had
one; each stand-in writes what its kernel writes for greedy rows, so the pipeline's
intermediate buffers hold what the kernels' would.
"""
from __future__ import annotations

import torch

from targets.vllm.engine.kernels import _masked_store as _store
from targets.vllm.mrv2.kernels import _requests_of
from targets.vllm.mrv2.spec_kernels import NOT_GREEDY


def _i64(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int64)


def _block_argmax(logits: torch.Tensor, blocks: int, block_size: int):
    """Per row and vocabulary block of ``logits`` [rows, vocab]: (max, argmax)."""
    rows, vocab = logits.shape
    pad = blocks * block_size - vocab
    if pad > 0:
        logits = torch.cat([logits, logits.new_full((rows, pad), float("-inf"))], dim=1)
    value, at = logits[:, : blocks * block_size].reshape(rows, blocks, block_size).max(-1)
    return value, torch.arange(blocks, device=at.device)[None, :] * block_size + at


def _first_max_block(values: torch.Tensor) -> torch.Tensor:
    """``tl.argmax`` over blocks with NaN as -inf: the first maximum's block."""
    v = torch.where(values != values, torch.full_like(values, float("-inf")), values)
    return v.argmax(dim=-1)


def gumbel_sample(grid, local_argmax_ptr, local_argmax_stride, local_max_ptr,
                  local_max_stride, logits_cache_ptr, logits_cache_stride_0,
                  logits_cache_stride_1, logits_cache_col_ptr, logits_cache_source_ptr,
                  logits_cache_source_stride, logits_cache_row_mapping_ptr, logits_ptr,
                  logits_stride, bias_ptr, bias_stride, expanded_idx_mapping_ptr,
                  seeds_ptr, pos_ptr, temp_ptr, vocab_size, BLOCK_SIZE=1024,
                  IS_DRAFTING=False, APPLY_TEMPERATURE=False, USE_FP64=False,
                  PER_TOKEN_COL=False, HAS_BIAS=False):
    """Per row and vocabulary block: the (biased) logits' argmax and maximum -- at
    temperature 0 Gumbel-max sampling is exactly that."""
    if logits_cache_ptr is not None:
        raise NotImplementedError("the gumbel stand-in keeps no draft logits cache "
                                  "(probabilistic drafting)")
    rows, blocks = grid[0], grid[1]
    logits = logits_ptr[:rows, :vocab_size]
    if HAS_BIAS:
        logits = (logits.to(torch.float32)
                  + bias_ptr[:rows, :vocab_size].to(torch.float32)).to(logits.dtype)
    value, token = _block_argmax(logits.to(torch.float32), blocks, BLOCK_SIZE)
    raw = _i64(expanded_idx_mapping_ptr[:rows])
    temp = torch.where(raw >= 0, temp_ptr.to(torch.float32)[raw.clamp(min=0)],
                       torch.zeros(rows, device=raw.device))
    token = torch.where((temp == 0)[:, None], token, torch.full_like(token, NOT_GREEDY))
    local_argmax_ptr[:rows, :blocks].copy_(token.to(local_argmax_ptr.dtype))
    local_max_ptr[:rows, :blocks].copy_(value.to(local_max_ptr.dtype))


def gumbel_combine(grid, local_argmax_ptr, local_argmax_stride, local_max_ptr,
                   local_max_stride, sampled_ptr, num_blocks, PADDED_NUM_BLOCKS=1):
    """Each row's token: its first NaN block's, else its first maximum block's."""
    rows = grid[0]
    values = local_max_ptr[:rows, :num_blocks]
    blocks = torch.arange(num_blocks, device=values.device)[None, :]
    nan = torch.where(values != values, blocks, torch.full_like(blocks, num_blocks))
    first_nan = nan.min(dim=-1).values
    winner = torch.where(first_nan < num_blocks, first_nan, values.argmax(dim=-1))
    sampled_ptr[:rows].copy_(local_argmax_ptr[:rows].gather(1, winner[:, None])
                             .squeeze(1).to(sampled_ptr.dtype))


def argmax_partial(grid, X, PV, PI, N, SX, SPLITS, BLOCK):
    """``greedy_argmax``'s per-split maximum and its index (NaN as -inf)."""
    rows = grid[0]
    x = X.reshape(-1)[: rows * SX].reshape(rows, SX)[:, :N].to(torch.float32)
    x = torch.where(x != x, torch.full_like(x, float("-inf")), x)
    value, at = _block_argmax(x, SPLITS, BLOCK)
    PV.reshape(-1)[: rows * SPLITS].copy_(value.reshape(-1))
    PI.reshape(-1)[: rows * SPLITS].copy_(at.reshape(-1).to(PI.dtype))


def argmax_finish(grid, PV, PI, OUT, SPLITS, BLOCK):
    rows = grid[0]
    part = PV.reshape(rows, SPLITS).argmax(dim=-1)
    OUT[:rows].copy_(PI.reshape(rows, SPLITS).gather(1, part[:, None]).squeeze(1)
                     .to(OUT.dtype))


def _temps(temp_ptr, idx):
    return temp_ptr.to(torch.float32)[_i64(idx).clamp(min=0)]


def compute_local_logits_stats(grid, target_local_argmax_ptr, target_local_argmax_stride,
                               target_local_max_ptr, target_local_max_stride,
                               target_local_sumexp_ptr, target_local_sumexp_stride,
                               draft_local_max_ptr, draft_local_max_stride,
                               draft_local_sumexp_ptr, draft_local_sumexp_stride,
                               target_logits_ptr, target_logits_stride, draft_logits_ptr,
                               draft_logits_stride_0, draft_logits_stride_1,
                               draft_logits_row_mapping_ptr, expanded_idx_mapping_ptr,
                               expanded_local_pos_ptr, temp_ptr, vocab_size, num_logits,
                               BLOCK_SIZE=8192, HAS_DRAFT_LOGITS=False):
    """For each greedy logit row that is not a request's bonus row: the target's
    per-block maximum and argmax (the other rows: nothing, as the kernel's greedy
    branch writes nothing there)."""
    local = _i64(expanded_local_pos_ptr[: grid[0]])
    bonus = torch.cat([local[1:], local.new_zeros(1)]) == 0  # the next row starts anew
    local_stats(grid, target_local_argmax_ptr, target_local_max_ptr, target_logits_ptr,
                expanded_idx_mapping_ptr, temp_ptr, vocab_size, BLOCK_SIZE, bonus)


def local_stats(grid, target_local_argmax_ptr, target_local_max_ptr, target_logits_ptr,
                expanded_idx_mapping_ptr, temp_ptr, vocab_size, BLOCK_SIZE, bonus) -> None:
    """The greedy branch of the statistics kernels: per-block max / argmax of each greedy
    row that is not a bonus row (``bonus``: each row's, on the device)."""
    rows, blocks = grid[0], grid[1]
    greedy = _temps(temp_ptr, expanded_idx_mapping_ptr[:rows]) == 0
    write = greedy & ~bonus
    value, token = _block_argmax(target_logits_ptr[:rows, :vocab_size].to(torch.float32),
                                 blocks, BLOCK_SIZE)
    for dst, val in ((target_local_argmax_ptr, token), (target_local_max_ptr, value)):
        rows_now = dst[:rows, :blocks]
        rows_now.copy_(torch.where(write[:, None], val.to(dst.dtype), rows_now))


def rejection(grid, sampled_ptr, sampled_stride, rejected_steps_ptr,
              target_rejected_logsumexp_ptr, draft_rejected_logsumexp_ptr, target_logits_ptr,
              target_logits_stride, target_local_argmax_ptr, target_local_argmax_stride,
              target_local_max_ptr, target_local_max_stride, target_local_sumexp_ptr,
              target_local_sumexp_stride, draft_sampled_ptr, draft_logits_ptr,
              draft_logits_stride_0, draft_logits_stride_1, draft_logits_row_mapping_ptr,
              draft_local_max_ptr, draft_local_max_stride, draft_local_sumexp_ptr,
              draft_local_sumexp_stride, cu_num_logits_ptr, idx_mapping_ptr, temp_ptr,
              seed_ptr, pos_ptr, synthetic_conditional_rates_ptr, cumulative_log_p_ptr,
              local_residual_mass_ptr, local_residual_mass_stride, fly_entropy_ptr,
              fly_entropy_threshold, vocab_num_blocks, PADDED_VOCAB_NUM_BLOCKS=1,
              HAS_DRAFT_LOGITS=False, SYNTHETIC_MODE=False, USE_BLOCK_VERIFICATION=False,
              FLY_WINDOW_SIZE=0):
    """Greedy verification: a request accepts its drafts while each equals the target's
    argmax at its position; the target's token is stored at every verified position up
    to the first rejection, the accepted count as the rejected step."""
    if SYNTHETIC_MODE or USE_BLOCK_VERIFICATION or FLY_WINDOW_SIZE:
        raise NotImplementedError("the rejection stand-in verifies greedily only")
    reqs = grid[0]
    width = sampled_ptr.shape[1]
    cu = _i64(cu_num_logits_ptr[: reqs + 1])
    start, nd = cu[:-1], cu[1:] - cu[:-1] - 1
    j = torch.arange(width, device=cu.device)[None, :]
    logit = (start[:, None] + j).clamp(max=target_local_max_ptr.shape[0] - 1)
    block = _first_max_block(target_local_max_ptr[:, :vocab_num_blocks][logit])
    target = _i64(target_local_argmax_ptr[:, :vocab_num_blocks][logit]
                  .gather(-1, block[..., None]).squeeze(-1))
    drafts = draft_sampled_ptr.reshape(-1)
    draft = _i64(drafts[(logit + 1).clamp(max=drafts.numel() - 1)])
    in_range = j < nd[:, None]
    accepted = (target == draft) & (draft >= 0) & in_range
    rejected = (in_range & ~accepted).to(torch.int32)
    verified = in_range & ((torch.cumsum(rejected, dim=1) - rejected) == 0)
    count = (accepted & verified).sum(dim=1)
    greedy = _temps(temp_ptr, idx_mapping_ptr[:reqs]) == 0
    tok = torch.where(greedy[:, None], target, torch.full_like(target, NOT_GREEDY))
    rows = sampled_ptr[:reqs, :width]
    rows.copy_(torch.where(verified | ~greedy[:, None] & (j == 0), tok.to(rows.dtype),
                           rows))
    rejected_steps_ptr[:reqs].copy_(torch.where(greedy, count, torch.zeros_like(count))
                                    .to(rejected_steps_ptr.dtype))
    target_rejected_logsumexp_ptr[:reqs].zero_()
    draft_rejected_logsumexp_ptr[:reqs].zero_()


def resample(grid, resampled_local_argmax_ptr, resampled_local_argmax_stride,
             resampled_local_max_ptr, resampled_local_max_stride, target_logits_ptr,
             target_logits_stride, target_rejected_logsumexp_ptr, draft_logits_ptr,
             draft_logits_stride_0, draft_logits_stride_1, draft_logits_row_mapping_ptr,
             draft_rejected_logsumexp_ptr, rejected_step_ptr, cu_num_logits_ptr,
             expanded_idx_mapping_ptr, draft_sampled_ptr, temp_ptr, seed_ptr, pos_ptr,
             cumulative_log_p_ptr, contexts_ptr, contexts_stride, watermarking_ptr,
             watermarking_skip_mask_ptr, watermark_key_0, watermark_key_1, vocab_size,
             BLOCK_SIZE=1024, HAS_DRAFT_LOGITS=False, USE_FP64=False,
             USE_BLOCK_VERIFICATION=False, CONTEXT_WIDTH=1, WATERMARK=False,
             DEDUPLICATE_CONTEXTS=False, SKIP_MASKED_BLOCKS=False):
    """A greedy request whose drafts were all accepted: the target's per-block argmax
    at its bonus position (a rejected greedy request: nothing -- its target token is
    already in place); a request sampled at a temperature above 0: ``NOT_GREEDY``."""
    if WATERMARK or USE_BLOCK_VERIFICATION:
        raise NotImplementedError("the resample stand-in resamples greedily only")
    reqs, blocks = grid[0], grid[1]
    cu = _i64(cu_num_logits_ptr[: reqs + 1])
    at = (cu[:-1] + _i64(rejected_step_ptr[:reqs])).clamp(max=target_logits_ptr.shape[0] - 1)
    bonus = at == cu[1:] - 1
    greedy = _temps(temp_ptr, _i64(expanded_idx_mapping_ptr)[at]) == 0
    value, token = _block_argmax(target_logits_ptr[:, :vocab_size][at].to(torch.float32),
                                 blocks, BLOCK_SIZE)
    token = torch.where(greedy[:, None], token, torch.full_like(token, NOT_GREEDY))
    write = (bonus | ~greedy)[:, None]
    for dst, val in ((resampled_local_argmax_ptr, token), (resampled_local_max_ptr, value)):
        now = dst[:reqs, :blocks]
        now.copy_(torch.where(write, val.to(dst.dtype), now))


def insert_resampled(grid, sampled_ptr, sampled_stride, num_sampled_ptr,
                     resampled_local_argmax_ptr, resampled_local_argmax_stride,
                     resampled_local_max_ptr, resampled_local_max_stride,
                     resample_num_blocks, cu_num_logits_ptr, expanded_idx_mapping_ptr,
                     temp_ptr, PADDED_RESAMPLE_NUM_BLOCKS=1):
    """One more sampled token per request; a bonus (or non-greedy) position takes the
    resampled token from the best block."""
    reqs = grid[0]
    cu = _i64(cu_num_logits_ptr[: reqs + 1])
    ns = _i64(num_sampled_ptr[:reqs])
    at = (cu[:-1] + ns).clamp(max=expanded_idx_mapping_ptr.numel() - 1)
    num_sampled_ptr[:reqs].copy_((ns + 1).to(num_sampled_ptr.dtype))
    greedy = _temps(temp_ptr, _i64(expanded_idx_mapping_ptr)[at]) == 0
    write = ~greedy | (at == cu[1:] - 1)
    best = _first_max_block(resampled_local_max_ptr[:reqs, :resample_num_blocks]
                            .to(torch.float32))
    tok = resampled_local_argmax_ptr[:reqs, :resample_num_blocks].gather(
        1, best[:, None]).squeeze(1)
    width = sampled_ptr.shape[1]
    _store(sampled_ptr.view(-1)[: reqs * sampled_stride],
           torch.arange(reqs, device=cu.device) * sampled_stride + ns.clamp(max=width - 1),
           tok, write)


def gather_draft_sampled(grid, draft_sampled_ptr, pos_ptr, input_ids_ptr, positions_ptr,
                         logits_indices_ptr, expanded_idx_mapping_ptr,
                         expanded_local_pos_ptr, prefill_len_ptr, num_logits,
                         BLOCK_SIZE=1024):
    """Each logits row's input token and position; a draft slot of a step that starts
    within the prompt is a placeholder (-1)."""
    n = num_logits
    token_idx = _i64(logits_indices_ptr[:n])
    tok = _i64(input_ids_ptr.reshape(-1)[token_idx])
    pos = _i64(positions_ptr.reshape(-1)[token_idx])
    local = _i64(expanded_local_pos_ptr[:n])
    prefill = _i64(prefill_len_ptr)[_i64(expanded_idx_mapping_ptr[:n]).clamp(min=0)]
    tok = torch.where((local > 0) & (pos - local < prefill), torch.full_like(tok, -1), tok)
    draft_sampled_ptr[:n].copy_(tok.to(draft_sampled_ptr.dtype))
    pos_ptr[:n].copy_(pos.to(pos_ptr.dtype))


def flatten_sampled(grid, flat_sampled_ptr, sampled_ptr, sampled_stride, num_sampled_ptr,
                    cu_num_logits_ptr):
    """Each request's sampled tokens, packed at its logits' offsets."""
    reqs = grid[0]
    width = sampled_ptr.shape[1]
    j = torch.arange(width, device=sampled_ptr.device)[None, :]
    dst = _i64(cu_num_logits_ptr[:reqs])[:, None] + j
    mine = j < _i64(num_sampled_ptr[:reqs])[:, None]
    _store(flat_sampled_ptr, dst.reshape(-1), sampled_ptr[:reqs, :width].reshape(-1),
           mine.reshape(-1))


def apply_grammar_bitmask(grid, logits_ptr, logits_stride, logits_indices_ptr,
                          cu_num_logits_ptr, bitmask_ptr, bitmask_stride, vocab_size,
                          MASK_STRIDE=1, BLOCK_SIZE=8192):
    """Each mask: its (request, position) from the mapping, -inf wherever its packed bit
    is 0 on that request's logits row, if the request has that many logits."""
    masks = grid[0]
    m = _i64(logits_indices_ptr[:masks])
    req, posn = m // MASK_STRIDE, m % MASK_STRIDE
    cu = _i64(cu_num_logits_ptr)
    n = logits_ptr.shape[0]
    active = posn < cu[req + 1] - cu[req]
    row = torch.where(active, (cu[req] + posn).clamp(0, n - 1), torch.full_like(m, n))
    v = torch.arange(vocab_size, device=logits_ptr.device)
    words = _i64(bitmask_ptr[:masks])[:, v // 32]
    banned = (((words >> (v % 32)[None, :]) & 1) == 0).to(torch.float32)
    ban = torch.zeros(n + 1, vocab_size, device=logits_ptr.device)  # + an overflow row
    ban.index_add_(0, row, banned)
    now = logits_ptr[:, :vocab_size]
    now.copy_(torch.where(ban[:n] > 0, torch.full_like(now, float("-inf")), now))
