"""``return_hidden_states`` on the NGRAM path (sglang target): the verify forward replays
a graph into static hidden-state and logits buffers, as upstream's decode graph runner
does (its output's ``hidden_states`` are slices of them), and ``_copy_result_to_cpu``
reads the hidden states on the copy stream, which the next forward -- whose replay
rewrites them -- never waits for. The same shape as ``dspark-result-readback``, for any
algorithm; the copy stream is stalled before the readback. The hidden states each request
gets back are judged against the synchronous reference's (``hidden_states`` rows).
"""

from scenarios.axes import engage
from scenarios.base import AS_INSTALLED, Scenario, stall_at, with_fix
from scenarios.dspark import READBACK_STALL_MS
from scenarios.workloads import random_workload

_HIDDEN = engage("hidden-states")

NGRAM_HIDDEN_READBACK = Scenario(
    name="ngram-hidden-readback",
    summary="NGRAM with return_hidden_states: the readback of the verify graph's static "
            "hidden states vs the next replay; copy stream stalled before the readback",
    workload=lambda seed: random_workload(seed, n_requests=6, draft_token_num=4),
    stalls=stall_at("copy.before_result_d2h", default_ms=READBACK_STALL_MS),
    variants={AS_INSTALLED: dict(_HIDDEN),
              "fixed": with_fix("forward-waits-result-copy", **_HIDDEN),
              "fixed-clone": with_fix("clone-graph-outputs", **_HIDDEN),
              "fixed-conditional-wait": with_fix("forward-waits-graph-result-copy",
                                                 **_HIDDEN),
              "eager-verify": {**_HIDDEN, **engage("graphs-off")}},
    default_variant=AS_INSTALLED,
    expect={(AS_INSTALLED, None): "race"},
    sim_trials=10,
)
