"""The DSpark slice on the sglang target (``targets/sglang/slices/dspark.py``,
``scenarios/dspark.py``): upstream's DSpark relay, planner and result readback under
upstream's loop. The two findings (``reports/upstream/findings/``) as tests: each race is
found, is value-visible with a late copy, is gone with its candidate fix (outputs equal to
the synchronous reference under every policy), and is absent where the release's own
configuration orders it."""
import pytest

import targets
from harness.trials.drive import drive, server_args
from harness.policies import parse_policy
from seams.faults.plan import FaultPlan
from harness.runtime import open_runtime
from scenarios.registry import get
from scenarios.resolve import run_scenario
from scenarios.sglang_relay import POLICIES


pytestmark = pytest.mark.usefixtures("sglang")


def repro(scenario, variant="as-installed", policy="eager", trials=2, **kw):
    return run_scenario(scenario, variant=variant, war_barrier="fine", backend="sim",
                        policy=parse_policy(policy), trials=trials, target="sglang", **kw)


@pytest.mark.parametrize("variant", ["as-installed", "cap-accept"])
def test_the_ring_copy_races_the_next_scatter(variant):
    r = repro("dspark-confidence-ring", variant)
    assert r["outcome"] == r["expected_by_scenario"] == "race"
    (race,) = r["races"]
    assert race["kind"] == "WAR" and "issue_ring_copy" in race["summary"] \
        and "scatter" in race["summary"], race["summary"]
    # value-visible: the budget planner gets the next step's confidence for this one
    div = r["first_divergence"]
    assert div["kind"] == "confidence" and div["stream"] == "d2h"
    assert div["expected"] != div["observed"]


def test_the_result_readback_races_the_next_graph_replay():
    r = repro("dspark-result-readback")
    assert r["outcome"] == "race"
    summaries = [x["summary"] for x in r["races"]]
    assert summaries and all("async_d2h" in s and "replayed at" in s for s in summaries), \
        summaries
    div = r["first_divergence"]  # the host commits tokens of the next replay
    assert div["kind"] == "accept_tokens" and div["stream"] == "copy"


def test_the_ngram_hidden_states_readback_races_the_next_graph_replay():
    """The same shape on the NGRAM path: ``return_hidden_states`` hands the copy stream
    the verify graph's static hidden-state buffer."""
    r = repro("ngram-hidden-readback")
    assert r["outcome"] == "race"
    assert any("async_d2h" in x["summary"] and "replayed at" in x["summary"]
               for x in r["races"]), r["races"]
    assert r["first_divergence"]["kind"] == "hidden_states"


@pytest.mark.parametrize("scenario,variant", [
    ("dspark-confidence-ring", "fixed"), ("dspark-confidence-ring", "cpu-seq-lens"),
    ("dspark-confidence-ring", "static"), ("dspark-result-readback", "fixed"),
    ("dspark-result-readback", "eager-accept"), ("ngram-hidden-readback", "fixed"),
    ("ngram-hidden-readback", "eager-verify"),
    # the cheaper fixes: clone the graph outputs, or wait only for graph-view results
    ("dspark-result-readback", "fixed-clone"),
    ("dspark-result-readback", "fixed-conditional-wait"),
    ("ngram-hidden-readback", "fixed-clone"),
    ("ngram-hidden-readback", "fixed-conditional-wait")])
def test_fixes_and_ordering_configurations_are_clean_under_every_policy(scenario, variant):
    for policy in POLICIES:
        r = repro(scenario, variant, policy, trials=1)
        assert r["outcome"] == "clean", (policy, r["first_divergence"], r["races"])


def test_prefill_batches_between_decodes_do_not_open_the_ring_race():
    """The suspicion that a prefill batch (no ``spec_info``: ``resolve_seq_lens_cpu``
    returns before its synchronize) leaves the ring copy unordered does not hold: the
    prefill forward scatters no confidence, and the next decode's resolve synchronizes the
    D2H stream before its own scatter. Arrivals spread over 14 iterations put prefills
    between decodes."""
    from harness.trials.trial import run_trial
    from scenarios.workloads import random_workload
    sc = get("dspark-confidence-ring")
    for seed in range(3):
        wl = random_workload(seed, n_requests=8, draft_token_num=4, max_arrive=14)
        args = server_args(wl, sc.variants["cpu-seq-lens"].args, targets.get("sglang"))
        for policy in ("eager", "random(1)", "pct(2,2)"):
            res = run_trial("sim", parse_policy(policy), wl, args, sc.stalls(None),
                            target=targets.get("sglang"))
            assert not res.reproduced, (seed, policy, res.divergence, res.races)


