"""Slot reuse: the ``slot-reuse`` workloads really wrap the request pool around
-- asserted on what the engine does, step by step, not on the generator's parameters --
and every seeded slot-reuse bug is killed by every seed of both slot-reuse probes, while
the fixed code stays clean on them."""
from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest

import targets
from harness.trials.drive import server_args
from scenarios.workloads import slot_reuse_workload
from harness.policies import Eager
from harness.runtime import open_runtime
from mutations import BY_NAME, SLOT_REUSE
from tests.impl.test_retraction import assert_every_seed_decides


def _watch(workload, target="impl"):
    """Run ``workload`` step by step; what happened to the pool and the running batch."""
    tgt = targets.get(target)
    args = server_args(workload, {}, tgt)
    seen = {"owners": defaultdict(list), "reused_in_flight": [], "finish_and_join": []}
    with open_runtime("sim", Eager(), trace=False) as rt, tgt.variant(args, rt.device):
        sched = tgt.scheduler(args, rt.device)
        reqs = [tgt.request(s.rid, s.prompt, s.max_new_tokens) for s in workload.requests]
        for r in reqs:
            sched.add_request(r)
        running = set()
        while sched.has_work() and sched.iteration < 400:
            unplaced = [r for r in reqs if r.pool_idx < 0]
            # launched, result not yet processed: admissions come first in a step, so
            # these are still in flight when this step hands out slots
            in_flight = {q.rid for entry in sched.result_queue for q in entry[1]}
            sched.step()
            for r in unplaced:
                if r.pool_idx < 0:
                    continue
                owners = seen["owners"][r.pool_idx]
                prev = next((q for q in reqs if owners and q.rid == owners[-1]), None)
                if prev is not None and prev.finished and prev.rid in in_flight:
                    seen["reused_in_flight"].append((sched.iteration, prev.rid, r.rid))
                owners.append(r.rid)
            now = ({r.rid for r in sched.running_batch.reqs}
                   if sched.running_batch is not None else set())
            if running - now and now - running:  # one left the batch, another joined it
                seen["finish_and_join"].append((sched.iteration, running - now, now - running))
            running = now
        sched.run_to_completion()
        assert not sched.has_work()
    seen["outputs"] = {r.rid: r.output() for r in reqs}
    seen["budgets"] = {s.rid: s.max_new_tokens for s in workload.requests}
    return seen


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_pool_wraps_around(seed):
    wl = slot_reuse_workload(seed)
    seen = _watch(wl)
    slots = seen["owners"]
    assert set(slots) == set(range(1, wl.req_pool_size)), slots  # the last slot too
    assert sum(len(o) for o in slots.values()) == len(wl.requests)
    assert max(len(o) for o in slots.values()) >= 3, slots  # each slot changes hands
    # a slot is handed to the next request while its finished owner's forward (the step
    # it ran past its finish under overlap) is still in flight
    assert seen["reused_in_flight"], slots
    # a request leaves the running batch in the very iteration another joins it
    assert seen["finish_and_join"]
    # and every request ran to its budget (the budget, not EOS, ended each one)
    assert {r: len(o) for r, o in seen["outputs"].items()} == seen["budgets"]


def test_the_default_pool_never_wraps():
    """The contrast: the server's default pool gives every request a fresh slot."""
    wl = dataclasses.replace(slot_reuse_workload(0), req_pool_size=None)
    seen = _watch(wl)
    assert all(len(o) == 1 for o in seen["owners"].values())
    assert not seen["reused_in_flight"]


@pytest.mark.parametrize("probe", ["slot-reuse", "slot-reuse-stall"])
@pytest.mark.parametrize("name", ["pool-edge-off-by-one", "slot-released-twice",
                                  "finished-kept-on-merge", "splice-after-commit", None])
def test_every_seed_of_the_slot_reuse_probes_decides(probe, name):
    """Each seed kills each slot-reuse bug on its own (the kill does not depend on which
    seed the matrix tries first); the fixed code (None) is clean on every seed."""
    assert probe in SLOT_REUSE
    assert_every_seed_decides([probe], BY_NAME[name] if name else None)


def test_pool_size_is_validated():
    from toys.server_args import ServerArgs
    for bad in (0, 1, 4097):
        with pytest.raises(ValueError, match="req_pool_size"):
            ServerArgs(req_pool_size=bad).validate()
    ServerArgs(req_pool_size=2).validate()  # one slot beside the padding row
