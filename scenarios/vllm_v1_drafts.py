"""vLLM V1's draft-token host copy near the drafter's length limit (the 0.34.0 audit's
suspicion S3, ``reports/upstream/vllm-0.34.0-audit.md``).

When a request needs its drafts on the host -- penalties, bad words or structured output
-- ``GPUModelRunner._copy_draft_token_ids_to_cpu`` (0.16.0-0.33.0) queues each step's
drafts device-to-host on a side stream into one pinned buffer, records an event, and a
later step synchronises that event before reading the rows. Two things the copy is not
ordered against when the next step schedules no drafts (so nothing synchronised it):

* a step whose batch no longer fits the drafter (a request near ``max_model_len``) takes
  ``zeros_only``: the host writes zeros into the same pinned rows while the previous
  step's copy may still be queued, and that copy lands after them (WAW on the buffer);
* the drafts tensor is a main-stream temporary the runner drops at the next
  ``sample_tokens`` (no ``record_stream``): the allocator hands its block to that step's
  main-stream work before the copy has read it (WAR across a reuse), so the copy that
  lands carries whatever the block holds by then.

The host then reads rows it zeroed and gets an earlier step's drafts, or garbage, as the
next step's spec-token history (``update_async_spec_token_ids``: penalties, bad words) or
structured output's draft validation. The judge: ``draft_rows_zeroed`` (every zeroed row
reads zeros), beside the detector and the model oracle.

Workload: one long request that reaches ``max_model_len`` (so the batch stops fitting the
drafter) beside short ones arriving around it; a presence penalty (below 1: the greedy
output is unchanged, the copy is made); two proposed tokens a step (with one, a batch
stops fitting the drafter only on a request's very last step) -- on 0.16.0-0.18.0 the
drafter's multi-token loop then runs their seq-lens race too (variant ``fixed-seq-lens``:
both fixes). The main stream is stalled as
each step starts and the copy stream before each copy.
"""
from __future__ import annotations

import random

from harness.oracle.workload import RequestSpec, Workload
from scenarios.base import AS_INSTALLED, Scenario, stall_at, with_fix
from scenarios.workloads import _cycle_prompt
from targets.vllm.engine.loop import MAX_MODEL_LEN

STALL_MS = 20.0
_ARGS = {"hybrid": False, "vllm_presence_penalty": 0.5}


def near_max_len_workload(seed: int) -> Workload:
    """Request 0's prompt is 14-18 tokens short of ``max_model_len`` and its budget
    reaches it (a successor cycle: no EOS before); three short requests arrive over its
    last steps."""
    rng = random.Random(seed)
    prompt_len = MAX_MODEL_LEN - rng.randint(14, 18)
    long_prompt = (_cycle_prompt(rng, 3) * MAX_MODEL_LEN)[:prompt_len]
    reqs = [RequestSpec(0, 0, long_prompt, MAX_MODEL_LEN - prompt_len)]
    for rid in range(1, 4):
        reqs.append(RequestSpec(rid, rng.randint(1, 14), _cycle_prompt(rng, 3), 6))
    reqs.sort(key=lambda r: (r.arrive, r.rid))
    return Workload(reqs, 3)


VLLM_V1_DRAFT_COPY = Scenario(
    name="vllm-v1-draft-copy",
    summary="vLLM V1's draft-token copy to pinned host rows vs the zeros the host writes "
            "there near max_model_len, and vs the drafts' freed block (0.16.0-0.33.0); "
            "presence penalty, main and copy streams stalled",
    workload=near_max_len_workload,
    stalls=stall_at("vllm.before_execute", "vllm.before_draft_copy", default_ms=STALL_MS),
    variants={AS_INSTALLED: dict(_ARGS),
              "fixed": with_fix("draft-ids-copy-ordered", **_ARGS),
              "zeros-in-stream-order": with_fix("draft-ids-zeros-in-stream-order", **_ARGS),
              "record-stream": with_fix("draft-ids-record-stream", **_ARGS),
              # 0.16.0-0.18.0: their seq-lens race (vllm-seq-lens-shadow) runs on the
              # same steps; both fixes
              "fixed-seq-lens": with_fix("draft-ids-copy-ordered+seq-lens", **_ARGS),
              "seq-lens-fixed-only": with_fix("drafter-increments-out-of-place", **_ARGS),
              # the copy's other trigger: structured-output requests (the toy grammar on
              # V1: upstream's apply_grammar_bitmask runs; no value diverged, 0.17.0)
              "structured": {"hybrid": False, "vllm_structured_outputs": True}},
    default_variant=AS_INSTALLED,
    expect={(AS_INSTALLED, None): "race", ("fixed", None): "clean"},
    sim_trials=8,
)
