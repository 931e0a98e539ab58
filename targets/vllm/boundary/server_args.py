"""The vLLM target's server arguments: the toy world's (``toys.server_args``) and vLLM's
own -- the toy model's shape, which of its runners and slices runs, and the request
options that make a runner copy drafts to the host."""
from __future__ import annotations

from dataclasses import dataclass

from toys.server_args import ServerArgs


@dataclass
class VllmArgs(ServerArgs):
    # Whether the toy target model is hybrid (a Mamba-style state picked by the accepted
    # counts: vLLM's hybrid path) or dense attention only
    hybrid: bool = True
    # A slice in place of the whole engine ("": the engine; "draft-tokens": Model Runner
    # V2's draft-token handler, targets/vllm/slices/)
    vllm_slice: str = ""
    # The model runner: "" the V1 GPUModelRunner, "v2" Model Runner V2
    # (vllm/v1/worker/gpu/, upstream's VLLM_USE_V2_MODEL_RUNNER; targets/vllm/mrv2/)
    vllm_runner: str = ""
    # Every request asking for structured output (a toy grammar of the model's own
    # language, targets/vllm/mrv2/grammar.py, installed in the scheduler's structured-output
    # manager): on Model Runner V2 the batches whose drafts it copies to the host; on the
    # V1 runner its grammar bitmask (vllm-v1-draft-copy:structured: no value diverged,
    # 0.17.0)
    vllm_structured_outputs: bool = False
    # The requests' presence penalty (0: none). Any penalty makes the V1 runner copy each
    # step's drafts to the host (for the penalties' token history); a toy logit is 1 for
    # the successor and 0 elsewhere, so a penalty below 1 leaves the greedy output -- what
    # the model oracle knows -- unchanged
    vllm_presence_penalty: float = 0.0
    # The requests' logprobs and prompt logprobs (0: none asked): the sampler's logprobs
    # and their copies to the host (V1 LogprobsTensors, the prompt-logprobs chunks)
    vllm_logprobs: int = 0
    # Async scheduling where ``overlap`` is on: False, on (as ``--async-scheduling``
    # asks); True, as the installed release has it by default for an EAGLE-family drafter
    # (off in 0.13.0, on from 0.14.0, PR #31998; targets/vllm/engine/loop.py:
    # release_async_default). ``overlap`` False is off either way
    vllm_async_default: bool = False

    def validate(self) -> None:
        super().validate()
        if self.vllm_runner not in ("", "v2"):
            raise ValueError("vllm_runner must be '' (V1) or 'v2' (Model Runner V2)")
        if not 0 <= self.vllm_logprobs <= 20:
            raise ValueError("vllm_logprobs must be in 0..20 (vLLM's default cap)")
        if not 0.0 <= self.vllm_presence_penalty < 1.0:
            raise ValueError("vllm_presence_penalty must be in [0, 1): the toy model's "
                             "greedy output is known only below 1")
