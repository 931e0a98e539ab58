"""Seeded bugs in vLLM's Model Runner V2 (``vllm/v1/worker/gpu/``), as the vLLM target
drives it whole (``targets/vllm/mrv2/``; scenarios ``vllm-mrv2`` and
``vllm-mrv2-draft-tokens``). Each is a run-time source patch of one upstream function
(``seams.sourcepatch``), applied for one run and reverted; the snippets are upstream's
own lines (vLLM 0.17.0), so a release that moved them disables the mutation there, named.

The classes are the ones MRv2's design leans on, each a line its authors wrote to order
two streams, or the host and a stream, and each the kind of line a refactor drops or a
tuning shrinks -- the same classes vLLM's V1 runner shipped and fixed (#36013's missing
event, #24527 / #25279's pinned buffers rewritten under a queued upload, the draft-token
copy's missing ``record_stream``):

* the async output copy (``AsyncOutput``): the copy stream's wait on the main stream,
  the event that covers every copy (and a copy moved after it), the host's sync on it,
  and the references that keep the main stream's tensors alive until the side-stream
  copy has read them (upstream's own ``NOTE(woosuk)`` says why: without them, or a
  ``record_stream``, the caching allocator hands the blocks on -- the draft-token race's
  class);
* the UVA staging rings (``UvaBufferPool`` under ``UvaBackedTensor`` and
  ``StagedWriteTensor``): two buffers deep because with async scheduling the host stages
  step N+1 while step N's kernels still read their UVA views (step N+2's staging comes
  after step N's output sync). A ring made one deep (a smaller ``max_concurrency`` to
  save pinned memory), a round robin that stops advancing, or a device view left on the
  old buffer rewrites a slot before its readers retire -- with UVA there is no copy to
  wait on, so nothing else orders them;
* the structured-outputs bitmask (``StructuredOutputsWorker``): the H2D copies on a side
  stream the main stream must join before its kernel reads them, and the side stream's
  wait before it reuses the persistent buffers (``NEEDS_LIVE_GLOBALS``, below);
* the draft-token copy (``DraftTokensHandler``): the copy moved off the stream its event
  is recorded on, so the event no longer covers it.

The draft-token handler's dropped wait, record and sync are ``mutations/vllm.py``'s
(``draft-copy-*``), probed on the draft-token slice.
"""
from __future__ import annotations

from typing import List

from mutations.base import M, Mutation

_GPU = "vllm.v1.worker.gpu"
_OUTPUT = f"{_GPU}.async_utils:AsyncOutput"
_BUFFERS = f"{_GPU}.buffer_utils"
_GRAMMAR = f"{_GPU}.structured_outputs:StructuredOutputsWorker"
_DRAFTS = f"{_GPU}.spec_decode.utils:DraftTokensHandler"

MRV2 = ("vllm-mrv2", "vllm-mrv2-lazy")
MRV2_DRAFT = ("vllm-mrv2-draft", "vllm-mrv2-draft-lazy")
ANY = MRV2 + MRV2_DRAFT


