"""CUDA graphs on the simulator: capture records, replay issues, CUDA's capture rules.

Deterministic: stalls are virtual, schedules are functions of the policy and its seed.
"""
from __future__ import annotations

import pytest
import torch

from harness.detect import detect
from harness.policies import parse_policy
from harness.runtime.sim import graphs as G
from harness.runtime.sim.runtime import sim_runtime
from harness.runtime.sim.tensor import SimTensor, poison_fill
from harness.runtime.trace import OpKind, OpRecord, ReplayedOp
from litmus.programs import GRAPH_PROGRAMS
from litmus.run import DEFAULT_SIM_POLICIES, run_one_sim

POLICIES = ["eager", "lazy", "stall(forward)", "random(3)", "pct(4,3)"]
POISON_I32 = poison_fill(torch.empty(1, dtype=torch.int32)).item()


def _streams(rt):
    m = rt.module
    F, S, side = m.Stream(), m.Stream(), m.Stream()
    rt.label(F, "forward")
    rt.label(S, "schedule")
    rt.label(side, "graph")
    return m, F, S, side


def _i32(values, rt):
    return torch.tensor(values, dtype=torch.int32, device=rt.device)


def test_module_api_is_torch_cudas():
    with sim_runtime() as rt:
        m = rt.module
        for name in ("CUDAGraph", "graph", "graph_pool_handle", "is_current_stream_capturing"):
            assert hasattr(m, name) and hasattr(torch.cuda, name), name
        assert m.graph_pool_handle() != m.graph_pool_handle()
        g = m.CUDAGraph()
        with m.graph(g, pool=(0, 99)):
            assert m.is_current_stream_capturing()
            assert m.current_stream() is not m.default_stream()  # its own side stream
            torch.zeros(1, device=rt.device).add_(1)
        assert not m.is_current_stream_capturing() and m.current_stream() is m.default_stream()
        assert g.pool() == (0, 99)
        assert "captured, 2 ops" in repr(g)


@pytest.mark.parametrize("policy", POLICIES)
def test_capture_records_without_running_and_replays_against_static_tensors(policy):
    with sim_runtime(parse_policy(policy)) as rt:
        m, F, S, side = _streams(rt)
        static_in = torch.zeros(4, dtype=torch.int32, device=rt.device)
        m.synchronize()
        g = m.CUDAGraph()
        before = len(rt.trace.log)
        with m.graph(g, stream=side):
            out = static_in + 1
            out.mul_(10)
        ops_logged = [r for r in rt.trace.log[before:] if isinstance(r, OpRecord)]
        assert ops_logged == []  # recorded into the graph, not enqueued
        assert type(out) is SimTensor and out.cpu().tolist() == [POISON_I32] * 4
        results = []
        for batch in ([1, 2, 3, 4], [5, 6, 7, 8]):
            with m.stream(F):
                static_in.copy_(_i32(batch, rt))
                g.replay()
                results.append(out.cpu().tolist())  # blocking, on the replaying stream
        assert results == [[20, 30, 40, 50], [60, 70, 80, 90]]
        replays = [r for r in rt.trace.log if isinstance(r, ReplayedOp)]
        assert [(r.name, r.replay.n) for r in replays] == [
            ("add.Tensor", 1), ("mul_.Tensor", 1), ("add.Tensor", 2), ("mul_.Tensor", 2)]
        assert {r.stream for r in replays} == {F.sid}
        assert detect(rt.trace) == []


def test_stall_captured_in_the_graph_stalls_every_replay():
    with sim_runtime() as rt:  # eager: only the captured stall delays anything
        m, F, S, side = _streams(rt)
        x = torch.zeros(4, device=rt.device)
        m.synchronize()
        g = m.CUDAGraph()
        with m.graph(g, stream=side):
            rt.stall(5.0)  # a fault point hit during the capture
            x.add_(1)
        with m.stream(F):
            g.replay()
            g.replay()
            with m.stream(S):
                early = x.cpu().tolist()  # schedule does not wait: the stall holds forward
            late = x.cpu().tolist()
        assert early == [0.0] * 4 and late == [2.0] * 4
        stalls = [r for r in rt.trace.executed if isinstance(r, ReplayedOp) and r.kind == OpKind.STALL]
        assert len(stalls) == 2 and all(s.end - s.start >= 5000.0 for s in stalls)


@pytest.mark.parametrize("what", ["item", "cpu", "tolist", "synchronize", "stream.synchronize",
                                  "nonzero", "bool mask", "blocking H2D", "event.query",
                                  "stream.query"])
