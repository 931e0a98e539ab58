"""Seeded bugs and candidate fixes in the installed vLLM: each a run-time source patch of
one upstream function (``seams.sourcepatch``), applied for one run and reverted -- the
installed files are never edited. Snippets are upstream's own lines (vLLM 0.17.0); a
release that moved them disables the mutation there, named.

The bug classes are vLLM's own history with async scheduling and spec decode: a dropped
event or wait on a side-stream copy (#36013), the reused pinned input buffers rewritten
while the previous step's upload is queued (#24527 / #25279: the input-prep fence), the
output readback not awaited, the device-side relay of sampled tokens and counts from
one step to the next, and (Model Runner V2) a CUDA graph whose static output no replay
writes.
"""
from __future__ import annotations

from typing import Dict, List, Union

from mutations.base import M, Mutation
from mutations.vllm_mrv2 import MRV2
from seams.sourcepatch import PatchSet, SourcePatch

_RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
_OUTPUT = "vllm.v1.worker.gpu_model_runner:AsyncGPUModelRunnerOutput"
_DRAFTER = "vllm.v1.spec_decode.eagle:SpecDecodeBaseProposer"
_ASYNC = "vllm.v1.core.sched.async_scheduler:AsyncScheduler"
_DRAFTS = "vllm.v1.worker.gpu.spec_decode.utils:DraftTokensHandler"
_GRAPHS = "vllm.v1.worker.gpu.cudagraph_utils:CudaGraphManager"

COUNT = ("vllm-count", "vllm-count-lazy")
SEQ_LENS = ("vllm-seq-lens", "vllm-seq-lens-lazy")
INPUT_PREP = ("vllm-input-prep", "vllm-input-prep-lazy")
ANY = COUNT + SEQ_LENS + INPUT_PREP
DRAFT = ("vllm-draft", "vllm-draft-lazy")


