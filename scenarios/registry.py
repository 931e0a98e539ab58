"""The scenario catalogue: ``specrace list`` shows it, ``specrace repro NAME`` runs one."""
from __future__ import annotations

from typing import Dict

from scenarios.base import Scenario
from scenarios.dspark import DSPARK_CONFIDENCE_RING, DSPARK_RESULT_READBACK
from scenarios.eagle import EAGLE_V2, EAGLE_V2_GRAMMAR
from scenarios.hidden_states import NGRAM_HIDDEN_READBACK
from scenarios.grammar import GRAMMAR_NGRAM, GRAMMAR_TREE_STAGING
from scenarios.graph_eligibility import GRAPH_ELIGIBILITY
from scenarios.host_order import DP_IDLE, MIXED_OVERLAP
from scenarios.kv_reuse import KV_PRESSURE, KV_ROW_REUSE
from scenarios.ngram_filter_race import SCENARIO as _NGRAM_FILTER_RACE
from scenarios.slot_reuse import SLOT_REUSE
from scenarios.vllm_v1_counts import VLLM_V1_VALID_COUNT
from scenarios.vllm_v1_drafts import VLLM_V1_DRAFT_COPY
from scenarios.vllm import (VLLM_ACCEPTED_COUNT, VLLM_DRAFT_TOKENS, VLLM_INPUT_PREP,
                            VLLM_MRV2, VLLM_MRV2_DRAFT_TOKENS, VLLM_SEQ_LENS_SHADOW)
from scenarios.vllm import VLLM_MRV2_UVA_POOL, VLLM_SEQ_LENS_SHADOW_AMPLIFIED

SCENARIOS: Dict[str, Scenario] = {
    s.name: s for s in (_NGRAM_FILTER_RACE, GRAMMAR_NGRAM, GRAMMAR_TREE_STAGING,
                        MIXED_OVERLAP, DP_IDLE, SLOT_REUSE, DSPARK_CONFIDENCE_RING,
                        DSPARK_RESULT_READBACK, NGRAM_HIDDEN_READBACK, KV_ROW_REUSE,
                        KV_PRESSURE, EAGLE_V2, EAGLE_V2_GRAMMAR, GRAPH_ELIGIBILITY,
                        VLLM_ACCEPTED_COUNT, VLLM_SEQ_LENS_SHADOW, VLLM_INPUT_PREP,
                        VLLM_DRAFT_TOKENS, VLLM_MRV2, VLLM_MRV2_DRAFT_TOKENS,
                        VLLM_V1_DRAFT_COPY, VLLM_MRV2_UVA_POOL, VLLM_V1_VALID_COUNT,
                        VLLM_SEQ_LENS_SHADOW_AMPLIFIED)}


def get(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        # close matches first; the whole list is `specrace list` (a one-line error stays short)
        import difflib
        near = difflib.get_close_matches(str(name), SCENARIOS, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(near)}? " if near else ""
        raise KeyError(f"unknown scenario {str(name)[:80]!r}; {hint}`specrace list` shows "
                       f"all {len(SCENARIOS)}") from None

