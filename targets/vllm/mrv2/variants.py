"""Ours, named as such: the stand-ins of ``kernels_late`` / ``spec_kernels_late`` /
``draft_kernels_late`` under the parameter lists other releases' kernels have, where
only the parameters moved -- what the kernel computes on the driven path being the same.

``variant(base, params, defaults, renames)`` is ``base`` taking exactly ``params`` (the
release's kernel's names, in order: ``table.choose`` matches on them), each passed on by
name -- renamed where ``renames`` says -- and ``defaults`` for what ``base`` takes and
the release's kernel does not (a parameter a later release added: 0.34.0's draft-logits
row mapping, its bias, its masked-block skip). ``without(params, absent)`` writes an
earlier release's list as a later one's less what the later release added -- the names
that the earlier release's ``defaults`` then switch off.

Per release, what differs from 0.34.0 and why the work on the driven path is the same:

* 0.33.0: no draft-logits row mapping (draft logits: probabilistic drafting only), no
  bias in Gumbel sampling (``HAS_BIAS`` False), no masked-block skip in resampling (a
  shortcut for blocks masked to -inf: same tokens); the drafter's length cap a value,
  not a device scalar;
* 0.27.1, 0.23.0, 0.18.0 / 0.19.0: below, where each is defined.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Iterable, Optional

import torch

from targets.vllm.mrv2 import draft_kernels_late as D
from targets.vllm.mrv2 import kernels_late as KL
from targets.vllm.mrv2 import spec_kernels_late as SL

_UNSET = object()


def variant(base: Callable, params: str, defaults: Optional[Dict[str, Any]] = None,
            renames: Optional[Dict[str, str]] = None, drop: str = "") -> Callable:
    """``drop``: the release's parameters ``base`` does without (a bound the stand-in
    reads off the tensors themselves)."""
    names = tuple(params.split())
    defaults, renames, dropped = dict(defaults or {}), dict(renames or {}), drop.split()

    def stand_in(grid, *args: Any, **kwargs: Any):
        bound = dict(defaults)
        bound.update(zip(names, args))
        bound.update(kwargs)
        for name in dropped:
            bound.pop(name, None)
        for theirs, ours in renames.items():
            if theirs in bound:
                bound[ours] = bound.pop(theirs)
        return base(grid, **bound)

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    stand_in.__signature__ = inspect.Signature(
        [inspect.Parameter("grid", kind)]
        + [inspect.Parameter(n, kind, default=_UNSET) for n in names])
    stand_in.__name__ = stand_in.__qualname__ = base.__name__
    stand_in.__doc__ = base.__doc__
    return stand_in


def without(params: str, absent: Iterable[str]) -> str:
    """``params`` less the names in ``absent`` (a string of names, or the keys of the
    defaults that stand in for them), the order kept: an earlier release's parameter list
    where it is a later one's but for the parameters the later release added."""
    gone = set(absent.split() if isinstance(absent, str) else absent)
    return " ".join(name for name in params.split() if name not in gone)


_NO_ROWS = {"draft_logits_row_mapping_ptr": None}

GUMBEL_033 = variant(
    SL.gumbel_sample,
    "local_argmax_ptr local_argmax_stride local_max_ptr local_max_stride logits_cache_ptr "
    "logits_cache_stride_0 logits_cache_stride_1 logits_cache_col_ptr "
    "logits_cache_source_ptr logits_cache_source_stride logits_ptr logits_stride "
    "expanded_idx_mapping_ptr seeds_ptr pos_ptr temp_ptr vocab_size BLOCK_SIZE IS_DRAFTING "
    "APPLY_TEMPERATURE USE_FP64 PER_TOKEN_COL",
    {"logits_cache_row_mapping_ptr": None, "bias_ptr": None, "bias_stride": 0,
     "HAS_BIAS": False})

