"""Read-done as the release publishes it (the sglang target): upstream's graph runner
publishes the shared-read-done event only for a decode / verify it replays as a graph --
an extend batch, a batch over the graph's size, or a server with graphs disabled runs
eagerly and publishes nothing, and ``_apply_war_barrier`` (which clears the event it took)
falls back to its coarse fence for that step. Graph eligibility is this scenario's axis:
the pre-#35198 relay races where the fine fence engages and is clean where no step
publishes (the coarse fence every step, for the right reason), and a barrier that keeps
a stale event (``war-barrier-keeps-stale-event``) is caught at the first extend after a
replayed verify.
"""

from scenarios.axes import engage
from scenarios.base import AS_INSTALLED, Scenario, stall_at
from scenarios.workloads import random_workload

_PRE_FIX = {"relay": "spec_info"}

GRAPH_ELIGIBILITY = Scenario(
    name="ngram-graph-eligibility",
    summary="the seed race by graph eligibility: read-done published only by graph "
            "replays (extend, over-size or graphs-off steps take the coarse fence)",
    workload=lambda seed: random_workload(seed, n_requests=6, draft_token_num=4),
    stalls=stall_at("forward.after_read_done"),
    variants={AS_INSTALLED: {"relay": "future_map"},
              "fixed": {"relay": "future_map"},
              "fixed-graphs-off": {"relay": "future_map", **engage("graphs-off")},
              "pre-fix": dict(_PRE_FIX),
              "pre-fix-graphs-off": {**_PRE_FIX, **engage("graphs-off")}},
    default_variant=AS_INSTALLED,
    expect={("pre-fix", "fine"): "race", ("pre-fix", "coarse"): "clean",
            ("pre-fix-graphs-off", None): "clean"},
)
