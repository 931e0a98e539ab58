"""Slot reuse on installed sglang: the workload's pool size reaches upstream's FutureMap
(its buffers are sized from ``req_to_token_pool``), the seeded pool-edge bug is killed by
every seed of both slot-reuse probes while the released code stays clean on them, and the
state machine's small pools find it."""

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

import targets
from specrace.machines import EngineMachine, SmallPoolEngineMachine
from harness.trials.drive import server_args
from scenarios.workloads import slot_reuse_workload
from harness.runtime import open_runtime
from tests.impl.test_retraction import assert_every_seed_decides

FIND = dict(deadline=None, suppress_health_check=list(HealthCheck), database=None,
            report_multiple_bugs=False, derandomize=True,
            phases=[Phase.explicit, Phase.generate])


def test_the_workloads_pool_size_reaches_upstreams_future_map(sglang):
    wl = slot_reuse_workload(0)
    args = server_args(wl, {}, sglang)
    with open_runtime("sim", trace=False) as rt, sglang.variant(args, rt.device):
        sched = sglang.scheduler(args, rt.device)
        fm = sched.future_map
        assert fm.req_pool_size == wl.req_pool_size == 4
        assert fm.output_tokens_buf.shape[0] == wl.req_pool_size
        assert sorted(sched.kv_cache.free_rows) == [1, 2, 3]


@pytest.mark.parametrize("probe", ["slot-reuse", "slot-reuse-stall"])
@pytest.mark.parametrize("name", ["pool-edge-off-by-one", None])
def test_every_seed_of_the_slot_reuse_probes_decides(sglang, probe, name):
    mutation = targets.get("sglang").mutation(name) if name else None
    assert_every_seed_decides([probe], mutation, "sglang")


class SglangSmallPools(SmallPoolEngineMachine):
    target = "sglang"


def test_released_sglang_survives_small_pool_programs(sglang):
    run_state_machine_as_test(SglangSmallPools, settings=settings(
        max_examples=6, stateful_step_count=20, **dict(FIND, derandomize=False)))


def test_small_pool_programs_find_the_pool_edge_bug(sglang):
    class Mutated(EngineMachine):
        target = "sglang"
        mutation = targets.get("sglang").mutation("pool-edge-off-by-one")

    with pytest.raises(AssertionError, match="engine crashed"):
        run_state_machine_as_test(Mutated, settings=settings(
            max_examples=60, stateful_step_count=30, **FIND))