MUTATIONS: List[Mutation] = [
    # --- the valid-count relay and the accepted counts (#36013) ---------------------
    M("valid-count-copy-skips-main-wait",
      "the valid-count copy stream no longer waits on the main stream: its D2H may read "
      "the counts before the sampler wrote them, and the accepted counts' D2H (#36013) "
      "loses the ordering that masked it",
      "vLLM #36013", f"{_RUNNER}._copy_valid_sampled_token_count",
      [("            self.valid_sampled_token_count_copy_stream.wait_stream(default_stream)"
        "  # type: ignore\n", "")],
      ANY),
    M("valid-count-event-not-synced",
      "the next step reads the pinned valid counts without synchronising their copy's "
      "event",
      "vLLM #36013 (the sync that masks it)", f"{_RUNNER}._get_valid_sampled_token_count",
      [("        sampled_count_event.synchronize()\n", "")],
      ANY),
    M("valid-count-event-not-recorded",
      "the valid-count copy records no event: the next step's synchronize() waits for "
      "nothing",
      "vLLM #36013", f"{_RUNNER}._copy_valid_sampled_token_count",
      [("            self.valid_sampled_token_count_event.record()\n", "")],
      ANY),
    M("prev-sampled-ids-not-relayed",
      "the sampled tokens are not kept on the device for the next step's input ids (nor "
      "is the valid-count sync armed)",
      "async scheduling x spec decode (#24799)", f"{_RUNNER}._copy_valid_sampled_token_count",
      [("        self.input_batch.prev_sampled_token_ids = next_token_ids.unsqueeze(1)\n",
        "")],
      ANY),
    M("num-computed-not-corrected",
      "the next step skips the valid-count correction of each request's computed tokens",
      "async scheduling x spec decode (#24799)", f"{_RUNNER}._update_states",
      [("        valid_sampled_token_count = self._get_valid_sampled_token_count()\n",
        "        valid_sampled_token_count = []\n")],
      ANY),
    M("accepted-count-off-by-one",
      "the hybrid accepted counts are one short (the index of the last accepted token)",
      "hybrid spec decode (#36013's value)", f"{_RUNNER}._update_states_after_model_execute",
      [("            .argmax(-1)\n", "            .argmax(-1)\n            - 1\n")],
      ANY),
    # --- the reused pinned input buffers (#24527 / #25279) ---------------------------
    M("input-prep-fence-dropped",
      "the host rewrites the pinned input buffers without waiting for the previous "
      "step's uploads (no prepare_inputs_event.synchronize())",
      "vLLM #24527 / #25279", f"{_RUNNER}.synchronize_input_prep",
      [("        self.prepare_inputs_event.synchronize()\n", "")],
      ANY),
    M("input-prep-event-not-recorded",
      "the input-prep fence's event is never recorded: the next step's synchronize() "
      "waits for nothing",
      "vLLM #24527 / #25279", f"{_RUNNER}.synchronize_input_prep",
      [("            self.prepare_inputs_event.record()\n", "            pass\n")],
      ANY),
    # --- the output readback ---------------------------------------------------------
    M("output-copy-skips-main-wait",
      "the sampled tokens' D2H on the output copy stream no longer waits for the main "
      "stream (the sampler)",
      "async output copy", f"{_OUTPUT}.__init__",
      [("            async_output_copy_stream.wait_stream(default_stream)\n"
        "            self.sampled_token_ids_cpu = self._sampled_token_ids.to(\n",
        "            self.sampled_token_ids_cpu = self._sampled_token_ids.to(\n")],
      ANY),
    M("output-copy-not-awaited",
      "get_output reads the pinned sampled tokens without synchronising their copy",
      "async output copy", f"{_OUTPUT}.get_output",
      [("        max_gen_len = self.sampled_token_ids_cpu.shape[-1]\n"
        "        self.async_copy_ready_event.synchronize()\n",
        "        max_gen_len = self.sampled_token_ids_cpu.shape[-1]\n")],
      ANY),
    M("output-copy-event-not-recorded",
      "the output copy records no event: get_output's synchronize() waits for nothing",
      "async output copy", f"{_OUTPUT}.__init__",
      [("                else None\n"
        "            )\n"
        "            self.async_copy_ready_event.record()\n",
        "                else None\n"
        "            )\n")],
      ANY),
    # --- Model Runner V2's draft-token handler (the draft-token slice) --------------------
    M("draft-copy-skips-main-wait",
      "DraftTokensHandler.set_draft_tokens copies the drafts on its stream without waiting "
      "for the main stream (the speculator that writes them)",
      "MRv2 draft tokens", f"{_DRAFTS}.set_draft_tokens",
      [("        self.copy_stream.wait_stream(current_stream)\n", "")],
      DRAFT),
    M("draft-copy-event-not-recorded",
      "the draft copy records no event: get_draft_tokens' synchronize() waits for nothing",
      "MRv2 draft tokens", f"{_DRAFTS}.set_draft_tokens",
      [("            self.copy_event.record()\n", "")],
      DRAFT),
    M("draft-copy-not-awaited",
      "get_draft_tokens reads the pinned drafts without synchronising their copy",
      "MRv2 draft tokens", f"{_DRAFTS}.get_draft_tokens",
      [("            self.copy_event.synchronize()\n", "")],
      DRAFT),
    # --- the scheduler's placeholders ---------------------------------------------------
    M("placeholders-miss-spec-tokens",
      "the async scheduler reserves one output placeholder per step, not one per token "
      "the step may produce (1 + its drafts)",
      "AsyncScheduler._update_after_schedule", f"{_ASYNC}._update_after_schedule",
      [("            request.num_output_placeholders += 1 + cur_num_spec_tokens\n",
        "            request.num_output_placeholders += 1\n")],
      ANY),
    # --- Model Runner V2's CUDA graphs (targets/vllm/engine/graphs.py) -----------------
    M("mrv2-graph-output-copied-after-capture",
      "the target model's graph leaves its output in the capture's own tensor: the copy "
      "into the static hidden states runs once, eagerly, after the capture, so every "
      "replay's decode step reads the hidden states of no step (a refactor that moves "
      "the copy out of the capture block)",
      "MRv2 CudaGraphManager (static output buffers)", f"{_GRAPHS}._capture_full_graph",
      [("            self.hidden_states[:num_tokens] = hidden_states\n", ""),
       ("        self.graphs[num_tokens] = graph\n",
        "        self.hidden_states[:num_tokens] = hidden_states\n"
        "        self.graphs[num_tokens] = graph\n")],
      MRV2),
]

# vllm-v1-draft-copy: the two orderings the V1 draft-ids copy lacks (one function, so one
# patch each; ``draft-ids-copy-ordered`` is both)
_COPY = f"{_RUNNER}._copy_draft_token_ids_to_cpu"
_ZEROS_IN_STREAM_ORDER = (
    # zeros too go through the copy stream, queued after the previous step's copy, instead
    # of a host write that copy can land on: the zeros tensor the near-max-length path
    # built is copied like any drafts (no host sync, one tiny copy on a rare step)
    "            if not zeros_only:\n",
    "            if True:  # zeros_only too: in the copy stream's order, not a host write\n")
