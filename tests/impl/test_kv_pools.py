"""The memory pools behind the WAR barrier: the allocator and the schedule
stream's row write against brute force, the KV oracle on what the attention read, and
the ``kv-row-reuse`` scenario -- rows and slots really reused, the fixed code clean under
every policy and both fences, each seeded pool bug killed on every seed of its probes."""
from __future__ import annotations


import pytest
import torch

from harness.trials.drive import server_args
from harness.trials.trial import run_trial
from harness.oracle.stale import Reference, StaleValueOracle
from harness.policies import Eager, parse_policy
from harness.runtime import open_runtime
from toys import mem_cache
from toys.attention import checksum
from impl.schedule_batch import Req
from matrix.run import PROBES
from mutations import BY_NAME
from scenarios.registry import get
import targets
from tests.impl.test_retraction import assert_clean, assert_every_seed_decides

POOL_MUTATIONS = ("war-barrier-removed", "war-barrier-at-loop-top",
                  "read-done-before-metadata", "accept-moved-via-req-to-token",
                  "kv-release-whole-row")


def test_allocator_hands_out_each_slot_once_and_takes_frees_back():
    a = mem_cache.TokenToKVPoolAllocator(8, "cpu")
    x = a.alloc(5).tolist()
    assert x == [1, 2, 3, 4, 5] and a.available_size() == 3  # slot 0: the padding slot
    assert a.alloc(4) is None and a.available_size() == 3  # nothing taken on failure
    a.free(torch.tensor([2, 4]))
    got = a.alloc(5).tolist()
    assert sorted(got) == [2, 4, 6, 7, 8] and a.available_size() == 0


def test_rows_count_their_hand_outs_where_the_pool_keeps_a_count():
    pool = mem_cache.ReqToTokenPool(4, 8, "cpu")
    manager = mem_cache.KVCacheManager(pool, mem_cache.TokenToKVPoolAllocator(8, "cpu"), 2)
    rows = [manager.take_row(None), manager.take_row(None)]
    manager.free_row(type("R", (), {"pool_idx": rows[0]})())
    rows.append(manager.take_row(None))
    assert rows == [1, 2, 3] and pool.req_generation.tolist() == [0, 1, 1, 1]
    manager.take_row(None)  # row 1 again, after its free
    assert pool.req_generation.tolist() == [0, 2, 1, 1]


def test_rows_of_a_pool_without_a_count_are_handed_out_all_the_same():
    """sglang's ReqToTokenPool before 0.5.16 keeps no req_generation (nothing there reads
    one): the manager hands its rows out without one (0.5.14 crashed here)."""
    pool = mem_cache.ReqToTokenPool(3, 8, "cpu")
    del pool.req_generation
    manager = mem_cache.KVCacheManager(pool, mem_cache.TokenToKVPoolAllocator(8, "cpu"), 2)
    assert [manager.take_row(None), manager.take_row(None)] == [1, 2]
    assert not hasattr(pool, "req_generation")


@pytest.mark.parametrize("seed", range(5))
def test_assign_kernel_matches_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    rows, width = 6, 12
    r2t = torch.randint(0, 50, (rows, width), generator=g, dtype=torch.int32)
    expect = r2t.clone()
    idx = torch.randperm(rows, generator=g)[:3]
    start = torch.randint(0, 6, (3,), generator=g)
    end = start + torch.randint(0, 6, (3,), generator=g)
    loc = torch.arange(100, 100 + int((end - start).sum()))
    k = 0
    for r, s, e in zip(idx.tolist(), start.tolist(), end.tolist()):
        expect[r, s:e] = loc[k:k + e - s].to(torch.int32)
        k += e - s
    mem_cache._assign_kernel(idx, r2t, start, end, loc)
    assert torch.equal(r2t, expect)


def test_kv_oracle_judges_what_the_attention_read():
    req = Req(7, [5, 6, 7], 4)
    oracle = StaleValueOracle(Reference({}, {}), stop_early=False)
    oracle("kv_context", {"req": req, "step": 0, "n": 3, "checksum": checksum([5, 6, 7])})
    oracle("result", {"req": req, "step": 0, "accept_len": 1, "tokens": [8]})
    oracle("kv_context", {"req": req, "step": 1, "n": 3, "checksum": checksum([5, 6, 7])})
    oracle("result", {"req": req, "step": 1, "accept_len": 2, "tokens": [9, 10]})
    assert oracle.first is None and oracle.checked == 2  # (no reference: results unjudged)
    # step 2 attends to the prompt and every accepted token but the last: [5,6,7,8,9]
    oracle("kv_context", {"req": req, "step": 2, "n": 5, "checksum": checksum([5, 6, 7, 8, 1]),
                          "past_finish": True})
    d = oracle.first
    assert d is not None and d.kind == "kv_context" and (d.rid, d.step) == (7, 2)
    assert "ran past its finish" in d.message
    assert d.expected == [5, checksum([5, 6, 7, 8, 9])]


