"""The verify forward under a CUDA graph, end to end on the simulator: the scenarios
exercise it (decode steps are replays), it changes no value, the reference stays
graph-free, and each graph mutation is caught."""
import dataclasses

import pytest
import torch

import harness.trials.reference as reference
import harness.trials.trial as trial
from harness.trials.drive import server_args
from harness.trials.trial import run_trial
from harness.runtime.sim.runtime import sim_runtime
from harness.runtime.trace import ReplayedOp
from harness.policies import parse_policy
from toys.graph_runner import VerifyGraphRunner, graphs_supported
from impl.scheduler import Scheduler
from toys.server_args import ServerArgs
from matrix.run import PROBES, run_probe
from mutations import BY_NAME
from scenarios.registry import get
import targets

SC = get("ngram-filter-race")


def _trial(policy, seed, **overrides):
    wl = SC.workload(seed)
    args = server_args(wl, {**SC.variants["fixed"].args, **overrides}, targets.get("impl"))
    return run_trial("sim", parse_policy(policy), wl, args, SC.stalls(None), keep_trace=True, target=targets.get("impl"))


def test_graphs_on_by_default_where_the_device_captures():
    assert ServerArgs().cuda_graph and not graphs_supported("cpu")
    with sim_runtime() as rt:
        assert graphs_supported(rt.device)
        sched = Scheduler(ServerArgs(draft_token_num=3, cuda_graph_max_bs=6), rt.device)
        runner_ = sched.graph_runner
        assert isinstance(runner_, VerifyGraphRunner) and runner_.capture_bs == [1, 2, 4]
        assert sched.streams["graph"] is runner_.stream
        assert [runner_.input_ids[b].shape[0] for b in (1, 2, 4)] == [3, 6, 12]
        assert not runner_.can_run(5) and runner_.can_run(4) and not runner_.can_run(0)
        assert Scheduler(ServerArgs(cuda_graph=False), rt.device).graph_runner is None
    with torch.no_grad():
        assert Scheduler(ServerArgs(), "cpu").graph_runner is None  # torch.cpu: no graphs
    with pytest.raises(ValueError):
        ServerArgs(cuda_graph_max_bs=0).validate()


@pytest.mark.parametrize("policy", ["eager", "stall(forward)"])
def test_decode_steps_replay_and_match_the_eager_forward(policy):
    with_graphs = _trial(policy, 0)
    without = _trial(policy, 0, cuda_graph=False)
    assert with_graphs.divergence is None and with_graphs.races == []
    assert with_graphs.outputs == without.outputs
    replays = [r for r in with_graphs.trace.log if isinstance(r, ReplayedOp)]
    assert replays and {r.name for r in replays} == {"embedding.default", "mm.default"}
    assert all(r.replay.frame[0].endswith("toys/graph_runner.py") for r in replays)
    assert all(r.frame[0].endswith("toys/model.py") for r in replays)  # the capture site
    assert not [r for r in without.trace.log if isinstance(r, ReplayedOp)]


def test_batches_above_the_largest_bucket_run_eagerly(monkeypatch):
    from toys.model import ToyTargetModel
    replayed, eager = [], []
    real_replay, real_forward = VerifyGraphRunner.replay, ToyTargetModel.forward
    monkeypatch.setattr(VerifyGraphRunner, "replay",
                        lambda self, ids: replayed.append(ids.shape[0]) or real_replay(self, ids))
    monkeypatch.setattr(ToyTargetModel, "forward",
                        lambda self, ids: eager.append(ids.shape[0]) or real_forward(self, ids))
    res = _trial("eager", 0, cuda_graph_max_bs=1)
    assert res.divergence is None and res.races == []
    D = SC.workload(0).draft_token_num
    assert replayed and set(replayed) == {D}  # one request per verify: the bs-1 graph
    # prefills carry at most max_prefill_reqs (4) rows: wider forwards are eager verifies
    assert [n for n in eager if n > 4 and n % D == 0]


def test_the_synchronous_reference_is_graph_free(monkeypatch):
    seen = []
    real = trial.drive

    def spy(rt, workload, args, plan, *rest):
        seen.append((args.overlap, args.cuda_graph))
        return real(rt, workload, args, plan, *rest)

    for room in (reference, trial):  # the reference run and the trial each drive
        monkeypatch.setattr(room, "drive", spy)
    monkeypatch.setattr(reference, "_REFERENCE_CACHE", type(reference._REFERENCE_CACHE)())
    wl = SC.workload(4)
    trial.run_trial("sim", parse_policy("eager"), wl, server_args(wl, {}, targets.get("impl")), [], detect_races=False, target=targets.get("impl"))
    assert seen[0] == (False, False) and seen[1] == (True, True)


@pytest.mark.parametrize("name,oracles", [
    ("graph-input-on-side-stream", {"happens-before", "stale-value", "crash"}),
    ("graph-replay-on-side-stream", {"happens-before", "stale-value"}),
    ("graph-replay-before-fill", {"stale-value", "output"}),
])
def test_graph_mutations_are_caught_on_every_seed_probe(name, oracles):
    for probe in ("seed-eager", "seed-lazy", "seed-stall"):
        killed, oracle, detail = run_probe(dataclasses.replace(PROBES[probe], seeds=(0,)),
                                           "sim", BY_NAME[name])
        assert killed and oracle in oracles, (probe, oracle, detail)


def test_graph_races_name_the_capture_and_replay_sites():
    wl = SC.workload(0)
    args = server_args(wl, SC.variants["fixed"].args, targets.get("impl"))
    res = run_trial("sim", parse_policy("eager"), wl, args, [],
                    mutation=BY_NAME["graph-replay-on-side-stream"], target=targets.get("impl"))
    mm = [r for r in res.races if r.first.op == "mm.default"]
    assert mm, [r.summary() for r in res.races]
    text = mm[0].summary()
    assert "graph mm.default [write] captured at toys/model.py:" in text
    assert "replayed at" in text and "unordered with forward argmax" in text


def test_markdown_report_names_both_sites():
    from harness.detect.hb import AccessInfo
    from harness.report.markdown import _site
    acc = AccessInfo.from_json({
        "file": "impl/model.py", "line": 76, "function": "forward",
        "replayed_at": {"file": "impl/graph_runner.py", "line": 77, "function": "replay"}})
    text = _site(acc)
    assert text.startswith("`impl/model.py:76` (forward) -- captured in a CUDA graph there")
    assert text.endswith("replayed at `impl/graph_runner.py:77` (replay)")
    plain = AccessInfo.from_json({"file": "impl/x.py", "line": 3, "function": "f"})
    assert _site(plain) == "`impl/x.py:3` (f)"


def test_graph_trials_are_deterministic():
    def key(res):
        return [(o.stream, o.name, o.seq, o.start, o.end, o.replay) for o in res.trace.executed]
    first, second = _trial("random(3)", 1), _trial("random(3)", 1)
    assert any(o.replay is not None for o in first.trace.executed)
    assert key(first) == key(second)
