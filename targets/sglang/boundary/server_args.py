"""The sglang target's server arguments: the toy world's (``toys.server_args``) and the
add-ons of the slices only this target drives -- the platform's branches aside, DSpark's
ragged verify, the hidden states a request asks back, and EAGLE v2's tree and plan
stream -- in upstream's spellings."""
from __future__ import annotations

from dataclasses import dataclass

from toys.server_args import ServerArgs

RAGGED_VERIFY_MODES = ("static", "compact", "cap-accept")


@dataclass
class SglangArgs(ServerArgs):
    # "dspark" and "eagle-v2" (upstream's EAGLE worker): this target's slices
    SPEC_ALGORITHMS = ServerArgs.SPEC_ALGORITHMS + ("dspark", "eagle-v2")

    # The DSpark slice (spec_algorithm "dspark"), in upstream's spellings:
    # SGLANG_RAGGED_VERIFY_MODE (non-static modes relay confidence), the attention
    # backend's needs_cpu_seq_lens (FlashInfer True; FA3, Triton, TRT-LLM and DSV4 False),
    # and whether the accept is folded into the verify graph
    ragged_verify_mode: str = "compact"
    needs_cpu_seq_lens: bool = True
    folded_accept: bool = True
    # Requests ask for their hidden states back (the NGRAM verify then replays graphs into
    # static hidden/logits buffers, whose readback the copy stream does)
    return_hidden_states: bool = False
    # The EAGLE v2 slice (spec_algorithm "eagle-v2"): the draft's topk
    # (--speculative-eagle-topk; draft_token_num - 1 steps) and the plan stream
    # (SGLANG_ENABLE_OVERLAP_PLAN_STREAM: verify and draft-extend prep on side streams)
    eagle_topk: int = 1
    plan_stream: bool = False
    eagle3: bool = False  # EAGLE3: the draft reads three target layers' hidden states
    # Every request asks frequency, presence and repetition penalties, min_new_tokens and a
    # logit bias: upstream's penalizers (penaltylib) then keep per-request state that the
    # schedule stream accumulates each step and the verify applies on the forward stream
    sampling_penalties: bool = False

    def validate(self) -> None:
        super().validate()
        if self.ragged_verify_mode not in RAGGED_VERIFY_MODES:
            raise ValueError(f"ragged_verify_mode must be one of {RAGGED_VERIFY_MODES}")
        if not 1 <= self.eagle_topk <= 8:
            raise ValueError("eagle_topk must be in 1..8")
        if self.admission == "optimistic" and self.spec_algorithm == "dspark":
            raise ValueError("optimistic admission is not modelled for the DSpark slice")
        if self.chunked_prefill_size and self.spec_algorithm == "dspark":
            raise ValueError("chunked prefill is not modelled for the DSpark slice (its "
                             "toy worker prefills whole prompts)")

    def draft_span(self) -> int:
        """A tree draft writes topk x steps columns (EAGLE v2 with topk > 1)."""
        return max(self.draft_token_num, self.eagle_topk * (self.draft_token_num - 1))
