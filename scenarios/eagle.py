"""Upstream's EAGLE v2 overlap path on the sglang target (``spec_algorithm="eagle-v2"``,
``targets/sglang/slices/eagle.py``): ``EAGLEWorkerV2`` (draft, verify, publish, draft extend),
the FutureMap's EAGLE relay and ``EagleDraftInput``'s filter/merge, under upstream's loop,
with the pools of the slot-reuse workload (rows and KV slots handed from finished requests
to waiting ones).

* ``eagle-v2``: the forward stream is stalled before the verify (the draft has read the
  relayed state and the rows; the verify and the draft extend are late), and again after
  each runner's read-done -- the schedule stream's next filter/merge, relay stash and row
  rewrites must wait only for what upstream orders them after. Variant ``plan-stream``
  runs verify and draft-extend preparation on upstream's plan streams
  (``SGLANG_ENABLE_OVERLAP_PLAN_STREAM``).
"""
import dataclasses

from scenarios.axes import engage
from scenarios.base import AS_INSTALLED, Scenario, stall_at, with_bug
from scenarios.grammar import grammar_workload
from scenarios.workloads import slot_reuse_workload

_EAGLE = {"spec_algorithm": "eagle-v2"}


def eagle_workload(seed: int):
    return dataclasses.replace(slot_reuse_workload(seed), kv_pool_size=128)


EAGLE_V2 = Scenario(
    name="eagle-v2",
    summary="upstream's EAGLE v2 worker (draft, verify, publish, draft extend) and its "
            "relay under upstream's loop, rows reused; forward stalled before the verify "
            "and after read-done",
    workload=eagle_workload,
    stalls=stall_at("forward.before_verify", "forward.after_read_done"),
    # "fixed" is the release's code as it is (no seeded bug; "as-installed" copies it)
    variants={"fixed": dict(_EAGLE),
              "plan-stream": {**_EAGLE, "plan_stream": True},
              # a tree draft: topk 2 over 3 steps, 4 verify nodes (the accepted path's
              # KV moved to the window's front, move_accept_tokens_to_target_kvcache)
              "topk2": {**_EAGLE, **engage("tree-topk")},
              "topk2-plan-stream": {**_EAGLE, **engage("tree-topk"), "plan_stream": True},
              # an attention backend without CPU seq lens (FA3, Triton, TRT-LLM MHA): the
              # relay skips its host mirror and the draft extend plans on the GPU alone
              "no-cpu-seq-lens": {**_EAGLE, "needs_cpu_seq_lens": False},
              "no-cpu-seq-lens-plan-stream": {**_EAGLE, "needs_cpu_seq_lens": False,
                                              "plan_stream": True},
              # EAGLE3's shape: the target's aux hidden states (three layers) feed the
              # draft, through the same v2 worker
              "eagle3": {**_EAGLE, "eagle3": True},
              # every request asks penalties (upstream's penalizers: their state filtered,
              # merged and accumulated on the schedule stream, folded into the forward's
              # copy of the sampling info and added to the verify's logits), small enough
              # that the greedy output stays the target model's
              "penalties": {**_EAGLE, **engage("penalties")},
              # retraction (upstream's release_req): the long request and two short ones
              # give their rows back with a step in flight and are prefilled again
              "retract": {**_EAGLE, "retract_at": ((0, 9), (3, 2), (6, 2))},
              # chunked prefill (3 tokens a prefill) with the same retractions: upstream's
              # EAGLE worker prefills each chunk as an extend of its own (it has no
              # chunk-specific path), the loop keeps the chunked request out of the merge
              "chunked-retract": {**_EAGLE, "chunked_prefill_size": 3,
                                  "retract_at": ((0, 9), (3, 2), (6, 2))},
              # the WAR barrier removed: the next iteration's row writes may overtake the
              # draft extend's (and a finished request's verify's) reads of the rows
              "no-war-barrier": with_bug("war-barrier-removed", **_EAGLE)},
    default_variant=AS_INSTALLED,
    expect={(AS_INSTALLED, None): "clean", ("plan-stream", None): "clean",
            ("topk2", None): "clean", ("topk2-plan-stream", None): "clean",
            ("no-cpu-seq-lens", None): "clean", ("no-cpu-seq-lens-plan-stream", None): "clean",
            ("eagle3", None): "clean", ("retract", None): "clean",
            ("penalties", None): "clean",
            ("chunked-retract", None): "clean",
            ("no-war-barrier", None): "race"},
    sim_trials=6,
)

EAGLE_V2_GRAMMAR = Scenario(
    name="eagle-v2-grammar",
    summary="upstream's EAGLE v2 worker on JSON-schema requests: the verify's GrammarTree "
            "D2H and mask behind the scheduler's grammar barrier; forward stalled before "
            "the verify and after read-done",
    workload=grammar_workload,
    stalls=EAGLE_V2.stalls,
    variants={"fixed": dict(_EAGLE), "plan-stream": {**_EAGLE, "plan_stream": True},
              "topk2": {**_EAGLE, **engage("tree-topk")}},
    default_variant=AS_INSTALLED,
    expect={(AS_INSTALLED, None): "clean", ("plan-stream", None): "clean",
            ("topk2", None): "clean"},
    sim_trials=6,
)
