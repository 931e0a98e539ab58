"""Host-step order and DP-idle batches.

* ``mixed-overlap``: every other decode step is processed synchronously (results before
  the launch, as ``is_disable_overlap_for_batch`` does), so finishes are discovered -- and
  filter/merge run -- at different points relative to the in-flight forward's stash and
  the next resolve; the draft prep must splice exactly the results not yet committed.
* ``dp-idle``: DP attention with gaps between arrivals, so the rank runs empty batches:
  ``stash`` / resolve with empty indices must be no-ops (and the relay buffers must not be
  initialised from an empty payload).
"""
import dataclasses

from scenarios.base import Scenario, stall_at
from scenarios.ngram_filter_race import SCENARIO as SEED
from scenarios.workloads import random_workload

# The seed scenario, with every other decode step processed before its launch.
MIXED_OVERLAP = dataclasses.replace(
    SEED,
    name="mixed-overlap",
    summary="every other decode step processed synchronously (host-order reorder); forward "
            "stalled after the shared-read-done record",
    answers={"schedule.disable_overlap": {"every": 2}},
)

DP_IDLE = Scenario(
    name="dp-idle",
    summary="DP attention: empty (idle) batches between sparse arrivals; stash/resolve must "
            "be no-ops for empty indices",
    workload=lambda seed: random_workload(seed, n_requests=4, draft_token_num=4, max_arrive=30,
                                          min_tokens=2, max_tokens=6),
    stalls=stall_at("forward.after_read_done"),
    variants={"fixed": {"relay": "future_map", "dp_attention": True},
              "pre-fix": {"relay": "spec_info", "dp_attention": True}},
    default_variant="fixed",
    expect={("fixed", None): "clean", ("pre-fix", "fine"): "race",
            ("pre-fix", "coarse"): "clean"},
)