def _watch_pools(seed: int, target: str = "impl"):
    """Run the kv-row-reuse workload; which rows and slots went to more than one request."""
    import targets
    sc = get("kv-row-reuse")
    wl = sc.workload(seed)
    tgt = targets.get(target)
    args = server_args(wl, {}, tgt)
    slot_owners, row_owners = {}, {}
    with open_runtime("sim", Eager(), trace=False) as rt, tgt.variant(args, rt.device):
        sched = tgt.scheduler(args, rt.device)
        kv = sched.kv_cache
        for s in wl.requests:
            sched.add_request(tgt.request(s.rid, s.prompt, s.max_new_tokens))
        while sched.has_work() and sched.iteration < 400:
            sched.step()
            r2t = kv.req_to_token.cpu()
            batch = sched.running_batch
            for req in (batch.reqs if batch is not None else []):
                row_owners.setdefault(req.pool_idx, set()).add(req.rid)
                for slot in r2t[req.pool_idx, :req.kv_allocated].tolist():
                    slot_owners.setdefault(slot, set()).add(req.rid)
        sched.close()
    return row_owners, slot_owners, kv.capacity


def watch_pools(seed: int, target: str = "impl"):
    return _watch_pools(seed, target)


def test_rows_and_slots_are_reused_within_a_run():
    rows, slots, capacity = _watch_pools(0)
    assert capacity == get("kv-row-reuse").workload(0).kv_pool_size
    assert sum(len(o) > 1 for o in rows.values()) >= 2, rows
    assert sum(len(o) > 1 for o in slots.values()) >= capacity // 4, "slots never reused"


@pytest.mark.parametrize("policy", ["eager", "lazy", "stall(forward)", "random(1)", "pct(2,3)"])
@pytest.mark.parametrize("fence", ["fine", "coarse"])
@pytest.mark.parametrize("layout", ["full", "swa"])
def test_fixed_code_is_clean_on_reused_pools(policy, fence, layout):
    sc = get("kv-row-reuse")
    wl = sc.workload(0)
    res = run_trial("sim", parse_policy(policy), wl,
                    server_args(wl, {"war_barrier": fence, "kv_layout": layout}, targets.get("impl")),
                    sc.stalls(None), target=targets.get("impl"))
    assert_clean(res)  # and every launch's attention read was judged


@pytest.mark.parametrize("name", POOL_MUTATIONS)
def test_each_pool_bug_is_killed_on_every_seed_of_its_probes(name):
    m = BY_NAME[name]
    assert m.probes and all(PROBES[p].scenario == "kv-row-reuse" for p in m.probes)
    assert_every_seed_decides(m.probes, m)


def test_swa_allocator_pairs_slots_and_clears_the_mapping_on_free():
    a = mem_cache.SWATokenToKVPoolAllocator(6, 4, "cpu")
    full = a.alloc(3)
    m = a.full_to_swa_index_mapping
    assert full.tolist() == [1, 2, 3] and m[full].tolist() == [1, 2, 3]
    assert a.alloc(2) is None  # the SWA side holds only one more
    a.free(full[1:])
    assert m[full].tolist() == [1, 0, 0] and a.available_size() == 3
    again = a.alloc(3)
    assert sorted(m[again].tolist()) == [2, 3, 4] and 0 not in m[again].tolist()


def test_the_barrier_removed_reads_a_row_rewritten_under_the_forward():
    """The value a missing barrier lets through: the step a finished request ran past its
    finish gathers its row after the schedule stream gave it to the next request."""
    sc = get("kv-row-reuse")
    wl = sc.workload(0)
    res = run_trial("sim", Eager(), wl, server_args(wl, {}, targets.get("impl")), sc.stalls(None),
                    mutation=BY_NAME["war-barrier-removed"], target=targets.get("impl"))
    d = res.divergence
    assert d is not None and d.kind == "kv_context" and "past its finish" in d.message, d
    assert any(r.first.op.startswith("attn_metadata") and "init_forward_metadata" in r.first.where()
               and r.second.op.startswith("assign_req_to_token_pool") for r in res.races), \
        [r.summary() for r in res.races]
