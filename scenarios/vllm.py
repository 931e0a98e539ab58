"""The vLLM target's scenarios: vLLM's own V1 engine loop with async scheduling and a
draft model (the EAGLE-family path), a hybrid target model, the main stream stalled as
each step's ``execute_model`` starts -- its input uploads, forward and readbacks queue
behind the stall while the host goes on to the next step.

* ``vllm-accepted-count`` -- vLLM #36013: the hybrid model's accepted counts are copied
  device-to-host into pinned memory without a wait (0.17.0 ``gpu_model_runner.py:1229``)
  and read through a numpy view in the next step's attention metadata (``:1776``). As
  shipped the copy is ordered anyway: the valid-count copy stream waits on the main
  stream after it, and the next step synchronises that stream's event before the read
  (``:4003``, ``:1050`` -> ``:4021``) -- the suspicion does not hold as shipped. The
  variant ``no-valid-count-wait`` (that wait dropped) shows the race the fix guards.
* ``vllm-seq-lens-shadow`` -- the drafter's first proposal of a step with no drafts to
  verify increments ``common_attn_metadata._seq_lens_cpu`` in place (0.17.0
  ``spec_decode/eagle.py:581``; 0.13.0 ``:456`` on every step, 0.12.0 did it out of place);
  in 0.13.0-0.18.1 that tensor is the runner's pinned ``seq_lens`` staging buffer, whose
  non-blocking upload to the target forward's ``seq_lens`` (``gpu_model_runner.py:1648``)
  may not have run yet. 0.19.0 keeps a separate optimistic copy. Its stall is the
  previous step's drafter still running (``vllm.previous_drafter_running``); async
  scheduling is an axis (as shipped, ``async-*``, ``sync-*``). Variant ``fixed``: the
  increment made out of place. ``vllm-seq-lens-shadow-amplified``: the same with the
  old start-of-``execute_model`` stall, a declared amplifier.
* ``vllm-input-prep`` -- the reused pinned input buffers (#24527 / #25279): with spec
  decode the valid-count sync also orders the previous step's uploads, so this runs
  without it, where ``prepare_inputs_event`` -- the fence -- is all that does.
* ``vllm-draft-tokens`` -- Model Runner V2's ``DraftTokensHandler`` (a slice: the handler
  is upstream's, the step loop and speculator ours, ``targets/vllm/slices/``): the draft
  tensor, a main-stream temporary, is copied to the host on a side stream with no
  ``record_stream`` up to 0.23.0, so the next step's allocation can take its block before
  the copy reads it. Variant ``fixed``: 0.27.1's ``record_stream``.
* ``vllm-mrv2`` -- Model Runner V2 itself (``targets/vllm/mrv2/``: upstream's MRv2 runner,
  sampler, EAGLE speculator and UVA staging under the same loop, a toy EAGLE head, the
  dense model), main stream stalled per step.
* ``vllm-mrv2-draft-tokens`` -- ``vllm-draft-tokens`` on the whole MRv2 runner: requests
  with structured output (a toy grammar), one proposed token a step, the draft copy
  stream stalled. Variant ``fixed``: 0.27.1's ``record_stream``.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from scenarios.base import AS_INSTALLED, Scenario, stall_at, with_bug, with_fix
from scenarios.workloads import random_workload

VLLM_STALL_MS = 20.0  # the main stream's stall per step (virtual on the simulator)


def _workload(drafts: int):
    """Four requests, staggered; ``drafts`` counts the verified slots of a step (the
    draft model proposes ``drafts - 1`` tokens)."""
    return lambda seed: random_workload(seed, n_requests=4, draft_token_num=drafts,
                                        max_arrive=3, min_tokens=6, max_tokens=14)


VLLM_ACCEPTED_COUNT = Scenario(
    name="vllm-accepted-count",
    summary="vLLM #36013: the hybrid accepted counts' D2H into pinned memory vs the next "
            "step's numpy read; main stream stalled per step",
    # one proposed token a step: the drafter's multi-token loop, where the seq-lens race
    # lives (the other scenario), never runs, so this one judges #36013's pair alone
    workload=_workload(2),
    stalls=stall_at("vllm.before_execute", default_ms=VLLM_STALL_MS),
    variants={AS_INSTALLED: {}, "fixed": {},
              "no-valid-count-wait": with_bug("valid-count-copy-skips-main-wait")},
    default_variant=AS_INSTALLED,
    expect={(AS_INSTALLED, None): "clean", ("no-valid-count-wait", None): "race"},
    sim_trials=3,
)

def _seq_lens_workload(seed: int):
    """Request 0 with a long prompt (40 - 72 tokens) alone at first, so that under a step
    budget of ``SEQ_LENS_CHUNK`` tokens it prefills in chunks: steps where no request has
    drafts to verify -- the only steps where the drafter increments the CPU shadow from
    0.14.0 -- each right after a step whose drafter ran (a partial chunk is drafted from
    too). Three short requests arrive later (iterations 2 - 6) and decode beside it. The
    review's workload, small: a long prompt chunked, nothing decoding yet."""
    import random
    from harness.oracle.workload import RequestSpec, Workload
    from scenarios.workloads import _prompt
    rng = random.Random(seed)
    long = []
    while len(long) < 72:
        long += _prompt(rng)
    reqs = [RequestSpec(0, 0, long[: rng.randint(40, 72)], rng.randint(6, 14))]
    reqs += [RequestSpec(rid, rng.randint(2, 6), _prompt(rng), rng.randint(6, 14))
             for rid in (1, 2, 3)]
    reqs.sort(key=lambda r: (r.arrive, r.rid))
    return Workload(reqs, 3)  # two proposed tokens a step: the drafter's loop runs


