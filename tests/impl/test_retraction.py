"""Retraction: running requests give their row and slots back mid-run -- a step
of theirs possibly in flight -- and are prefilled again from their prompt and tokens
(``toys.requests.retract``; variant ``retract`` of kv-row-reuse). The helpers take
a target: ``tests/targets/sglang_target/test_sglang_retraction.py`` runs them on upstream's
``release_req``."""
from __future__ import annotations

import dataclasses

import pytest

import toys.requests as toy_requests
from impl.schedule_batch import Req
from harness.oracle.model import greedy_continuation
from harness.oracle.stale import StaleValueOracle, checksum
from harness.policies import parse_policy
from harness.trials.drive import server_args
from harness.trials.trial import run_trial
from matrix.run import PROBES, run_probe
from scenarios.kv_reuse import RETRACT_AT
from scenarios.registry import get
import targets

POLICIES = ["eager", "lazy", "stall(forward)", "random(1)", "pct(2,3)"]


def run_retract(target: str, policy: str, seed: int = 0, variant: str = "retract",
                scenario: str = "kv-row-reuse"):
    sc = get(scenario)
    wl = sc.workload(seed)
    v = sc.variants[variant]
    return run_trial("sim", parse_policy(policy), wl, server_args(wl, v.args, targets.get(target)),
                     sc.stalls(None), target=targets.get(target),
                     mutation=v.patch(targets.get(target)))


def watch_retractions(monkeypatch, target: str, policy: str = "eager"):
    """Each retraction the trial (and its reference) made: ``(rid, tokens held, a step in
    flight?)``, and the trial's result (both loops retract through
    ``toys.requests.retract``)."""
    seen = []
    real = toy_requests.retract

    def spy(req, kv):
        seen.append((req.rid, len(req.output_ids), req.launched - 1 > req.committed_step))
        real(req, kv)
    monkeypatch.setattr(toy_requests, "retract", spy)
    return seen, run_retract(target, policy)


def assert_clean(res, judged=50) -> None:
    """A clean run: no divergence and no race (the first one shown), and -- unless
    ``judged`` is None -- more than ``judged`` reads judged, so the oracle did look."""
    assert res.divergence is None and not res.races, (res.divergence, res.races[:1])
    if judged is not None:
        assert res.checked > judged


def assert_every_seed_decides(probes, mutation, target: str = "impl") -> None:
    """Each seed of each of ``probes``, run on its own, kills ``mutation`` -- or, for the
    fixed code (None), finds nothing: the verdict does not hang on which seed the matrix
    tries first."""
    for probe in probes:
        for seed in PROBES[probe].seeds:
            killed, oracle, detail = run_probe(dataclasses.replace(PROBES[probe], seeds=(seed,)),
                                               "sim", mutation, target=target)
            assert killed == (mutation is not None), (mutation, probe, seed, oracle, detail)


def check_retractions(seen, res) -> None:
    assert_clean(res, judged=None)
    at = dict(RETRACT_AT)
    # the long request is retracted (in the trial; the reference run may be cached), at
    # the point retract_at names
    assert any(rid == 0 for rid, _, _ in seen)
    assert all(n >= at[rid] for rid, n, _ in seen)
    # under overlap a step of a retracted request was in flight: the hazard was reached
    assert any(in_flight for _, _, in_flight in seen)


# chunked-retract: chunked prefill too, a retracted history prefilled again in chunks
# (its own checks: test_chunked_prefill.py)
@pytest.mark.parametrize("variant", ["retract", "chunked-retract"])
@pytest.mark.parametrize("policy", POLICIES)
def test_the_fixed_engine_is_clean_through_retractions(policy, variant):
    res = run_retract("impl", policy, variant=variant)
    assert_clean(res)


def test_retractions_happen_where_named_with_a_step_in_flight(monkeypatch):
    seen, res = watch_retractions(monkeypatch, "impl")
    check_retractions(seen, res)


def run_to_end(target: str, variant: str, seed: int = 0):
    """kv-row-reuse's workload run to its end on ``target`` under ``variant``, outside a
    trial: ``{rid: (request, spec)}``."""
    from harness.runtime import open_runtime
    import targets
    sc = get("kv-row-reuse")
    wl = sc.workload(seed)
    tgt = targets.get(target)
    args = server_args(wl, dict(sc.variants[variant].args), tgt)
    with open_runtime("sim", trace=False) as rt, tgt.variant(args, rt.device):
        sched = tgt.scheduler(args, rt.device)
        reqs = {s.rid: tgt.request(s.rid, s.prompt, s.max_new_tokens) for s in wl.requests}
        for r in reqs.values():
            sched.add_request(r)
        while sched.has_work() and sched.iteration < 400:
            sched.step()
        sched.close()
    return {s.rid: (reqs[s.rid], s) for s in wl.requests}


