"""The EAGLE v2 slice on the sglang target (``targets/sglang/slices/eagle.py``,
``scenarios/eagle.py``): upstream's ``EAGLEWorkerV2`` under upstream's loop, on the
simulator. It runs the release's own draft / verify / draft-extend code (not ours), the
draft misses as the toy means it to (acceptance varies, the output never does), the
release is clean under every policy with and without the plan stream, and each seeded
bug in upstream's EAGLE code is caught (the mutation matrix holds the full list)."""
import collections
import sys

import pytest

import targets
from harness.policies import parse_policy
from seams.faults.plan import FaultPlan
from harness.runtime import open_runtime
from harness.trials.drive import drive, server_args
from scenarios.eagle import EAGLE_V2
from scenarios.resolve import run_scenario


pytestmark = pytest.mark.usefixtures("sglang")


def _run(backend, variant="fixed"):
    wl = EAGLE_V2.workload(0)
    args = server_args(wl, EAGLE_V2.variants[variant].args, targets.get("sglang"))
    seen = collections.Counter()
    plan = FaultPlan(observer=lambda name, v: seen.update(
        [("accept", v["accept_len"])] if name == "result" else []))
    with open_runtime(backend, parse_policy("eager")) as rt:
        out = drive(rt, wl, args, plan, target=targets.get("sglang"))
    return wl, out, seen


def test_upstreams_eagle_worker_drafts_verifies_and_extends(specrace_backend):
    wl, out, seen = _run(specrace_backend)
    assert set(out) == {r.rid for r in wl.requests}
    assert all(len(out[r.rid]) == r.max_new_tokens for r in wl.requests)
    accepts = {n for (kind, n), c in seen.items() if kind == "accept"}
    D = wl.draft_token_num
    # prefill commits 1; decode steps accept whole drafts and stop at the draft's misses
    assert D in accepts and any(1 < n < D for n in accepts), accepts
    from sglang.srt.speculative import eagle_utils, eagle_worker_common
    from targets.sglang.slices import eagle_kernels
    # the kernels are ours, bound where upstream imported them; the rest is upstream's
    assert eagle_utils.verify_tree_greedy_func is eagle_kernels.verify_tree_greedy_func
    assert eagle_worker_common.run_eagle_verify.__module__ == \
        "sglang.srt.speculative.eagle_worker_common"


def test_the_output_is_the_target_models_greedy_output(specrace_backend):
    """Lossless: the same tokens with and without the plan stream, and as NGRAM's
    worker (a different drafter over the same target model) produces."""
    wl, out, _ = _run(specrace_backend)
    _, planned, _ = _run(specrace_backend, "plan-stream")
    assert planned == out
    _, eagle3, _ = _run(specrace_backend, "eagle3")
    assert eagle3 == out
    args = server_args(wl, {}, targets.get("sglang"))
    with open_runtime(specrace_backend, parse_policy("eager")) as rt:
        ngram = drive(rt, wl, args, FaultPlan(), target=targets.get("sglang"))
    assert ngram == out


CLEAN_CASES = (
    [("eagle-v2", v, p) for v in ("as-installed", "plan-stream", "topk2",
                                  "topk2-plan-stream", "eagle3", "penalties")
     for p in ("eager", "lazy", "random(3)")]
    + [("eagle-v2-grammar", v, p) for v in ("as-installed", "plan-stream", "topk2")
       for p in ("eager", "lazy")])


@pytest.mark.parametrize("scenario,variant,policy", CLEAN_CASES)
def test_the_release_is_clean(scenario, variant, policy, specrace_backend):
    if specrace_backend != "sim" and policy != "eager":
        pytest.skip("schedule policies are the simulator's")
    r = run_scenario(scenario, variant=variant, war_barrier="fine",
                     backend=specrace_backend, trials=2, target="sglang",
                     policy=parse_policy(policy) if specrace_backend == "sim" else None)
    assert r["outcome"] == "clean", (r["first_divergence"], r["races"][:2])
    assert r["traced_trials"] == 2


def test_a_tree_draft_moves_the_accepted_path(specrace_backend, monkeypatch):
    """topk 2: upstream's tree path -- the verify window's slots from the platform seam,
    the accepted path compacted and its KV moved to the window's front -- runs, and the
    output is the chain's."""
    from toys.mem_cache import ToyKVPool
    moves = []
    move = ToyKVPool.move_kv_cache
    monkeypatch.setattr(ToyKVPool, "move_kv_cache",
                        lambda self, dst, src: (moves.append(dst.numel()),
                                                move(self, dst, src)))
    _, chain, _ = _run(specrace_backend)
    _, tree, seen = _run(specrace_backend, "topk2")
    assert tree == chain
    assert moves and sum(moves) > 0
    assert any(n > 1 for (kind, n), c in seen.items() if kind == "accept")