SEQ_LENS_CHUNK = 16  # tokens a step (--max-num-batched-tokens): a 40-72 token prompt in 3-5 chunks

# The seq-lens race's configurations. Async scheduling is an axis: as each release ships
# it for an EAGLE-family drafter (the plain names: off in 0.13.0, on from 0.14.0, PR
# #31998), on (async-*: what --async-scheduling asks for, 0.13.0's opt-in), or off
# (sync-*: --no-async-scheduling, or a method or executor vLLM runs without it). The
# model is ``base``'s (the chunked scenario: dense; the amplified one: hybrid) and the
# other one's variants are named for it. Fixes: the increment made out of place, in the
# proposer class each release has it in (``-0.13``: 0.13.0 / 0.14.0's EagleProposer).
def _seq_lens_variants(other: str, **base: Any) -> Dict[str, Any]:
    """The configurations, each with server args ``base`` too; ``other`` names the model
    kind that is not ``base``'s ("dense" or "hybrid")."""
    flip = {"hybrid": not base.get("hybrid", True)}

    def cfg(fix: Optional[str] = None, **args: Any):
        merged = dict(base, **args)
        return with_fix(fix, **merged) if fix else merged
    shipped = {"vllm_async_default": True}
    out: Dict[str, Any] = {AS_INSTALLED: cfg(**shipped), other: cfg(**shipped, **flip),
                           "async": cfg(), f"async-{other}": cfg(**flip),
                           "sync": cfg(overlap=False),
                           f"sync-{other}": cfg(overlap=False, **flip)}
    for suffix, fix in (("", "drafter-increments-out-of-place"),
                        ("-0.13", "drafter-increments-out-of-place-0.13")):
        out[f"fixed{suffix}"] = cfg(fix, **shipped)
        out[f"{other}-fixed{suffix}"] = cfg(fix, **shipped, **flip)
        out[f"async-fixed{suffix}"] = cfg(fix)
        out[f"sync-seq-lens-fixed{suffix}"] = cfg(fix, overlap=False)
    # async scheduling off: the runner hands the drafter its pinned num_computed_tokens
    # too (0.19.0-0.27.1), which it increments in place while the target's upload of
    # them may still be queued
    out["sync-fixed"] = cfg("drafter-num-computed-out-of-place", overlap=False)
    out["sync-fixed-0.19"] = cfg("drafter-num-computed-out-of-place-0.19", overlap=False)
    return out


def _seq_lens_aliased(variants: Dict[str, Any]) -> Dict[str, Any]:
    """The dense configurations under the names they had when the model was hybrid by
    default (``make vllm-gate``, ``tools/gpu/vllm_gpu.sh`` name them): the same runs."""
    return {**variants, "dense": variants[AS_INSTALLED], "dense-fixed": variants["fixed"],
            "sync-dense": variants["sync"]}


def _seq_lens_expect(other: str) -> Dict[Any, str]:
    return {(AS_INSTALLED, None): "race", ("fixed", None): "clean",
            (other, None): "race", (f"{other}-fixed", None): "clean",
            ("async", None): "race", ("async-fixed", None): "clean"}


