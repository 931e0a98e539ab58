"""CUDA graphs in the CUDA trace capture, on CPU stand-ins (no GPU needed).

The capture/replay wrappers of ``torch.cuda.CUDAGraph`` run on ``FakeGraph`` with CPU
tensors standing for device memory (``cpu_capture``, as in ``test_cuda_backend.py``): what a
graph's kernels touch is recorded while it is captured -- not logged as executed ops -- and
every replay is logged as those accesses on the replaying stream, for the real detector.
"""
from __future__ import annotations

import pytest
import torch

from harness.detect import detect
from harness.runtime import cuda as C
from harness.runtime import open_runtime
from harness.runtime.trace import STALL_OP, EventRecord, OpKind, OpRecord, ReplayedOp

# pytest puts this directory on sys.path (rootdir-relative, "prepend" import mode)

from test_cuda_backend import FakeEvent, FakeGraph, FakeStream, cpu_capture


def _ops(trace):
    return [r for r in trace.log if isinstance(r, OpRecord)]


def _capture(fake, stream, body):
    g = FakeGraph()
    with fake.on(stream):
        g.capture_begin()
        out = body()
        g.capture_end()
    return g, out


def test_capture_records_instead_of_logging_and_replay_logs_on_its_stream():
    with cpu_capture() as (cap, fake):
        side, fwd = FakeStream(9), FakeStream(11)
        cap.stream_id(11, "forward")
        static_in = torch.zeros(4)
        before = len(_ops(cap.trace))
        g, out = _capture(fake, side, lambda: static_in * 10)  # capture site
        assert len(_ops(cap.trace)) == before  # captured: nothing executed, nothing logged
        with fake.on(fwd):
            g.replay()  # replay site
            g.replay()
    replays = [o for o in _ops(cap.trace) if isinstance(o, ReplayedOp)]
    assert [(o.name, o.stream, o.seq, o.replay.n) for o in replays] == [
        ("mul.Tensor", cap.stream_id(11), 1, 1), ("mul.Tensor", cap.stream_id(11), 2, 2)]
    first = replays[0]
    sid_in = _ops(cap.trace)[0].writes[0][0]
    assert first.reads == [(sid_in, 0, 16)] and first.writes[0][0] != sid_in
    assert first.frame[0] == __file__ and first.replay.frame[0] == __file__
    assert first.frame[1] != first.replay.frame[1]  # the capture line, the replay line
    assert replays[0].replay.graph == replays[1].replay.graph
    del out


def _captured_beside_two_streams(cap, fake, body):
    """``body`` captured on a side stream, and the forward and schedule streams (labelled,
    each after the default stream) a test replays and reads it on: (graph, its output,
    forward, schedule)."""
    side, fwd, sch = FakeStream(9), FakeStream(11), FakeStream(22)
    cap.stream_id(11, "forward")
    cap.stream_id(22, "schedule")
    fwd.wait_stream(FakeStream(0))
    sch.wait_stream(FakeStream(0))
    g, out = _capture(fake, side, body)
    return g, out, fwd, sch


def test_replay_then_read_on_another_stream_races_unless_waited():
    for wait in (False, True):
        with cpu_capture() as (cap, fake):
            static_in = torch.zeros(4)
            g, out, fwd, sch = _captured_beside_two_streams(cap, fake, lambda: static_in + 1)
            with fake.on(fwd):
                g.replay()
            with fake.on(sch):
                if wait:
                    sch.wait_stream(fwd)
                out.clone()
        races = detect(cap.trace)
        if wait:
            assert races == [], [r.summary() for r in races]
            continue
        assert [(r.kind, r.first.actor, r.second.actor) for r in races] == [
            ("RAW", "forward", "schedule")]
        text = races[0].summary()
        assert "captured at tests/harness/runtime/test_cuda_graphs.py:" in text
        assert "replayed at tests/harness/runtime/test_cuda_graphs.py:" in text
        assert races[0].to_json()["first"]["replayed_at"]["function"] == \
            "test_replay_then_read_on_another_stream_races_unless_waited"


def test_static_input_refilled_while_the_replay_may_still_read_it():
    with cpu_capture() as (cap, fake):
        static_in = torch.zeros(4)
        g, out, fwd, sch = _captured_beside_two_streams(cap, fake, lambda: static_in * 2)
        with fake.on(fwd):
            g.replay()
        with fake.on(sch):
            static_in.fill_(7.0)  # the next batch, staged without waiting for the replay
    races = detect(cap.trace)
    assert [(r.kind, r.first.actor, r.first.op, r.second.actor) for r in races] == [
        ("WAR", "forward", "mul.Tensor", "schedule")]
    assert races[0].first.replayed_at is not None and races[0].second.replayed_at is None
    del out