@pytest.mark.parametrize("variant", ["fixed", "topk2", "eagle3"])
def test_the_kv_oracle_judges_every_eagle_launch(variant):
    """The verify attends through the toy paged attention at the slots and lengths
    upstream planned: every launch's context is judged against its request's history
    (reference-free), and upstream's placement -- the tree path's KV move included --
    passes."""
    from harness.oracle.stale import Reference, StaleValueOracle
    wl = EAGLE_V2.workload(0)
    args = server_args(wl, EAGLE_V2.variants[variant].args, targets.get("sglang"))
    oracle = StaleValueOracle(Reference({}, {}), stop_early=False)
    seen = collections.Counter()

    def observe(name, ctx):
        seen[name] += 1
        oracle(name, ctx)
    with open_runtime("sim", parse_policy("eager")) as rt:
        drive(rt, wl, args, FaultPlan(observer=observe), target=targets.get("sglang"))
    assert seen["kv_context"] >= seen["result"] > 0
    assert oracle.checked >= seen["kv_context"] and not oracle.divergences


def test_without_the_war_barrier_the_row_writes_race_the_eagle_forward():
    r = run_scenario("eagle-v2", variant="no-war-barrier", war_barrier="fine",
                     backend="sim", policy=parse_policy("eager"), trials=2, target="sglang")
    assert r["outcome"] == "race"
    assert any("assign_req_to_token_pool" in x["summary"] for x in r["races"])


def test_eagle3_feeds_the_draft_three_target_layers(monkeypatch):
    """The EAGLE3 shape: the draft extend reads the target's aux hidden states (three
    layers side by side), and relays its own one-layer hidden states."""
    from targets.sglang.slices.eagle_runners import ToyModelRunner
    widths = collections.Counter()
    forward_all = ToyModelRunner.forward_all

    def spy(self, fb):
        spec = getattr(fb, "spec_info", None)
        hidden = getattr(spec, "hidden_states", None)
        if self.is_draft_worker and hidden is not None and hidden.numel():
            widths[(str(fb.forward_mode), hidden.shape[1])] += 1
        return forward_all(self, fb)
    monkeypatch.setattr(ToyModelRunner, "forward_all", spy)
    _run("sim", "eagle3")
    H = 128  # the toy model's hidden size
    assert any(w == 3 * H for (_, w) in widths), widths  # the extends read the aux layers
    assert any(w == H for (_, w) in widths), widths  # the draft steps read the relay


def test_grammar_runs_behind_upstreams_barrier_and_matches_ngram(monkeypatch):
    """JSON-schema requests on the EAGLE path: the verify's GrammarTree and mask are
    upstream's, the FSM advances through the scheduler's grammar barrier for results
    still in the queue, and the constrained output is NGRAM's (whose grammar batches run
    synchronously)."""
    from scenarios.eagle import EAGLE_V2_GRAMMAR
    from targets.sglang.slices import eagle
    from targets.sglang.engine import result_processor
    # the grammar barrier advances through the scheduler's batch_result_processor:
    # upstream's where the release has it, else the target's GrammarAdvance
    processor = eagle.GrammarAdvance
    if result_processor.fits():
        from sglang.srt.managers.scheduler_components.batch_result_processor import \
            SchedulerBatchResultProcessor as processor
    advanced = collections.Counter()
    advance = processor.advance_grammar_fsm

    def spy(self, result, batch):
        # counted when the barrier (not the result processing) advances it first
        barrier = sys._getframe(1).f_code.co_name == "_advance_pending_grammar"
        if batch.has_grammar and not getattr(result, "grammar_advanced", False) and barrier:
            advanced["results"] += 1
        return advance(self, result, batch)
    monkeypatch.setattr(processor, "advance_grammar_fsm", spy)
    wl = EAGLE_V2_GRAMMAR.workload(0)
    assert any(r.schema for r in wl.requests)
    outs = {}
    for name, overrides in (("eagle", EAGLE_V2_GRAMMAR.variants["fixed"].args), ("ngram", {})):
        with open_runtime("sim", parse_policy("eager")) as rt:
            outs[name] = drive(rt, wl, server_args(wl, overrides, targets.get("sglang")), FaultPlan(),
                               target=targets.get("sglang"))
    assert outs["eagle"] == outs["ngram"]
    assert advanced["results"] > 0