VLLM_SEQ_LENS_SHADOW = Scenario(
    name="vllm-seq-lens-shadow",
    summary="the drafter's in-place += 1 on the pinned seq_lens staging buffer vs its "
            "pending upload to the target forward (0.13.0-0.18.1), on the steps of a "
            "chunked long prompt; the previous step's drafter still running",
    workload=_seq_lens_workload,
    # upstream's window: up to 0.18.x a step's host has synchronised the previous step's
    # valid-count event, recorded before that step's drafter, so the drafter is what can
    # still hold the main stream when the step queues its seq_lens upload
    # held until upstream's own next sync forces it (None: the simulator's "until
    # forced"; CUDA's default long stall): the drafter outlasts whatever the host does
    # before it next waits on the main stream. (A timed simulator stall is counted from
    # when it is queued, in host time: the host's wait for the step before -- the same
    # length, behind the previous stall -- would use it up before the next upload.)
    stalls=stall_at("vllm.previous_drafter_running"),
    # a dense model: attention that reads seq_lens on the device (FlashAttention, MLA,
    # Triton), as the review's repro (Llama + EAGLE3); variant "hybrid" for the other
    variants=_seq_lens_aliased(
        _seq_lens_variants("hybrid", hybrid=False, chunked_prefill_size=SEQ_LENS_CHUNK)),
    default_variant=AS_INSTALLED,
    expect=_seq_lens_expect("hybrid"),
    sim_trials=3,
)

# Sessions 16-20's seq-lens scenario: the short workload, and the main stream stalled as
# each step's execute_model starts -- a declared amplifier, not a window upstream has
# (the step's own uploads queue behind a stall of the step itself, before the drafter of
# that step writes; in sync mode too, where upstream drains the main stream at every
# step's end). The committed reports of those sessions were made with it.
VLLM_SEQ_LENS_SHADOW_AMPLIFIED = Scenario(
    name="vllm-seq-lens-shadow-amplified",
    summary="vllm-seq-lens-shadow as sessions 16-20 ran it: short prompts, the main "
            "stream held as each step's execute_model starts (an amplifier: wider than "
            "any window upstream has)",
    workload=_workload(3),  # two proposed tokens: the drafter's loop runs
    stalls=stall_at("vllm.before_execute", default_ms=VLLM_STALL_MS),
    variants=_seq_lens_variants("dense"),
    default_variant=AS_INSTALLED,
    expect=_seq_lens_expect("dense"),
    sim_trials=3,
)


VLLM_INPUT_PREP = Scenario(
    name="vllm-input-prep",
    summary="the reused pinned input buffers vs the previous step's queued uploads "
            "(#24527 / #25279), async scheduling without spec decode; main stream stalled",
    workload=_workload(1),  # no drafter: the input-prep fence alone orders the uploads
    stalls=stall_at("vllm.before_execute", default_ms=VLLM_STALL_MS),
    variants={AS_INSTALLED: {}, "fixed": {},
              "no-fence": with_bug("input-prep-fence-dropped"),
              # requests asking for logprobs and prompt logprobs: their host copies
              "logprobs": {"vllm_logprobs": 1}},
    default_variant=AS_INSTALLED,
    expect={(AS_INSTALLED, None): "clean", ("no-fence", None): "race"},
    sim_trials=3,
)

VLLM_DRAFT_TOKENS = Scenario(
    name="vllm-draft-tokens",
    summary="Model Runner V2's draft-token copy for structured outputs: a main-stream "
            "temporary read on a side stream with no record_stream (0.16.0-0.23.0) vs the "
            "next step's allocation; the side stream stalled before each copy",
    workload=_workload(3),
    stalls=stall_at("vllm.before_draft_copy", default_ms=VLLM_STALL_MS),
    variants={AS_INSTALLED: {"vllm_slice": "draft-tokens"},
              "fixed": with_fix("draft-tokens-record-stream", vllm_slice="draft-tokens")},
    default_variant=AS_INSTALLED,
    expect={(AS_INSTALLED, None): "race", ("fixed", None): "clean"},
    sim_trials=3,
)


# Model Runner V2 itself (targets/vllm/mrv2/): upstream's MRv2 GPUModelRunner under the
# same EngineCore / AsyncScheduler loop, with its EAGLE speculator (a toy EAGLE head) and
# the dense toy model (MRv2 has no hybrid path), on the simulator
_MRV2 = {"vllm_runner": "v2", "hybrid": False}


def _mrv2_axes():
    """Configurations a Model Runner V2 server sees beyond the default one, as variants:
    async scheduling off, structured outputs with two proposed tokens, chunked prefill,
    ``num_speculative_tokens`` 1, 3 and 4 (the workload verifies 3 slots: 2 proposed) and
    logprobs. Each is clean on 0.17.0 and runs no census site the default run does not
    (2026-12-07: ``specrace coverage``), so the coverage set leaves them out -- but for
    ``logprobs``
    (requests asking for logprobs and prompt logprobs: clean on 0.17.0 and 0.34.0, its
    host copies 3 more sites on 0.34.0). A presence penalty is not among them: MRv2
    crashes on it in the synchronous reference run (0.17.0: its penalties kernel has no
    stand-in yet)."""
    return {"sync": dict(_MRV2, overlap=False),
            "structured": dict(_MRV2, vllm_structured_outputs=True),
            "logprobs": dict(_MRV2, vllm_logprobs=1),
            "chunked": dict(_MRV2, chunked_prefill_size=SEQ_LENS_CHUNK),
            **{f"spec{k}": dict(_MRV2, draft_token_num=k + 1) for k in (1, 3, 4)}}