def test_fork_join_inside_a_capture_and_other_streams_outside_it():
    with cpu_capture() as (cap, fake):
        side, branch, other = FakeStream(9), FakeStream(10), FakeStream(12)
        a = torch.zeros(4)
        b = torch.zeros(4)
        g = FakeGraph()
        with fake.on(side):
            g.capture_begin()
            a.add_(1)
            branch.wait_stream(side)  # fork: branch joins the capture
            with fake.on(branch):
                b.add_(2)  # captured
            with fake.on(other):
                torch.ones(2)  # not joined: ordinary work, logged now
            side.wait_stream(branch)  # join back
            g.capture_end()
        logged = [o.name for o in _ops(cap.trace)]
        with fake.on(FakeStream(11)):
            g.replay()
    assert logged[-1] == "ones.default" and "add_.Tensor" not in logged
    replays = [o for o in _ops(cap.trace) if isinstance(o, ReplayedOp)]
    # both branches' kernels, in capture order, on the replaying stream; no wait markers
    assert [o.name for o in replays] == ["add_.Tensor", "add_.Tensor"]
    assert {o.stream for o in replays} == {cap.stream_id(11)}
    assert not [r for r in cap.trace.log if isinstance(r, EventRecord)]


def test_failed_capture_keeps_nothing():
    class FailingGraph(FakeGraph):
        def capture_end(self):
            raise RuntimeError("operation failed due to a previous error during capture")

    with cpu_capture() as (cap, fake):
        C.ensure_api_wrapped(FakeStream, FakeEvent, fake.module, FailingGraph)
        side = FakeStream(9)
        x = torch.zeros(4)
        g = FailingGraph()
        with fake.on(side):
            g.capture_begin()
            x.add_(1)
            try:
                g.capture_end()
            except RuntimeError:
                pass
        assert cap.graph is None
        torch.ones(1)  # logged again: the capture is over
        g.replay()
    assert [o.name for o in _ops(cap.trace)] == ["zeros.default", "ones.default"]


def test_graph_from_an_earlier_run_is_not_trusted_and_reset_forgets():
    with cpu_capture() as (cap, fake):
        g, _ = _capture(fake, FakeStream(9), lambda: torch.ones(2) + 1)
    with cpu_capture() as (cap2, fake2):
        g.replay()  # captured in another run: its storages are unknown here
        g2, _ = _capture(fake2, FakeStream(9), lambda: torch.ones(2) + 1)
        g2.reset()
        g2.replay()
    assert not [o for o in _ops(cap2.trace) if isinstance(o, ReplayedOp)]


def test_stall_captured_in_a_graph_is_replayed():
    with cpu_capture() as (cap, fake):
        side = FakeStream(9)
        x = torch.zeros(4)
        g = FakeGraph()
        with fake.on(side):
            g.capture_begin()
            cap.op(cap.cur(), STALL_OP, [], [], None, kind=OpKind.STALL,
                   duration=5.0)  # rt.stall
            x.add_(1)
            g.capture_end()
        with fake.on(FakeStream(11)):
            g.replay()
    replays = [o for o in _ops(cap.trace) if isinstance(o, ReplayedOp)]
    assert [(o.kind, o.duration) for o in replays] == [(OpKind.STALL, 5.0), (OpKind.KERNEL, 1.0)]


def test_graph_api_wrapped_once():
    with cpu_capture():
        first = FakeGraph.replay
    with cpu_capture():
        assert FakeGraph.replay is first and first._specrace_wrapper


# --- on a GPU: a real torch.cuda graph through the CUDA runtime's trace capture ----------

@pytest.mark.cuda
def test_real_graph_replay_is_traced_on_its_stream():
    with C.watchdog(120, "cuda graph test"), open_runtime("cuda") as rt:
        m = rt.module
        F, S, side = m.Stream(), m.Stream(), m.Stream()
        for s, name in ((F, "forward"), (S, "schedule"), (side, "graph")):
            rt.label(s, name)
        static_in = torch.zeros(4, device=rt.device)
        m.synchronize()
        side.wait_stream(m.current_stream())
        with m.stream(side):
            static_in * 2  # warm-up: no lazy kernel loading inside the capture
        g = m.CUDAGraph()
        with m.graph(g, stream=side):
            out = static_in * 2
        with m.stream(F):
            g.replay()
        with m.stream(S):
            out.clone()  # no wait: races with the replay
            S.wait_stream(F)
            out.clone()  # waited: ordered
        m.synchronize()
    replays = [o for o in _ops(rt.trace) if isinstance(o, ReplayedOp)]
    assert [o.name for o in replays] == ["mul.Tensor"]
    races = detect(rt.trace)
    assert [(r.kind, r.first.actor, r.second.actor) for r in races] == [
        ("RAW", "forward", "schedule")], [r.summary() for r in races]
    assert races[0].first.replayed_at is not None
