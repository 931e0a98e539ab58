"""The probes of the mutation matrix: a scenario run under one schedule on a few seeds,
one catalogue for every target (a target runs the probes whose scenario it supports)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple


@dataclass(frozen=True)
class Probe:
    name: str
    scenario: str
    variant: str
    policy: str
    seeds: Tuple[int, ...] = (0, 1, 2)
    war_barrier: str = "fine"


def _eager_and_lazy(name: str, scenario: str, variant: str, **kw) -> Tuple[Probe, Probe]:
    """A probe under the eager schedule and its twin ``<name>-lazy`` under the lazy one:
    the two orders that bracket a race (the reader first, the writer first)."""
    return (Probe(name, scenario, variant, "eager", **kw),
            Probe(f"{name}-lazy", scenario, variant, "lazy", **kw))


PROBES: Dict[str, Probe] = {p.name: p for p in (
    Probe("seed-eager", "ngram-filter-race", "fixed", "eager"),
    Probe("seed-lazy", "ngram-filter-race", "fixed", "lazy"),
    Probe("seed-stall", "ngram-filter-race", "fixed", "stall(forward)"),
    Probe("grammar-ngram", "grammar-ngram", "fixed", "eager", seeds=(0, 1)),
    Probe("grammar-eagle", "grammar-tree-staging", "fixed", "eager", seeds=(0, 1)),
    Probe("grammar-lazy", "grammar-ngram", "fixed", "lazy", seeds=(0, 1)),
    Probe("mixed-overlap", "mixed-overlap", "fixed", "stall(forward)", seeds=(0, 1)),
    # read-done published only by graph replays: extends and graphs-off steps take the
    # coarse fallback (the sglang target)
    Probe("graph-eligibility", "ngram-graph-eligibility", "fixed", "eager", seeds=(0, 1)),
    Probe("graph-eligibility-off", "ngram-graph-eligibility", "fixed-graphs-off", "lazy",
          seeds=(0, 1)),
    Probe("dp-idle", "dp-idle", "fixed", "lazy", seeds=(0, 1)),
    Probe("slot-reuse", "slot-reuse", "fixed", "eager"),
    Probe("slot-reuse-stall", "slot-reuse", "fixed", "stall(forward)"),
    # the memory pools behind the WAR barrier: rows and slots reused, the forward stalled
    # before its attention gathers req_to_token and after it records read-done
    *_eager_and_lazy("kv-reuse", "kv-row-reuse", "fixed"),
    *_eager_and_lazy("kv-reuse-swa", "kv-row-reuse", "swa"),
    *_eager_and_lazy("kv-reuse-eagle", "kv-row-reuse", "eagle"),
    *_eager_and_lazy("kv-retract", "kv-row-reuse", "retract"),
    # retraction under memory pressure (optimistic admission: whom and when is the
    # scheduler's choice, on 0.5.23 upstream's retract_decode)
    *_eager_and_lazy("kv-pressure", "kv-pressure", "fixed"),
    # chunked prefill (with retractions: a retracted history prefilled in chunks)
    *_eager_and_lazy("kv-chunked", "kv-row-reuse", "chunked-retract"),
    # the DSpark slice (sglang target) in its ordering configurations, clean as released:
    # the ring with CPU seq lens, the readback with the eager accept
    *_eager_and_lazy("dspark-ring", "dspark-confidence-ring", "cpu-seq-lens", seeds=(0, 1)),
    Probe("dspark-ring-random", "dspark-confidence-ring", "cpu-seq-lens", "random(1)",
          seeds=(0, 1)),
    Probe("dspark-readback", "dspark-result-readback", "eager-accept", "eager", seeds=(0, 1)),
    # the ring as the candidate fix leaves it, on a backend without CPU seq lens: there
    # the copy_done poll is what keeps the host off a slot still being copied
    Probe("dspark-ring-fixed", "dspark-confidence-ring", "fixed", "eager", seeds=(0, 1)),
    # the EAGLE v2 slice (sglang target): upstream's worker as released, without and with
    # the plan streams
    *_eager_and_lazy("eagle-v2", "eagle-v2", "fixed"),
    *_eager_and_lazy("eagle-v2-plan", "eagle-v2", "plan-stream"),
    Probe("eagle-v2-retract", "eagle-v2", "retract", "eager"),
    Probe("eagle-v2-chunked", "eagle-v2", "chunked-retract", "eager"),
    Probe("eagle-v2-topk2", "eagle-v2", "topk2", "eager"),
    Probe("eagle-v2-topk2-plan-lazy", "eagle-v2", "topk2-plan-stream", "lazy"),
    Probe("eagle-v2-eagle3", "eagle-v2", "eagle3", "eager", seeds=(0, 1)),
    Probe("eagle-v2-grammar", "eagle-v2-grammar", "fixed", "eager", seeds=(0, 1)),
    # the vLLM target: its own engine loop, the main stream stalled per step (as released,
    # or with the candidate fix where the release races)
    *_eager_and_lazy("vllm-count", "vllm-accepted-count", "fixed", seeds=(0, 1)),
    # (the seq-lens probes keep the scenario the kill table was measured with: short
    # prompts, the stall as each execute_model starts -- vllm-seq-lens-shadow-amplified)
    *_eager_and_lazy("vllm-seq-lens", "vllm-seq-lens-shadow-amplified", "fixed", seeds=(0, 1)),
    *_eager_and_lazy("vllm-input-prep", "vllm-input-prep", "fixed", seeds=(0, 1)),
    # the draft-token slice with 0.27.1's record_stream (the handler's other orderings)
    *_eager_and_lazy("vllm-draft", "vllm-draft-tokens", "fixed", seeds=(0, 1)),
    # Model Runner V2 driven whole (vLLM target): as released, the main stream stalled per
    # step; with structured outputs and 0.27.1's record_stream, the draft copy stalled
    *_eager_and_lazy("vllm-mrv2", "vllm-mrv2", "as-installed", seeds=(0, 1)),
    *_eager_and_lazy("vllm-mrv2-draft", "vllm-mrv2-draft-tokens", "fixed", seeds=(0, 1)),
)}