_STATS_033 = (
    "target_local_argmax_ptr target_local_argmax_stride target_local_max_ptr "
    "target_local_max_stride target_local_sumexp_ptr target_local_sumexp_stride "
    "draft_local_max_ptr draft_local_max_stride draft_local_sumexp_ptr "
    "draft_local_sumexp_stride target_logits_ptr target_logits_stride draft_logits_ptr "
    "draft_logits_stride_0 draft_logits_stride_1 expanded_idx_mapping_ptr "
    "expanded_local_pos_ptr temp_ptr vocab_size num_logits BLOCK_SIZE HAS_DRAFT_LOGITS")
STATS_033 = variant(SL.compute_local_logits_stats, _STATS_033, _NO_ROWS)

_REJECTION_033 = (
    "sampled_ptr sampled_stride rejected_steps_ptr target_rejected_logsumexp_ptr "
    "draft_rejected_logsumexp_ptr target_logits_ptr target_logits_stride "
    "target_local_argmax_ptr target_local_argmax_stride target_local_max_ptr "
    "target_local_max_stride target_local_sumexp_ptr target_local_sumexp_stride "
    "draft_sampled_ptr draft_logits_ptr draft_logits_stride_0 draft_logits_stride_1 "
    "draft_local_max_ptr draft_local_max_stride draft_local_sumexp_ptr "
    "draft_local_sumexp_stride cu_num_logits_ptr idx_mapping_ptr temp_ptr seed_ptr pos_ptr "
    "synthetic_conditional_rates_ptr cumulative_log_p_ptr local_residual_mass_ptr "
    "local_residual_mass_stride fly_entropy_ptr fly_entropy_threshold vocab_num_blocks "
    "PADDED_VOCAB_NUM_BLOCKS HAS_DRAFT_LOGITS SYNTHETIC_MODE USE_BLOCK_VERIFICATION "
    "FLY_WINDOW_SIZE")
REJECTION_033 = variant(SL.rejection, _REJECTION_033, _NO_ROWS)

_RESAMPLE_033 = (
    "resampled_local_argmax_ptr resampled_local_argmax_stride resampled_local_max_ptr "
    "resampled_local_max_stride target_logits_ptr target_logits_stride "
    "target_rejected_logsumexp_ptr draft_logits_ptr draft_logits_stride_0 "
    "draft_logits_stride_1 draft_rejected_logsumexp_ptr rejected_step_ptr cu_num_logits_ptr "
    "expanded_idx_mapping_ptr draft_sampled_ptr temp_ptr seed_ptr pos_ptr "
    "cumulative_log_p_ptr contexts_ptr contexts_stride watermarking_ptr "
    "watermarking_skip_mask_ptr watermark_key_0 watermark_key_1 vocab_size BLOCK_SIZE "
    "HAS_DRAFT_LOGITS USE_FP64 USE_BLOCK_VERIFICATION CONTEXT_WIDTH WATERMARK "
    "DEDUPLICATE_CONTEXTS")
RESAMPLE_033 = variant(SL.resample, _RESAMPLE_033, {**_NO_ROWS, "SKIP_MASKED_BLOCKS": False})

_UPDATE_DRAFT_033 = (
    "output_draft_tokens_ptr output_draft_tokens_stride next_input_hidden_states_ptr "
    "next_input_hidden_states_stride input_ids_ptr positions_ptr sample_src_positions_ptr "
    "seq_lens_ptr draft_tokens_ptr current_draft_step_ptr hidden_states_ptr "
    "hidden_states_stride hidden_size max_model_len num_speculative_steps BLOCK_SIZE "
    "ADVANCE_DRAFT_POSITIONS")
# the drafter's length cap a value (a device scalar from 0.34.0)
_LENGTH_CAP_A_VALUE = {"max_model_len": "max_model_len_ptr"}
UPDATE_DRAFT_033 = variant(D.update_draft_inputs, _UPDATE_DRAFT_033,
                           renames=_LENGTH_CAP_A_VALUE)


