"""The memory pools on the sglang target: upstream's ReqToTokenPool and
TokenToKVPoolAllocator under upstream's loop, rows and slots reused within a run, the
released code clean on them, and the pool bugs killed on every seed of their probes."""
from __future__ import annotations

import inspect

import pytest

from harness.trials.drive import server_args
from harness.trials.trial import run_trial
from harness.policies import parse_policy
from scenarios.registry import get
from tests.impl.test_kv_pools import POOL_MUTATIONS, watch_pools
from tests.impl.test_retraction import assert_clean, assert_every_seed_decides
import targets


def test_the_pools_are_upstreams():
    import targets
    targets.get("sglang")  # loaded first: its stand-ins for absent GPU packages
    from targets.sglang.boundary.server_args import SglangArgs
    from targets.sglang.engine.pools import build_pools
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    pools = build_pools(SglangArgs(req_pool_size=5, kv_pool_size=32), "cpu")
    assert pools.origin == "upstream"
    assert type(pools.req_to_token_pool) is ReqToTokenPool
    assert type(pools.allocator) is TokenToKVPoolAllocator
    assert tuple(pools.req_to_token_pool.req_to_token.shape) == (5, 256)
    assert targets.get("sglang").describe()["kv_pools"] == "upstream"


def test_rows_and_slots_are_reused_within_a_run():
    rows, slots, capacity = watch_pools(0, "sglang")
    assert sum(len(o) > 1 for o in rows.values()) >= 2, rows
    assert sum(len(o) > 1 for o in slots.values()) >= capacity // 4, "slots never reused"


@pytest.mark.parametrize("policy", ["eager", "lazy", "stall(forward)", "random(1)"])
def test_released_code_is_clean_on_reused_pools(policy):
    sc = get("kv-row-reuse")
    wl = sc.workload(1)
    res = run_trial("sim", parse_policy(policy), wl, server_args(wl, {}, targets.get("sglang")), sc.stalls(None),
                    target=targets.get("sglang"))
    assert_clean(res)


@pytest.mark.parametrize("name", POOL_MUTATIONS + ("read-done-from-draft-runner",))
def test_each_pool_bug_is_killed_on_every_seed_of_its_probes(name):
    m = targets.get("sglang").mutation(name)
    assert_every_seed_decides(m.probes, m, "sglang")


@pytest.mark.parametrize("name,method", [("war-barrier-removed", "_apply_war_barrier"),
                                         ("war-barrier-at-loop-top", "event_loop_overlap")])
def test_the_barrier_mutations_patch_upstreams_own_code(name, method):
    import targets
    targets.get("sglang")
    from targets.sglang.boundary import upstream
    m = targets.get("sglang").mutation(name)
    assert m.target == f"sglang.srt.managers.scheduler:Scheduler.{method}"
    before = inspect.getattr_static(upstream.Scheduler, method)
    with m.applied():
        assert inspect.getattr_static(upstream.Scheduler, method) is not before
    assert inspect.getattr_static(upstream.Scheduler, method) is before
