"""Two tensor-parallel ranks of the DSpark slice must take the same control decisions.

Under TP > 1 each rank runs the same scheduler loop on the same batches; DSpark's budget
planner runs on every rank from that rank's own confidence ring
(``DSparkVerifyPlanner.prepare_verify_budget``), and only ``verify_lens`` is broadcast
afterwards (``dspark_worker_v2.py``); a rank whose ``copy_done[slot].query()`` says "not
yet" gets no budget (``resolve`` returns None) and skips the ``DSPARK_PLAN`` broadcast.
So the decisions per step -- the budget, and with it the verify tier and whether the rank
takes part in the broadcast -- must be equal on both ranks, or the ranks' collectives
disagree (upstream issue #31023, PR #31195 broadcasts the budget).

``run_two_ranks`` drives two upstream loops (two ``UpstreamLoop`` objects, each with its
own streams, FutureMap, planner and toy DSpark worker) in lockstep on one simulated
device, one iteration of rank 0 then one of rank 1, over the same requests. The fake
broadcast is the comparison itself: per step, each rank's ``(participates, budget)``. A
rank-local delay (``stall_rank``: a stall of that rank's D2H stream before its ring copy,
the only thing that differs between the ranks) or a seeded divergence
(``confidence_skew``: rank 1's draft confidence perturbed) shows as the first step where
the ranks' decisions differ.

Collectives are matched calls. Each rank's sequence of collectives -- op, group, site,
shape -- must equal the other's: under ``SGLANG_SPEC_TP_SYNC=all`` (the default) a rank
with a budget calls ``tp_sync.sync(DSPARK_PLAN, verify_lens)``, an NCCL broadcast of one
int32 per request (``dspark_planner._schedule_verify_lens``), and a rank without one calls
nothing. Where the sequences part, one rank waits in a broadcast the other never enters:
a ``collective-mismatch`` -- a hang on a GPU (the hang of upstream's open PR #31195), not
merely a different budget. ``broadcast_budget`` is that PR's fix: the budget rank 0
computed is the budget of every rank, so every rank calls the same collectives.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

from seams.faults.plan import FaultPlan, StallAt

from scenarios.workloads import random_workload

RING_POINT = "d2h.before_ring_copy"
MAX_ROUNDS = 400


class _RankPlan(FaultPlan):
    """Stalls only while the rank ``stall_rank`` is stepping (``rank`` is set by the
    driver before each iteration)."""

    def __init__(self, stall_rank: Optional[int], ms: float) -> None:
        super().__init__(stalls=[StallAt(RING_POINT, ms)])
        self.stall_rank = stall_rank
        self.rank = 0

    def hit(self, name: str, ctx: dict) -> None:
        if self.rank == self.stall_rank:
            super().hit(name, ctx)


def _record_decisions(sched, log: List[Dict[str, Any]],
                      adopt: Optional[List[Dict[str, Any]]] = None) -> None:
    """Wrap the loop's ``_confidence_budget_prepare`` (upstream's planner method, called
    unchanged) to log the decision it leaves on the batch; with ``adopt`` (rank 0's log)
    the step takes rank 0's budget instead, as a broadcast of it would give."""
    prepare = sched._confidence_budget_prepare

    def prepare_and_log(batch, future_map):
        prepare(batch, future_map)
        if batch.spec_info is not None and not batch.forward_mode.is_extend():
            if adopt is not None and len(adopt) > len(log):
                batch.spec_info.verify_token_budget = adopt[len(log)]["budget"]
            budget = getattr(batch.spec_info, "verify_token_budget", None)
            log.append({"reqs": [r.rid for r in batch.reqs], "participates": budget is not None,
                        "budget": budget})

    sched._confidence_budget_prepare = prepare_and_log


def collectives(log: List[Dict[str, Any]]) -> List[tuple]:
    """The collectives a rank calls, in order: (op, group, site, shape) per broadcast."""
    return [("broadcast", "tp", "DSPARK_PLAN", (len(d["reqs"]),))
            for d in log if d["participates"]]


def collective_mismatch(calls0: List[tuple], calls1: List[tuple]) -> Optional[Dict[str, Any]]:
    """The first call where two ranks' collectives part (None: they match call for call):
    each rank's call there, or None where that rank calls nothing more -- it has moved on
    while the other waits in a collective for ever."""
    for i in range(max(len(calls0), len(calls1))):
        a = calls0[i] if i < len(calls0) else None
        b = calls1[i] if i < len(calls1) else None
        if a != b:
            return {"kind": "collective-mismatch", "call": i, "rank0": a, "rank1": b}
    return None


def run_two_ranks(policy: str = "eager", seed: int = 0, stall_rank: Optional[int] = None,
                  stall_ms: float = 8.0, confidence_skew: float = 0.0,
                  needs_cpu_seq_lens: bool = False,
                  broadcast_budget: bool = False) -> Dict[str, Any]:
    """Two ranks over one workload on the simulator; the per-step decisions of each and
    the first step where they differ (None: the ranks agreed throughout)."""
    import targets
    from seams import faults
    from harness.trials.drive import server_args
    from harness.policies import parse_policy
    from harness.runtime import open_runtime
    from targets.sglang.engine.loop import UpstreamLoop

    tgt = targets.get("sglang")
    wl = random_workload(seed, n_requests=6, draft_token_num=4)
    args = server_args(wl, {"spec_algorithm": "dspark", "ragged_verify_mode": "compact",
                            "needs_cpu_seq_lens": needs_cpu_seq_lens,
                            "folded_accept": False}, tgt)
    plan = _RankPlan(stall_rank, stall_ms)
    logs: List[List[Dict[str, Any]]] = [[], []]
    with open_runtime("sim", parse_policy(policy), trace=False) as rt, \
            tgt.variant(args, rt.device):
        plan.runtime = rt
        ranks = [UpstreamLoop(dataclasses.replace(args), rt.device) for _ in range(2)]
        for rank, (loop, log) in enumerate(zip(ranks, logs)):
            _record_decisions(loop.sched, log,
                              logs[0] if broadcast_budget and rank > 0 else None)
            if rank == 1 and confidence_skew:
                worker = loop.sched.model_worker
                draft = worker._draft
                worker._draft = lambda bonus, d=draft: _skewed(d(bonus), confidence_skew)
        pending = sorted(wl.requests, key=lambda r: (r.arrive, r.rid))
        with faults.installed(plan):
            try:
                for it in range(MAX_ROUNDS):
                    if not pending and not any(r.has_work() for r in ranks):
                        break
                    due = [s for s in pending if s.arrive <= it]
                    pending = [s for s in pending if s.arrive > it]
                    for rank, loop in enumerate(ranks):  # the same batches on both ranks
                        for spec in due:
                            loop.add_request(tgt.request(spec.rid, spec.prompt,
                                                         spec.max_new_tokens))
                        plan.rank = rank
                        loop.step()
            finally:
                for loop in ranks:
                    loop.close()
        rt.synchronize()
    first = next((i for i, (a, b) in enumerate(zip(*logs)) if a != b), None)
    if first is None and len(logs[0]) != len(logs[1]):
        first = min(len(logs[0]), len(logs[1]))
    return {"steps": [len(log) for log in logs], "first_difference": first,
            "rank0": logs[0][first] if first is not None and first < len(logs[0]) else None,
            "rank1": logs[1][first] if first is not None and first < len(logs[1]) else None,
            "participation": [sum(d["participates"] for d in log) for log in logs],
            "collective_mismatch": collective_mismatch(*(collectives(log) for log in logs))}


def _skewed(draft_out, skew: float):
    verify_ids, confidence = draft_out
    return verify_ids, (confidence * (1.0 - skew)).clamp(0.0, 1.0)