# 0.27.1 (and 0.23.0 where the same): the drafter's kernels in autoregressive/speculator.py
# with no draft sampling key (sample_src_positions: the greedy drafter samples none);
# Gumbel sampling's draft-logits cache named processed_logits; the statistics kernel
# tells a bonus row by its position (>= num_speculative_steps), not by the next row's;
# no "fly" verification; no sliding-window nulling in the block-table gather, every
# group slot-mapped (and no dummy requests on the driven path, which the later kernel
# pads and this one would not).
_NO_SAMPLING_KEY = {"sample_src_positions_ptr": None}
DECODE_0271 = variant(
    D.prepare_decode_inputs,
    "draft_tokens_ptr draft_tokens_stride target_seq_lens_ptr num_rejected_ptr input_ids_ptr "
    "positions_ptr query_start_loc_ptr seq_lens_ptr max_model_len max_num_reqs BLOCK_SIZE "
    "ADVANCE_DRAFT_POSITIONS", _NO_SAMPLING_KEY)

UPDATE_DRAFT_0271 = variant(D.update_draft_inputs,
                            without(_UPDATE_DRAFT_033, _NO_SAMPLING_KEY), _NO_SAMPLING_KEY,
                            _LENGTH_CAP_A_VALUE)

_GUMBEL_0271 = (
    "local_argmax_ptr local_argmax_stride local_max_ptr local_max_stride "
    "processed_logits_ptr processed_logits_stride processed_logits_col_ptr logits_ptr "
    "logits_stride expanded_idx_mapping_ptr seeds_ptr pos_ptr temp_ptr vocab_size "
    "BLOCK_SIZE APPLY_TEMPERATURE USE_FP64 PER_TOKEN_COL")
_GUMBEL_0271_DEFAULTS = {
    "logits_cache_stride_1": 0, "logits_cache_source_ptr": None,
    "logits_cache_source_stride": 0, "logits_cache_row_mapping_ptr": None,
    "bias_ptr": None, "bias_stride": 0, "HAS_BIAS": False, "IS_DRAFTING": False}
_PROCESSED_LOGITS = {"processed_logits_ptr": "logits_cache_ptr",
                     "processed_logits_stride": "logits_cache_stride_0",
                     "processed_logits_col_ptr": "logits_cache_col_ptr"}
GUMBEL_0271 = variant(SL.gumbel_sample, _GUMBEL_0271, _GUMBEL_0271_DEFAULTS,
                      _PROCESSED_LOGITS)


def _stats_0271(grid, target_local_argmax_ptr, target_local_max_ptr, target_logits_ptr,
                expanded_idx_mapping_ptr, expanded_local_pos_ptr, temp_ptr, vocab_size,
                num_speculative_steps, BLOCK_SIZE=8192, **_unused):
    """0.27.1's statistics kernel: a bonus row is one at position >= the steps."""
    bonus = expanded_local_pos_ptr[: grid[0]].to(torch.int64) >= num_speculative_steps
    SL.local_stats(grid, target_local_argmax_ptr, target_local_max_ptr, target_logits_ptr,
                   expanded_idx_mapping_ptr, temp_ptr, vocab_size, BLOCK_SIZE, bonus)


STATS_0271 = variant(_stats_0271,
                     _STATS_033.replace(" num_logits ", " num_speculative_steps "))

_NO_FLY = {"fly_entropy_ptr": None, "fly_entropy_threshold": 0.0, "FLY_WINDOW_SIZE": 0}
_REJECTION_0271 = without(_REJECTION_033, _NO_FLY)
REJECTION_0271 = variant(SL.rejection, _REJECTION_0271, {**_NO_ROWS, **_NO_FLY})

# no context deduplication or watermarking in resampling
_NO_CONTEXTS = {"contexts_ptr": None, "contexts_stride": 0, "watermarking_ptr": None,
                "watermarking_skip_mask_ptr": None, "watermark_key_0": 0,
                "watermark_key_1": 0, "CONTEXT_WIDTH": 1, "WATERMARK": False,
                "DEDUPLICATE_CONTEXTS": False}
_RESAMPLE_0271 = without(_RESAMPLE_033, _NO_CONTEXTS)
RESAMPLE_0271 = variant(SL.resample, _RESAMPLE_0271,
                        {**_NO_ROWS, **_NO_CONTEXTS, "SKIP_MASKED_BLOCKS": False})