def test_a_retracted_request_ends_with_the_models_continuation():
    """Retraction re-prefills from the tokens a request has: its output is the one it
    would have had (the model oracle and the reference judge it in every trial; here
    directly, on the requests retract_at names)."""
    run = run_to_end("impl", "retract")
    assert run[0][0].retractions == 1
    for rid, (r, spec) in run.items():
        assert r.output() == greedy_continuation(spec.prompt, spec.max_new_tokens), rid


def test_the_kv_oracle_judges_a_re_prefill_against_the_whole_history():
    class Ref:
        results, hidden, seq_lens, confidence, outputs = {}, {}, {}, {}, {}
    oracle = StaleValueOracle(Ref(), stop_early=False)
    req = Req(3, [5, 6, 7], 4)
    oracle("result", {"req": req, "step": 0, "accept_len": 1, "tokens": [8]})
    # step 1 was retracted before its result; its number goes to the re-prefill, which
    # attends to the prompt and the token the request had
    oracle("kv_context", {"req": req, "step": 1, "n": 4, "checksum": checksum([5, 6, 7, 8]),
                          "prefill": True})
    assert oracle.first is None
    oracle("kv_context", {"req": req, "step": 1, "n": 3, "checksum": checksum([5, 6, 7]),
                          "prefill": True})
    assert oracle.first is not None and oracle.first.kind == "kv_context"


@pytest.mark.parametrize("name", ["retracted-result-committed", "war-barrier-removed"])
def test_retraction_bugs_are_killed_on_every_seed(name, target="impl"):
    assert_every_seed_decides(("kv-retract", "kv-retract-lazy"),
                              targets.get(target).mutation(name), target)


def test_removing_the_barrier_reads_a_retracted_row_rewritten(target="impl"):
    """The retracted long request's in-flight step gathers its row after the schedule
    stream handed the row on: a race, and a stale KV context on the simulator."""
    res = run_retract(target, "eager", variant="retract-no-war-barrier")
    assert res.races
    assert res.divergence is not None and res.divergence.kind == "kv_context"


def test_a_retraction_made_due_by_a_synchronous_step_is_taken_before_its_launch():
    """Found by the small-pool machine: a synchronous step (the host reorder) commits the
    token that makes a retraction due after the scheduling point looked; the reference,
    which commits each result right after its launch, retracts at this point -- so must
    the trial, before it launches the step (else it retracts a step later and the
    re-prefill's number is off by one)."""
    from specrace.machines import SmallPoolEngineMachine
    state = SmallPoolEngineMachine()
    try:
        state.start(policy="eager", draft=2, pool=4, kv=72, layout="full", chunk=0)
        state.reorder()
        state.reorder()
        state.arrive(budget=2, grammar=0, length=1, motif=[86], retract=1)
        for _ in range(2):
            state.step()
            state.no_stale_value()
            state.no_race()
        state.drain()
        state.no_stale_value()
        assert state.reqs[0].retractions == 1
    finally:
        state.teardown()


def test_a_request_a_synchronous_step_finished_is_not_retracted():
    """Found by the small-pool machine: the synchronous step's processing finished the
    request (EOS at its prefill) that retract_at names; it must not be retracted (and
    prefilled again) on top of its finish."""
    from specrace.machines import SmallPoolEngineMachine
    state = SmallPoolEngineMachine()
    try:
        state.start(policy="eager", draft=2, pool=4, kv=72, layout="full", chunk=0)
        state.arrive(budget=2, grammar=0, length=1, motif=[29], retract=1)
        state.reorder()
        state.drain()
        state.wave(count=3, motif=[1])
        state.drain()
        state.no_stale_value()
        state.no_race()
        assert state.reqs[0].output() == [0] and state.reqs[0].retractions == 0
    finally:
        state.teardown()


@pytest.mark.parametrize("policy,count", [("lazy", 2), ("eager", 2), ("lazy", 4), ("eager", 4)])
def test_a_grammar_request_retracted_before_its_first_verify(policy, count, target="impl"):
    """Found by the grammar machine: a grammar request prefilled beside grammar-free ones
    and retracted at its first token leaves the batch before any verify builds a grammar
    mask, and so before anything clears the extend stage's mask (one row per prefilled
    request). The verify of the grammar-free rest must not apply it: a shape mismatch
    (a crash) when its rows differ from the verify's, another request's mask (a stale
    token) when they happen to match."""
    from specrace.machines import GrammarEngineMachine
    state = GrammarEngineMachine()
    state.target = target
    try:
        state.start(policy=policy, draft=2, pool=64, kv=4096, layout="full", chunk=0)
        state.wave(count=count, motif=[1])
        state.arrive(budget=2, grammar=1, length=1, motif=[1], retract=1)
        state.drain()
        state.no_stale_value()
        state.no_race()
        grammar_req = state.reqs[count]
        assert grammar_req.retractions == 1  # the path under test was taken
    finally:
        state.teardown()
