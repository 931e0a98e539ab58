"""vLLM V1's valid-count copy under async scheduling with spec decode (one of the six
sites ``reports/upstream/vllm-releases.md`` lists as unsettled on 0.19.0-0.27.1).

Each step the drafter's ``prepare_next_token_ids_padded`` makes the valid sampled-token
counts, a fresh main-stream tensor (``next_token_ids.new_empty``), and
``GPUModelRunner._copy_valid_sampled_token_count`` copies them device-to-host on a side
stream into one pinned buffer, recording an event. Nothing tells the caching allocator the
side stream reads the tensor: from 0.19.0 the runner keeps a reference
(``valid_sampled_token_count_gpu``) only until the next ``sample_tokens`` drops it, and a
later main-stream allocation can take the block before a late copy has read it. The host
reads the pinned counts (``_get_valid_sampled_token_count``) only after synchronising the
event, and only in a step that has deferred corrections to make.

The valid-count copy stream is stalled before each copy (``vllm.before_valid_count_copy``)
and the main stream as each step starts. Judged by the detector and the model oracle (a
count read back wrong corrects ``num_computed_tokens`` wrongly). The same steps show two
more of the six sites: the deferred correction's host write of
``num_computed_tokens_cpu`` while ``_prepare_inputs``' upload of it may be queued, and
the drafter's host write of its backup tokens while the previous step's upload of them
may be queued. What each can cost, read from the code: ``reports/upstream/vllm-releases.md``.
"""
from __future__ import annotations

from scenarios.base import AS_INSTALLED, Scenario, stall_at
from scenarios.workloads import random_workload

STALL_MS = 20.0
_ARGS = {"hybrid": False}


def _workload(seed: int):
    return random_workload(seed, n_requests=4, draft_token_num=3, max_arrive=3,
                           min_tokens=6, max_tokens=14)


VLLM_V1_VALID_COUNT = Scenario(
    name="vllm-v1-valid-count",
    summary="vLLM V1's valid-count copy: the drafter's counts, a main-stream temporary, "
            "read on a side stream with no record_stream vs the next steps' allocations "
            "(0.19.0-0.33.0); main and valid-count copy streams stalled",
    workload=_workload,
    stalls=stall_at("vllm.before_execute", "vllm.before_valid_count_copy", default_ms=STALL_MS),
    variants={AS_INSTALLED: dict(_ARGS)},
    default_variant=AS_INSTALLED,
    # the detector's pairs as shipped, on every release set up (0.16.0-0.18.0: their
    # seq-lens race; 0.19.0-0.27.1: the three sites above); no token changes
    expect={(AS_INSTALLED, None): "race"},
    sim_trials=3,
)