GATHER_TABLES_0271 = variant(
    KL.gather_block_tables,
    "batch_idx_to_req_idx src_block_table_ptrs dst_block_table_ptrs block_table_strides "
    "num_blocks_ptr num_blocks_stride num_reqs BLOCK_SIZE",
    {"num_computed_tokens_ptr": None, "sliding_window_reach_ptr": None,
     "block_sizes_ptr": None, "MASK_SLIDING_WINDOW": False})

SLOTS_0271 = variant(
    KL.compute_slot_mappings,
    "max_num_tokens idx_mapping query_start_loc pos block_table_ptrs block_table_strides "
    "block_sizes slot_mappings_ptr slot_mappings_stride cp_rank CP_SIZE CP_INTERLEAVE "
    "PAD_ID TRITON_BLOCK_SIZE", {"slot_mapping_enabled": None, "dcp_sharded": None})

# 0.23.0: as 0.27.1, and the statistics kernel named _compute_block_stats_kernel; no
# block verification (no cumulative ratio, no residual mass); Gumbel sampling with
# one cache column for all rows (no PER_TOKEN_COL)
_NO_BLOCK_VERIFICATION = {"cumulative_log_p_ptr": None, "USE_BLOCK_VERIFICATION": False}
# the rejection kernel's block verification also keeps the residual mass
_NO_BLOCK_VERIFICATION_IN_REJECTION = {**_NO_BLOCK_VERIFICATION,
                                       "local_residual_mass_ptr": None,
                                       "local_residual_mass_stride": 0}
REJECTION_0230 = variant(SL.rejection,
                         without(_REJECTION_0271, _NO_BLOCK_VERIFICATION_IN_REJECTION),
                         {**_NO_ROWS, **_NO_FLY, **_NO_BLOCK_VERIFICATION_IN_REJECTION})

RESAMPLE_0230 = variant(SL.resample, without(_RESAMPLE_0271, _NO_BLOCK_VERIFICATION),
                        {**_NO_ROWS, **_NO_CONTEXTS, **_NO_BLOCK_VERIFICATION,
                         "SKIP_MASKED_BLOCKS": False})

GUMBEL_0230 = variant(SL.gumbel_sample, without(_GUMBEL_0271, "PER_TOKEN_COL"),
                      {**_GUMBEL_0271_DEFAULTS, "PER_TOKEN_COL": False}, _PROCESSED_LOGITS)

# 0.18.0 / 0.19.0: the strict rejection kernel is 0.17.0's under a new name
# (spec_kernels.rejection_sample); the block-table gather takes the row width it zeroes
# padded rows to (the table's own width: read off the tensor); Gumbel sampling with a
# processed-logits output and no cache column
GATHER_TABLES_0180 = variant(
    KL.gather_block_tables,
    "batch_idx_to_req_idx src_block_table_ptrs dst_block_table_ptrs block_table_strides "
    "num_blocks_ptr num_blocks_stride num_reqs max_num_blocks BLOCK_SIZE",
    {"num_computed_tokens_ptr": None, "sliding_window_reach_ptr": None,
     "block_sizes_ptr": None, "MASK_SLIDING_WINDOW": False}, drop="max_num_blocks")

GUMBEL_0180 = variant(
    SL.gumbel_sample,
    "local_argmax_ptr local_argmax_stride local_max_ptr local_max_stride "
    "processed_logits_ptr processed_logits_stride logits_ptr logits_stride "
    "expanded_idx_mapping_ptr seeds_ptr pos_ptr temp_ptr vocab_size BLOCK_SIZE "
    "APPLY_TEMPERATURE",
    {"logits_cache_stride_1": 0, "logits_cache_col_ptr": None,
     "logits_cache_source_ptr": None, "logits_cache_source_stride": 0,
     "logits_cache_row_mapping_ptr": None, "bias_ptr": None, "bias_stride": 0,
     "HAS_BIAS": False, "IS_DRAFTING": False, "USE_FP64": False, "PER_TOKEN_COL": False},
    {"processed_logits_ptr": "logits_cache_ptr",
     "processed_logits_stride": "logits_cache_stride_0"})