MUTATIONS: List[Mutation] = [
    # --- the async output copy --------------------------------------------------------
    M("mrv2-output-copy-skips-main-wait",
      "AsyncOutput copies the sampled tokens and counts on the output copy stream without "
      "waiting for the main stream (the sampler and rejection sampler that write them)",
      "MRv2 async output", f"{_OUTPUT}.__init__",
      [("            copy_stream.wait_stream(main_stream)\n", "")],
      ANY),
    M("mrv2-output-event-not-recorded",
      "AsyncOutput records no event after its copies: get_output's synchronize() waits "
      "for nothing",
      "MRv2 async output", f"{_OUTPUT}.__init__",
      [("            self.copy_event.record(copy_stream)\n", "")],
      ANY),
    M("mrv2-output-not-awaited",
      "AsyncOutput.get_output reads the pinned sampled tokens without synchronising their "
      "copy's event",
      "MRv2 async output", f"{_OUTPUT}.get_output",
      [("        self.copy_event.synchronize()\n", "")],
      ANY),
    M("mrv2-output-count-copied-after-event",
      "AsyncOutput queues the sampled counts' copy after recording the event: "
      "get_output's sync no longer covers it",
      "MRv2 async output", f"{_OUTPUT}.__init__",
      [("            self.num_sampled_tokens_np = async_copy_to_np(num_sampled_tokens)\n", ""),
       ("            self.copy_event.record(copy_stream)\n",
        "            self.copy_event.record(copy_stream)\n"
        "            self.num_sampled_tokens_np = async_copy_to_np(num_sampled_tokens)\n")],
      ANY),
    M("mrv2-output-tensors-not-retained",
      "AsyncOutput keeps no reference to the main stream's sampler output and counts: "
      "freed as sample_tokens returns, their blocks go to the next step's allocations "
      "while the copy stream may not have read them (no record_stream either)",
      "MRv2 async output (upstream's NOTE: retain the GPU tensors)", f"{_OUTPUT}.__init__",
      [("        self.sampler_output = sampler_output\n"
        "        self.num_sampled_tokens = num_sampled_tokens\n", "")],
      ANY),
    # --- the UVA staging rings --------------------------------------------------------
    M("mrv2-uva-ring-one-deep",
      "UvaBackedTensor stages through a ring one buffer deep: the host rewrites the UVA "
      "buffer step N's kernels (block-table gather, sampler) still read",
      "MRv2 UVA staging", f"{_BUFFERS}:UvaBackedTensor.__init__",
      [("        self, size: int | Sequence[int], dtype: torch.dtype, max_concurrency: int = 2\n",
        "        self, size: int | Sequence[int], dtype: torch.dtype, max_concurrency: int = 1\n")],
      ANY),
    M("mrv2-staged-write-ring-one-deep",
      "StagedWriteTensor stages its write indices, starts and lengths through rings one "
      "buffer deep: a step's writes overwrite the previous step's before its write kernel "
      "read them",
      "MRv2 UVA staging", f"{_BUFFERS}:StagedWriteTensor.__init__",
      [("        max_concurrency: int = 2,\n", "        max_concurrency: int = 1,\n")],
      ANY),
    M("mrv2-uva-view-not-repointed",
      "UvaBackedTensor.copy_to_uva stages into the ring's next buffer but leaves the "
      "device view on the buffer it pointed at before: readers keep one buffer, which the "
      "host rewrites every other staging",
      "MRv2 UVA staging", f"{_BUFFERS}:UvaBackedTensor.copy_to_uva",
      [("        self.gpu = self.pool.copy_to_uva(self.np[:n] if n is not None else self.np)\n",
        "        self.pool.copy_to_uva(self.np[:n] if n is not None else self.np)\n")],
      ANY),
    M("mrv2-uva-ring-not-advanced",
      "UvaBufferPool.copy_to_uva no longer advances its round robin: every staging goes "
      "to the buffer the previous step's kernels read",
      "MRv2 UVA staging", f"{_BUFFERS}:UvaBufferPool.copy_to_uva",
      [("        self._curr = (self._curr + 1) % self.max_concurrency\n", "")],
      ANY),
    # --- the draft-token copy -----------------------------------------------------------
    M("mrv2-draft-copy-off-its-stream",
      "DraftTokensHandler queues the drafts' D2H on the main stream but records its event "
      "on the copy stream: get_draft_tokens' sync does not cover the copy",
      "MRv2 draft tokens", f"{_DRAFTS}.set_draft_tokens",
      [("        with torch.cuda.stream(self.copy_stream):\n"
        "            self.draft_tokens_np = async_copy_to_np(draft_tokens)\n",
        "        self.draft_tokens_np = async_copy_to_np(draft_tokens)\n"
        "        with torch.cuda.stream(self.copy_stream):\n")],
      MRV2_DRAFT),
]

# Seeded bugs in functions that launch a Triton kernel by its module-level name: they need
# a source patch that looks its globals up live (seams.sourcepatch defines the patched
# function in the module's own namespace), or the patched function would launch the Triton
# original instead of the run's stand-in (targets/vllm/mrv2/seams.py).
NEEDS_LIVE_GLOBALS: List[Mutation] = [
    M("mrv2-bitmask-kernel-skips-copy-wait",
      "the grammar bitmask kernel is launched on the main stream without joining the copy "
      "stream that uploads the bitmask and its logits indices",
      "MRv2 structured outputs", f"{_GRAMMAR}.apply_grammar_bitmask",
      [("        current_stream.wait_stream(self.copy_stream)\n", "")],
      MRV2_DRAFT),
    M("mrv2-bitmask-buffer-reused-early",
      "the copy stream no longer waits for the bitmask kernel before its next upload into "
      "the persistent bitmask and index buffers",
      "MRv2 structured outputs", f"{_GRAMMAR}.apply_grammar_bitmask",
      [("        self.copy_stream.wait_stream(current_stream)\n", "")],
      MRV2_DRAFT,
      equivalent="with speculative decoding and structured outputs, 0.17.0's "
                 "EngineCore.step_with_batch_queue defers a step's sampling -- and so its "
                 "bitmask upload -- until the previous step's output has been fetched "
                 "(pending_structured_output_tokens): AsyncOutput's event sync has then "
                 "ordered the host after that step's sampler, hence after its bitmask "
                 "kernel; the copy stream's wait on the main stream is defence in depth "
                 "there (a step sampled without deferral would need it)"),
]
MUTATIONS += NEEDS_LIVE_GLOBALS