def test_host_syncs_inside_a_capture_are_refused(what):
    with sim_runtime() as rt:
        m, F, S, side = _streams(rt)
        x = torch.arange(4, device=rt.device)
        m.synchronize()
        ops = {
            "item": lambda: x.sum().item(),
            "cpu": lambda: x.cpu(),
            "tolist": lambda: x.tolist(),
            "synchronize": lambda: m.synchronize(),
            "stream.synchronize": lambda: F.synchronize(),
            "nonzero": lambda: x.nonzero(),
            "bool mask": lambda: x[x > 1],
            "blocking H2D": lambda: torch.tensor([1, 2], device=rt.device),
            "event.query": lambda: F.record_event().query(),
            "stream.query": lambda: side.query(),
        }
        g = m.CUDAGraph()
        with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):
            with m.graph(g, stream=side):
                y = x + 1
                ops[what]()
        assert rt.dev.capture is None and not m.is_current_stream_capturing()
        with pytest.raises(RuntimeError, match="without a preceding successful capture"):
            g.replay()
        # the device is usable again, and the refused capture left nothing queued
        assert (x + 1).cpu().tolist() == [1, 2, 3, 4]
        del y


def test_refused_sync_names_the_op_and_invalidates_a_capture_that_goes_on():
    with sim_runtime() as rt:
        m, F, S, side = _streams(rt)
        x = torch.arange(4, device=rt.device)
        g = m.CUDAGraph()
        with pytest.raises(RuntimeError, match="previous error during capture") as info:
            with m.graph(g, stream=side):
                try:
                    x.sum().item()
                except RuntimeError as exc:
                    assert "blocking D2H (.item)" in str(exc)
                    assert "test_sim_graphs.py" in str(exc)
        assert ".item" in str(info.value)


def test_relaxed_mode_allows_syncs_outside_the_capture_only():
    with sim_runtime() as rt:
        m, F, S, side = _streams(rt)
        x = torch.arange(4, device=rt.device)
        g = m.CUDAGraph()
        with m.graph(g, stream=side, capture_error_mode="relaxed"):
            y = x * 2
            with m.stream(S):
                assert x.cpu().tolist() == [0, 1, 2, 3]  # another stream: allowed
        with pytest.raises(RuntimeError, match="not permitted"):
            with m.graph(m.CUDAGraph(), stream=side, capture_error_mode="relaxed"):
                (x * 2).cpu()  # the capturing stream itself: refused in every mode
        with pytest.raises(ValueError), m.stream(side):
            m.CUDAGraph().capture_begin(capture_error_mode="loose")
        assert rt.dev.capture is None
        del y


def test_capture_rules_default_stream_nesting_and_replay():
    with sim_runtime() as rt:
        m, F, S, side = _streams(rt)
        g = m.CUDAGraph()
        with pytest.raises(RuntimeError, match="non-default stream"):
            g.capture_begin()
        with pytest.raises(RuntimeError, match="already under way"):
            with m.graph(g, stream=side):
                with m.graph(m.CUDAGraph(), stream=S):
                    pass
        g1, g2 = m.CUDAGraph(), m.CUDAGraph()
        with m.graph(g1, stream=side):
            torch.ones(2, device=rt.device)
        with m.graph(g2, stream=side):
            torch.ones(2, device=rt.device)
            with pytest.raises(RuntimeError, match="capturing stream"):
                g1.replay()
        with pytest.raises(RuntimeError, match="already owns a captured graph"):
            with m.graph(g2, stream=side):
                pass
        g2.reset()
        with pytest.raises(RuntimeError, match="without a preceding successful capture"):
            g2.replay()
        with m.graph(g2, stream=side):  # re-captured after reset
            torch.ones(2, device=rt.device)
        g2.replay()
    with sim_runtime():
        with pytest.raises(RuntimeError, match="another simulated device"):
            g2.replay()


def test_fork_join_and_streams_outside_the_capture():
    with sim_runtime(parse_policy("lazy")) as rt:
        m, F, S, side = _streams(rt)
        branch, other = m.Stream(), m.Stream()
        a = torch.zeros(4, device=rt.device)
        b = torch.zeros(4, device=rt.device)
        c = torch.zeros(4, device=rt.device)
        m.synchronize()
        g = m.CUDAGraph()
        with m.graph(g, stream=side):
            a.add_(1)
            branch.wait_stream(side)  # fork: branch joins the capture
            with m.stream(branch):
                assert m.is_current_stream_capturing()
                b.add_(2)
            with m.stream(other):
                assert not m.is_current_stream_capturing()
                c.add_(3)  # not joined: ordinary work, queued now
            side.wait_stream(branch)  # join back
        assert [op.name for op in other.pending] == ["add_.Tensor"]
        with m.stream(F):
            g.replay()
        m.synchronize()
        assert (a.cpu().tolist(), b.cpu().tolist(), c.cpu().tolist()) == (
            [1.0] * 4, [2.0] * 4, [3.0] * 4)
        assert {r.stream for r in rt.trace.log if isinstance(r, ReplayedOp)} == {F.sid}