def test_the_slice_needs_the_kernel_seams_it_binds(tmp_path):
    """The EAGLE slice's driver needs name every seam its stand-ins bind, as ways (a
    launcher function, or the Triton kernel object 0.5.19-0.5.22 launch directly), found
    where the module imported it; a release with neither way has the feature's code and
    cannot be driven -- never "not applicable"."""
    import os
    import shutil
    from targets import static
    from targets.sglang.boundary import contract, eagle_seams
    root = static.package_root("sglang")
    assert contract.missing_code(root, "eagle_v2") is None
    assert contract.undriven(root, "eagle_v2") is None
    seams = [seam for _, ways in eagle_seams.EAGLE_KERNEL_WAYS for seam in ways]
    needs = [way_target for need in contract.DRIVER_NEEDS["eagle_v2"]
             for way_target in ((need,) if isinstance(need, str) else sum(need, ()))]
    assert set(seams) <= set(needs)
    # a copy of the feature's modules whose eagle_worker_common imports the Triton
    # kernel object instead of the launcher (0.5.22's form): driven, by that way
    copy = tmp_path / "sglang"
    for target in (*contract.FEATURES["eagle_v2"], *needs):
        src = static.module_path(root, target.partition(":")[0])
        if not os.path.exists(src):  # another release's way (0.5.15's kernel modules)
            continue
        dst = copy / os.path.relpath(src, root)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    common = copy / "srt/speculative/eagle_worker_common.py"
    text = common.read_text()
    common.write_text(text.replace("assign_draft_cache_locs_contiguous_func",
                                   "assign_draft_cache_locs_contiguous"))
    assert contract.missing_code(str(copy), "eagle_v2") is None  # the code is there
    assert contract.undriven(str(copy), "eagle_v2") is None
    assert "sglang.srt.speculative.eagle_worker_common:assign_draft_cache_locs_contiguous" \
        in eagle_seams.seams_in(str(copy))
    # neither way: not driven, the first way named
    common.write_text(text.replace("assign_draft_cache_locs_contiguous_func",
                                   "some_other_launcher"))
    assert contract.undriven(str(copy), "eagle_v2") == (
        "sglang.srt.speculative.eagle_worker_common:assign_draft_cache_locs_contiguous_func")


def test_penalties_reach_the_verify_and_leave_the_greedy_output(monkeypatch):
    """Requests asking penalties: upstream's penalizers accumulate each step's tokens and
    fold them into the verify's logits, and the greedy output is unchanged (the penalties
    are below the toy model's logit margin). With a penalty that outweighs the margin the
    output changes -- the penalties do reach the verify's logits."""
    from targets.sglang.engine import requests
    if not requests.fits():
        pytest.skip("penalties are driven where requests are upstream's Req (0.5.22 on)")
    from sglang.srt.sampling.penaltylib import orchestrator
    calls = collections.Counter()
    for name in ("cumulate_output_tokens", "accumulate_additive_penalties",
                 "accumulate_scaling_penalties"):
        real = getattr(orchestrator.BatchedPenalizerOrchestrator, name)
        monkeypatch.setattr(orchestrator.BatchedPenalizerOrchestrator, name,
                            lambda self, *a, _real=real, _n=name: (calls.update([_n]),
                                                                   _real(self, *a))[1])
    _, greedy, _ = _run("sim")
    _, penalized, _ = _run("sim", "penalties")
    assert penalized == greedy
    assert min(calls.values()) > 0 and len(calls) == 3, calls
    monkeypatch.setitem(requests.PENALTIES, "frequency_penalty", 50.0)
    _, heavy, _ = _run("sim", "penalties")
    assert heavy != greedy


def test_penalties_are_not_driven_before_upstreams_req(monkeypatch):
    """On a release whose Req specrace does not drive, the configuration is refused
    (named), not run with the penalties silently dropped."""
    from targets.sglang.engine import requests
    from scenarios.eagle import EAGLE_V2
    monkeypatch.setattr(requests, "fits", lambda: False)
    why = targets.get("sglang").variant_problem(EAGLE_V2.variants["penalties"])
    assert "upstream's Req" in why
    with pytest.raises(TypeError):
        requests.Req(0, [1, 2], 4).ask_penalties()