VLLM_MRV2 = Scenario(
    name="vllm-mrv2",
    summary="Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER) driven whole: its input prep, "
            "UVA staging, sampler and EAGLE speculator under async scheduling; main "
            "stream stalled per step",
    workload=_workload(3),  # two proposed tokens: the speculator's decode steps run
    stalls=stall_at("vllm.before_execute", default_ms=VLLM_STALL_MS),
    variants={AS_INSTALLED: dict(_MRV2), **_mrv2_axes()},
    default_variant=AS_INSTALLED,
    # as measured on 0.17.0 (eager, lazy, random and pct schedules): its UVA staging
    # rings (two buffers deep) and output copy event order every access
    expect={(AS_INSTALLED, None): "clean"},
    sim_trials=3,
)

_MRV2_STRUCTURED = dict(_MRV2, vllm_structured_outputs=True)

VLLM_MRV2_DRAFT_TOKENS = Scenario(
    name="vllm-mrv2-draft-tokens",
    summary="vllm-draft-tokens on Model Runner V2 driven whole: structured-output "
            "requests, so each step's drafts (one a step: the speculator's temporary) are "
            "copied on a side stream with no record_stream (0.17.0); copy stream stalled",
    # one proposed token a step: the speculator hands back its sampler's temporary (with
    # more it hands back a view of its persistent draft buffer)
    workload=_workload(2),
    stalls=stall_at("vllm.before_draft_copy", default_ms=VLLM_STALL_MS),
    variants={AS_INSTALLED: dict(_MRV2_STRUCTURED),
              "fixed": with_fix("draft-tokens-record-stream", **_MRV2_STRUCTURED)},
    default_variant=AS_INSTALLED,
    # the toy grammar admits one token a step, so a corrupted draft copy is cut by
    # validation and changes no token: the race shows in the detector only
    expect={(AS_INSTALLED, None): "race", ("fixed", None): "clean"},
    sim_trials=3,
)


# S1 of the 0.34.0 audit (reports/upstream/vllm-0.34.0-audit.md, section 3): the sampling
# states (temperature, seeds) live in a two-slot UVA pool the host restages on each step
# with new requests; the drafter copies the current slot after the step's output copy
# event (0.34.0 spec_decode/speculator.py:707-708), and the engine's wait before a step's
# staging covers the step two back only up to that event (a fresh event per output from
# 0.23.0; up to 0.19.0 one event, re-recorded each step). New requests in consecutive
# iterations (a short one each) make the host restage the slot a pending drafter copy
# reads; short budgets finish requests so their request rows are handed out again; the
# main stream is held after the output copy event, before the drafter
# (vllm.before_propose), so that copy runs after the restaging. The drafter's inputs are
# recorded against what the host staged (targets/vllm/mrv2/probe.py).
def _s1_workload(seed: int):
    from harness.oracle.workload import RequestSpec, Workload
    from scenarios.workloads import _prompt
    import random
    rng = random.Random(seed)
    reqs = [RequestSpec(0, 0, _prompt(rng), 24)]  # decodes (and drafts) throughout
    reqs += [RequestSpec(rid, rid, _prompt(rng), rng.randint(1, 3)) for rid in range(1, 9)]
    return Workload(reqs, 3)  # two proposed tokens a step


VLLM_MRV2_UVA_POOL = Scenario(
    name="vllm-mrv2-uva-pool",
    summary="the 0.34.0 audit's S1 on Model Runner V2 driven whole: the drafter's copy of "
            "the sampling states' UVA pool slot after the output copy event vs the "
            "host's restaging of that slot for new requests two steps later; main "
            "stream held before the drafter",
    workload=_s1_workload,
    stalls=stall_at("vllm.before_propose", default_ms=VLLM_STALL_MS),
    variants={AS_INSTALLED: dict(_MRV2)},
    default_variant=AS_INSTALLED,
    # as measured on 0.34.0 (the newest release): the detector reports the drafter's copy
    # (speculator.py:707-708) unordered with the host's restaging (buffer_utils.py:128);
    # the values that differ are only rows of requests that had finished (their drafts
    # discarded), and greedy drafting reads neither: no token differs. 0.17.0/0.17.1:
    # clean (one output event, re-recorded each step, covers the drafter).
    expect={(AS_INSTALLED, None): "race"},
    sim_trials=3,
)