def test_the_planner_and_the_oracle_see_every_resolved_slot():
    """The confidence oracle is not vacuous: on the fixed code upstream's planner resolves
    ring slots, and each labelled row reaches the oracle."""
    sc = get("dspark-confidence-ring")
    wl = sc.workload(0)
    seen = []
    plan = FaultPlan(observer=lambda name, ctx: seen.append(name))
    with open_runtime("sim", parse_policy("eager"), trace=False) as rt, \
            sc.variants["fixed"].patch(targets.get("sglang")).applied():
        drive(rt, wl, server_args(wl, sc.variants["fixed"].args, targets.get("sglang")), plan, targets.get("sglang"))
    assert seen.count("confidence_resolved") >= 3
    assert seen.count("confidence_published") > seen.count("confidence_resolved")


def test_the_budget_planner_reads_reused_slots_as_stale_and_the_oracle_sees_each_use():
    """The budget probe is not vacuous either: on the fixed code, across seeds, the
    planner is handed rows another request published (a pool slot reused within the
    ring's lag) and its generation check finds every one stale (unused); each row's use
    reaches the oracle. With the check's generation dropped (the seeded bug) a reused
    row is used, and the run diverges on it."""
    sc = get("dspark-confidence-ring")
    foreign = own_used = 0
    for seed in range(4):
        wl = sc.workload(seed)
        rows = []
        plan = FaultPlan(observer=lambda name, ctx: rows.extend(
            ctx["rows"]) if name == "confidence_used" else None)
        with open_runtime("sim", parse_policy("eager"), trace=False) as rt, \
                sc.variants["fixed"].patch(targets.get("sglang")).applied():
            drive(rt, wl, server_args(wl, sc.variants["fixed"].args, targets.get("sglang")), plan,
                  targets.get("sglang"))
        for req, label, used in rows:
            if label is None:
                continue
            if label[0].rid != req.rid:
                foreign += 1
                assert not used, (seed, req.rid, label[0].rid)
            else:
                own_used += used
    assert foreign >= 1 and own_used >= 3, (foreign, own_used)
    bug = targets.get("sglang").mutation("budget-freshness-skips-generation")
    from matrix.probes import PROBES
    from matrix.run import run_probe
    killed, oracle, detail = run_probe(PROBES["dspark-ring"], "sim", bug, target="sglang")
    assert killed and oracle == "stale-value", (oracle, detail)
    assert "verify budget used request" in detail, detail


def test_same_seed_same_verdict():
    a = repro("dspark-confidence-ring", policy="random(1)")
    b = repro("dspark-confidence-ring", policy="random(1)")
    assert a["first_divergence"] == b["first_divergence"] and a["schedules"] == b["schedules"]


def test_the_slice_is_declared_by_the_code_it_needs():
    from targets import static
    from targets.sglang.boundary import contract
    assert contract.missing_code(static.package_root("sglang"), "dspark") is None
    tgt = targets.get("sglang")
    assert tgt.variant_problem(get("dspark-confidence-ring").variants["fixed"]) == ""
    assert not targets.get("impl").supports("dspark-confidence-ring")


def test_the_report_lists_every_graph_owned_buffer_the_copy_reads():
    """From the trace, not a list: the folded readback hands out three epilogue outputs
    (tokens, accept lengths and the block accept lengths the review found missing); the
    eager accept hands out fresh tensors -- none."""
    from harness.report.graph_owned import graph_owned_reads
    from scenarios.resolve import run_scenario_result
    folded = run_scenario_result("dspark-result-readback", target="sglang", backend="sim",
                                 trials=1)
    rows = graph_owned_reads(folded.trace)
    written = {r["written_by"].split(" captured at ")[1].split(" (")[0] for r in rows}
    assert len(rows) == 3, rows
    lines = [r["written_frame"] for r in rows]
    assert all(path == "targets/sglang/slices/dspark.py" for path, _ in lines), written
    import linecache, os
    from seams.paths import REPO_ROOT
    code = [linecache.getline(os.path.join(REPO_ROOT, p), n) for p, n in lines]
    assert any("block_accept_lens" in c for c in code) and any("commit_lens" in c for c in code)
    eager = run_scenario_result("dspark-result-readback", target="sglang", backend="sim",
                                trials=1, variant="eager-accept")
    assert graph_owned_reads(eager.trace) == []
