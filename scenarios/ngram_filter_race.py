"""The seed race (PR #35198): a request finishes while the forward that writes its
batch's accept state is still in flight, and the forward stream is stalled right after
the shared-read-done record. Pre-fix, ``filter_batch`` gathers ``accept_lens`` /
``accept_tokens`` on the schedule stream behind only the fine fence, so stale or
uninitialised values reach the host at the next draft prep. The coarse fence hides it;
the FutureMap relay removes it.
"""

from scenarios.base import Scenario, stall_at
from scenarios.workloads import random_workload

SCENARIO = Scenario(
    name="ngram-filter-race",
    summary="request finishes while its batch's verify is in flight; forward stalled after "
            "the shared-read-done record (seed #35198)",
    workload=lambda seed: random_workload(seed, n_requests=6, draft_token_num=4),
    stalls=stall_at("forward.after_read_done"),
    variants={"fixed": {"relay": "future_map"}, "pre-fix": {"relay": "spec_info"}},
    default_variant="pre-fix",
    expect={("pre-fix", "fine"): "race", ("pre-fix", "coarse"): "clean",
            ("fixed", None): "clean"},
)