_RECORD_STREAM = (
    # the drafts tensor marked as used on the copy stream: the allocator keeps its block
    # until the copy has read it (what Model Runner V2's DraftTokensHandler does from 0.27.1)
    "            self.draft_token_ids_event.record()\n",
    "            draft_token_ids.record_stream(self.draft_token_ids_copy_stream)\n"
    "            self.draft_token_ids_event.record()\n")

_DRAFT_IDS_ORDERED = SourcePatch(_COPY, (_ZEROS_IN_STREAM_ORDER, _RECORD_STREAM),
                                 "fix draft-ids-copy-ordered")
# vllm-seq-lens-shadow's cheapest fix: the drafter increments a copy of the CPU shadow of
# seq_lens, never the runner's pinned staging buffer it aliases (what its own comment asks
# of the device-side seq_lens: no in-place update under async scheduling); no sync added
_SEQ_LENS_OUT_OF_PLACE = SourcePatch(
    f"{_DRAFTER}.propose",
    (("                common_attn_metadata._seq_lens_cpu += 1\n",
      "                common_attn_metadata._seq_lens_cpu = (\n"
      "                    common_attn_metadata._seq_lens_cpu + 1)\n"),),
    "fix drafter-increments-out-of-place")

# vllm-seq-lens-shadow --variant sync: the same in-place increment, of the CPU shadow of
# num_computed_tokens, which with async scheduling off is a view of the input batch's
# pinned tensor whose non-blocking upload the target forward reads (0.19.0-0.27.1; the
# drafter body moved to llm_base_proposer.py in 0.23.0; 0.33.0 no longer increments it)
_NUM_COMPUTED = "common_attn_metadata._num_computed_tokens_cpu"


def _num_computed_out_of_place(indent: str):
    return (f"{indent}{_NUM_COMPUTED} += 1\n",
            f"{indent}{_NUM_COMPUTED} = (\n{indent}    {_NUM_COMPUTED} + 1)\n")


FIXES: Dict[str, Union[SourcePatch, PatchSet]] = {
    "drafter-num-computed-out-of-place": SourcePatch(
        "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer."
        "_update_positions_dependent_metadata", (_num_computed_out_of_place(" " * 12),),
        "fix drafter-num-computed-out-of-place"),
    "drafter-num-computed-out-of-place-0.19": SourcePatch(
        f"{_DRAFTER}.propose", (_num_computed_out_of_place(" " * 16),),
        "fix drafter-num-computed-out-of-place (0.19.0's drafter)"),
    "draft-ids-copy-ordered": _DRAFT_IDS_ORDERED,
    "draft-ids-zeros-in-stream-order": SourcePatch(_COPY, (_ZEROS_IN_STREAM_ORDER,),
                                                   "fix draft-ids-zeros-in-stream-order"),
    "draft-ids-record-stream": SourcePatch(_COPY, (_RECORD_STREAM,),
                                           "fix draft-ids-record-stream"),
    # 0.16.0-0.18.0 ship the seq-lens race too, on the same steps: both fixes
    "draft-ids-copy-ordered+seq-lens": PatchSet((_DRAFT_IDS_ORDERED, _SEQ_LENS_OUT_OF_PLACE),
                                                "fix draft-ids-copy-ordered + "
                                                "drafter-increments-out-of-place"),
    "drafter-increments-out-of-place": _SEQ_LENS_OUT_OF_PLACE,
    # the same fix in 0.13.0 / 0.14.0's drafter, before the proposer loop moved into a
    # base class (EagleProposer.propose: 0.13.0 spec_decode/eagle.py:456, 0.14.0 :471)
    "drafter-increments-out-of-place-0.13": SourcePatch(
        "vllm.v1.spec_decode.eagle:EagleProposer.propose", _SEQ_LENS_OUT_OF_PLACE.edits,
        "fix drafter-increments-out-of-place (0.13.0 / 0.14.0's drafter)"),
    # vllm-draft-tokens: what 0.27.1 added -- the main stream's draft temporary marked as
    # used on the copy stream, so the allocator keeps its block until the copy has run
    "draft-tokens-record-stream": SourcePatch(
        "vllm.v1.worker.gpu.spec_decode.utils:DraftTokensHandler.set_draft_tokens",
        # (placed before the event's record, a line every release has; where the release
        # has the fix already -- 0.27.1 on -- it marks the tensor a second time, harmless)
        (("            self.copy_event.record()\n",
          "            draft_tokens.record_stream(self.copy_stream)\n"
          "            self.copy_event.record()\n"),),
        "fix draft-tokens-record-stream"),
}
