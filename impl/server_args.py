"""The server's arguments the toy engines read (as sglang's ``server_args.py``): the draft
shape, the relay and fence, the pools, and the scheduling features (chunked prefill,
retraction), each validated before a scheduler is built."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from impl.spec_info import RELAY_MODES

WAR_BARRIERS = ("fine", "coarse")
# "eagle": a device drafter builds the tree; "dspark" and "eagle-v2" (upstream's EAGLE
# worker): the sglang target only
SPEC_ALGORITHMS = ("ngram", "eagle", "dspark", "eagle-v2")
RAGGED_VERIFY_MODES = ("static", "compact", "cap-accept")
KV_LAYOUTS = ("full", "swa")
ADMISSIONS = ("lifetime", "optimistic")


@dataclass
class ServerArgs:
    draft_token_num: int = 4
    relay: str = "future_map"  # "spec_info" is the pre-#35198 relay
    war_barrier: str = "fine"
    overlap: bool = True
    req_pool_size: int = 64  # rows of the request pool; slot 0 is the padding row
    max_prefill_reqs: int = 4
    dp_attention: bool = False  # an idle rank still runs (empty) batches
    spec_algorithm: str = "ngram"  # "eagle": a device drafter builds the tree
    # The verify forward as CUDA graph replays, where the device module captures graphs
    # (torch.cuda, the simulator); batches above cuda_graph_max_bs run eagerly.
    cuda_graph: bool = True
    cuda_graph_max_bs: int = 8
    # The hardware the sglang target's upstream code reads itself as running on ("cuda" or
    # "rocm": its is_cuda() / _is_hip branches); impl/ has one platform
    platform: str = "cuda"
    # The sglang target's DSpark slice (spec_algorithm "dspark"; impl/ has no DSpark), in
    # upstream's spellings: SGLANG_RAGGED_VERIFY_MODE (non-static modes relay confidence),
    # the attention backend's needs_cpu_seq_lens (FlashInfer True; FA3, Triton, TRT-LLM
    # and DSV4 False), and whether the accept is folded into the verify graph
    ragged_verify_mode: str = "compact"
    needs_cpu_seq_lens: bool = True
    folded_accept: bool = True
    # The sglang target: requests ask for their hidden states back (the NGRAM verify then
    # replays graphs into static hidden/logits buffers, whose readback the copy stream does)
    return_hidden_states: bool = False
    # The memory pools (impl.mem_cache): KV slots (slot 0, the padding slot, not counted)
    # and the columns of a req_to_token row. A small pool makes finished requests' slots
    # go to waiting ones within a run.
    kv_pool_size: int = 4096
    context_len: int = 256
    kv_layout: str = "full"  # "swa": KV slots paired with SWA slots by a device mapping
    # The sglang target's EAGLE v2 slice (spec_algorithm "eagle-v2"): the draft's topk
    # (--speculative-eagle-topk; draft_token_num - 1 steps) and the plan stream
    # (SGLANG_ENABLE_OVERLAP_PLAN_STREAM: verify and draft-extend prep on side streams)
    eagle_topk: int = 1
    plan_stream: bool = False
    eagle3: bool = False  # EAGLE3: the draft reads three target layers' hidden states
    # The vLLM target: whether its toy target model is hybrid (a Mamba-style state picked
    # by the accepted counts: vLLM's hybrid path) or dense attention only
    hybrid: bool = True
    # The vLLM target's slices in place of its whole engine ("": the engine;
    # "draft-tokens": Model Runner V2's draft-token handler, targets/vllm/slices/)
    vllm_slice: str = ""
    # The vLLM target's model runner: "" the V1 GPUModelRunner, "v2" Model Runner V2
    # (vllm/v1/worker/gpu/, upstream's VLLM_USE_V2_MODEL_RUNNER; targets/vllm/mrv2/)
    vllm_runner: str = ""
    # Model Runner V2 with every request asking for structured output (a toy grammar of
    # the model's own language, targets/vllm/mrv2/grammar.py): the batches whose drafts
    # MRv2 copies to the host
    vllm_structured_outputs: bool = False
    # The vLLM target's requests' presence penalty (0: none). Any penalty makes the V1
    # runner copy each step's drafts to the host (for the penalties' token history); a
    # toy logit is 1 for the successor and 0 elsewhere, so a penalty below 1 leaves the
    # greedy output -- what the model oracle knows -- unchanged
    vllm_presence_penalty: float = 0.0
    # The vLLM target's async scheduling where ``overlap`` is on: False, on (as
    # ``--async-scheduling`` asks); True, as the installed release has it by default for
    # an EAGLE-family drafter (off in 0.13.0, on from 0.14.0, PR #31998;
    # targets/vllm/engine/loop.py: release_async_default). ``overlap`` False is off either way
    vllm_async_default: bool = False
    # Retraction (upstream's retract_decode under memory pressure), at a point the same in
    # a trial and its reference: ((rid, n), ...) retracts request rid once it holds n
    # output tokens (impl.schedule_batch.retract)
    retract_at: Tuple[Tuple[int, int], ...] = ()
    # Admission (impl.mem_cache.KVCacheManager): "lifetime" reserves a request's whole
    # lifetime, so the pool never runs short; "optimistic" admits on its prefill alone,
    # as upstream's PrefillAdder does with a low new-token ratio -- decode steps then run
    # the pool short and the scheduler retracts running requests under that pressure
    # (upstream's check_decode_mem / retract_decode), at points that differ between a
    # trial and its reference (the per-step oracle stands down for such requests)
    admission: str = "lifetime"
    # Chunked prefill (upstream's --chunked-prefill-size): a prefill takes at most this
    # many prompt tokens, a longer context goes in chunks (0: off; impl.schedule_batch)
    chunked_prefill_size: int = 0

    def validate(self) -> None:
        if self.relay not in RELAY_MODES:
            raise ValueError(f"relay must be one of {RELAY_MODES}")
        if self.war_barrier not in WAR_BARRIERS:
            raise ValueError(f"war_barrier must be one of {WAR_BARRIERS}")
        if not 1 <= self.draft_token_num <= 16:
            raise ValueError("draft_token_num must be in 1..16")
        if self.spec_algorithm not in SPEC_ALGORITHMS:
            raise ValueError(f"spec_algorithm must be one of {SPEC_ALGORITHMS}")
        if self.ragged_verify_mode not in RAGGED_VERIFY_MODES:
            raise ValueError(f"ragged_verify_mode must be one of {RAGGED_VERIFY_MODES}")
        if not 2 <= self.req_pool_size <= 4096:
            raise ValueError("req_pool_size must be in 2..4096 (slot 0 is the padding row)")
        if not 1 <= self.cuda_graph_max_bs <= 32:
            raise ValueError("cuda_graph_max_bs must be in 1..32")
        if not 1 <= self.kv_pool_size <= 1 << 20:
            raise ValueError("kv_pool_size must be in 1..1048576")
        if not 8 <= self.context_len <= 4096:
            raise ValueError("context_len must be in 8..4096")
        if not 1 <= self.eagle_topk <= 8:
            raise ValueError("eagle_topk must be in 1..8")
        if self.kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}")
        if not 0 <= self.chunked_prefill_size <= 1 << 16:
            raise ValueError("chunked_prefill_size must be in 0..65536 (0: off)")
        if self.vllm_runner not in ("", "v2"):
            raise ValueError("vllm_runner must be '' (V1) or 'v2' (Model Runner V2)")
        if self.vllm_structured_outputs and self.vllm_runner != "v2":
            raise ValueError("vllm_structured_outputs runs on Model Runner V2 only")
        if not 0.0 <= self.vllm_presence_penalty < 1.0:
            raise ValueError("vllm_presence_penalty must be in [0, 1): the toy model's "
                             "greedy output is known only below 1")
        if self.admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {ADMISSIONS}")
        if self.admission == "optimistic" and self.chunked_prefill_size:
            raise ValueError("optimistic admission with chunked prefill is not modelled (a "
                             "later chunk's slots are not admitted)")
        if self.admission == "optimistic" and self.spec_algorithm == "dspark":
            raise ValueError("optimistic admission is not modelled for the DSpark slice")
        if self.chunked_prefill_size and self.spec_algorithm == "dspark":
            raise ValueError("chunked prefill is not modelled for the DSpark slice (its "
                             "toy worker prefills whole prompts)")