def test_unjoined_fork_and_external_wait_are_refused():
    with sim_runtime() as rt:
        m, F, S, side = _streams(rt)
        branch = m.Stream()
        x = torch.zeros(4, device=rt.device)
        with pytest.raises(RuntimeError, match="not joined back"):
            with m.graph(m.CUDAGraph(), stream=side):
                branch.wait_stream(side)
                with m.stream(branch):
                    x.add_(1)
        with m.stream(S):
            x.add_(1)
            outside = m.Event()
            outside.record()
        with pytest.raises(RuntimeError, match="StreamCaptureIsolation"):
            with m.graph(m.CUDAGraph(), stream=side):
                side.wait_event(outside)


def test_replay_race_reports_capture_and_replay_sites():
    with sim_runtime() as rt:
        m, F, S, side = _streams(rt)
        static_in = torch.zeros(4, device=rt.device)
        m.synchronize()
        g = m.CUDAGraph()
        with m.graph(g, stream=side):
            out = static_in * 2  # capture site
        with m.stream(F):
            g.replay()  # replay site
        with m.stream(S):
            out.clone()
        races = detect(rt.trace)
    assert len(races) == 1
    r = races[0]
    text = r.summary()
    here = "tests/harness/runtime/test_sim_graphs.py"
    assert f"forward mul.Tensor [write] captured at {here}:" in text
    assert f", replayed at {here}:" in text and "is unordered with schedule clone" in text
    js = r.to_json()
    assert js["first"]["replayed_at"]["file"] == here and "replayed_at" not in js["second"]
    assert js["first"]["line"] != js["first"]["replayed_at"]["line"]


def test_replays_are_deterministic():
    def run():
        with sim_runtime(parse_policy("random(5)")) as rt:
            from litmus.programs import get
            stale = get("graph_refill_inflight").run(rt, stall=True)
            return stale, [(o.stream, o.name, o.seq, o.start, o.end) for o in rt.trace.executed]
    assert run() == run()


# --- the litmus programs are not rubber stamps: seeded simulator bugs make them disagree ---

def _replay_does_nothing(self):
    self._replays += 1


def _replay_on_the_capture_stream(self):
    dev = G.current_device()
    origin = dev.capture_origin_for_test[id(self)]
    prev, dev.current = dev.current, dev.streams[origin]
    try:
        _REAL_REPLAY(self)
    finally:
        dev.current = prev


_REAL_REPLAY = G.CUDAGraph.replay
_REAL_BEGIN = G.CUDAGraph.capture_begin


def _begin_remembering_origin(self, *a, **k):
    _REAL_BEGIN(self, *a, **k)
    dev = G.current_device()
    if not hasattr(dev, "capture_origin_for_test"):
        dev.capture_origin_for_test = {}
    dev.capture_origin_for_test[id(self)] = dev.current.sid


SEEDED_BUGS = {
    "replay issues nothing": [("replay", _replay_does_nothing)],
    "replay on the capture stream": [("replay", _replay_on_the_capture_stream),
                                     ("capture_begin", _begin_remembering_origin)],
}


@pytest.mark.parametrize("program", GRAPH_PROGRAMS, ids=lambda p: p.name)
def test_each_graph_litmus_fails_on_a_seeded_simulator_bug(program, monkeypatch):
    policies = list(DEFAULT_SIM_POLICIES) + ["eager+stall"]  # agreeing: test_litmus.py
    caught = []
    for bug, patches in SEEDED_BUGS.items():
        with monkeypatch.context() as mp:
            for attr, fn in patches:
                mp.setattr(G.CUDAGraph, attr, fn)
            if any(not run_one_sim(program, p)["agree"] for p in policies):
                caught.append(bug)
    with monkeypatch.context() as mp:  # a simulator that lets syncs through a capture
        mp.setattr(G.SimCapture, "refuse", lambda self, *a, **k: None)
        if any(not run_one_sim(program, p)["agree"] for p in policies):
            caught.append("syncs allowed in a capture")
    assert caught, f"{program.name}: no seeded simulator bug changes its verdict"
