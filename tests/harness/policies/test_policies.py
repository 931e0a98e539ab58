"""Schedule policies on the simulator: spelling, determinism, what each one runs when, the
questions the device asks and the schedule it records (the choosers alone, without a
simulator: ``test_choosers.py``)."""
from __future__ import annotations

import json

import pytest
import torch

from harness.policies import (PCT, Eager, Lazy, PctChooser, RandomPolicy, Recorded, Stall,
                              parse_policy, standard_policies)
from harness.report.chrome import chrome_trace
from harness.runtime.policy import HOST, Chooser, Policy, Schedule
from harness.runtime.sim import SimDeviceError
from harness.runtime.sim.runtime import sim_runtime
from harness.runtime.sim.arbiter import runnable_ids
from harness.runtime.trace import SyncRecord
from litmus.programs import overlap_streams


@pytest.mark.parametrize("spec,cls,name", [
    ("eager", Eager, "eager"),
    ("lazy", Lazy, "lazy"),
    ("  lazy ", Lazy, "lazy"),
    ("stall(forward)", Stall, "stall(forward)"),
    ("stall(forward,schedule)", Stall, "stall(forward,schedule)"),
    ("stall( forward , copy-stream )", Stall, "stall(forward,copy-stream)"),
    ("random(0)", RandomPolicy, "random(0)"),
    ("random(42)", RandomPolicy, "random(42)"),
    ("pct(1)", PCT, "pct(1,3)"),
    ("pct(7,2)", PCT, "pct(7,2)"),
    ("pct(0, 16)", PCT, "pct(0,16)"),
])
def test_parse_accepts(spec, cls, name):
    pol = parse_policy(spec)
    assert type(pol) is cls
    assert str(pol) == name
    assert parse_policy(str(pol)) == pol and str(parse_policy(name)) == name  # round trip


@pytest.mark.parametrize("spec", [
    "", "   ", "Eager", "eager(1)", "lazy(0)", "stall", "stall()", "stall(1forward)",
    "stall(a b)", "stall(forward,)", "random", "random()", "random(-1)", "random(x)",
    "random(1,2)", "random(1.5)", "pct", "pct()", "pct(1,0)", "pct(1,17)", "pct(1,2,3)",
    "pct(-3)", "bogus", "bogus(1)", "eager lazy", "random(1", "stall(forward))",
])
def test_parse_rejects(spec):
    with pytest.raises(ValueError, match="bad policy"):
        parse_policy(spec)


def test_pct_depth_validated_directly():
    with pytest.raises(ValueError):
        PCT(1, depth=0)


def test_standard_policies():
    assert standard_policies() == ["eager", "lazy", "stall(forward)", "random(1)", "random(2)",
                                   "pct(1,3)", "pct(2,3)"]
    assert standard_policies(stall=None, seeds=(9,)) == ["eager", "lazy", "random(9)", "pct(9,3)"]
    for spec in standard_policies():
        parse_policy(spec)


# --- a three-stream program to schedule -----------------------------------------------------

def _program(rt, n=8, idle_points=0):
    """``idle_points``: after each op, while no stream head may run, that many extra host
    syncs of an unused stream -- scheduling points with nothing to choose."""
    m = rt.module
    streams = [m.Stream() for _ in range(3)]
    for s, name in zip(streams, ("schedule", "forward", "copy")):
        rt.label(s, name)
    spare = m.Stream()
    x = torch.zeros(16, dtype=torch.int64, device=rt.device)
    m.synchronize()
    events = []
    for i in range(n):
        s = streams[i % 3]
        with m.stream(s):
            if events and i % 2:
                s.wait_event(events[-1])
            x[i].add_(i)
            (x[:4] * 2).sum()
            e = m.Event()
            e.record()
            events.append(e)
        for _ in range(idle_points if not runnable_ids(rt.dev) else 0):
            spare.synchronize()
    m.synchronize()
    return x.tolist()


def _schedule(spec):
    with sim_runtime(parse_policy(spec)) as rt:
        values = _program(rt)
        order = [(op.stream, op.seq, op.name) for op in rt.trace.executed]
    return values, order


@pytest.mark.parametrize("spec", ["random(3)", "random(11)", "pct(1,3)", "pct(4,2)", "pct(9,5)"])
def test_seeded_policies_deterministic(spec):
    assert _schedule(spec) == _schedule(spec)


@pytest.mark.parametrize("family", ["random({})", "pct({},3)"])
def test_seeds_explore_different_schedules(family):
    orders = {tuple(_schedule(family.format(seed))[1]) for seed in range(8)}
    assert len(orders) >= 2
    # ... but every schedule computes the same (properly synchronised) values
    assert len({tuple(_schedule(family.format(seed))[0]) for seed in range(4)}) == 1


def test_policy_object_reusable_across_runs():
    """A policy is a value; each run gets a fresh chooser: one value, two runs, one schedule."""
    for pol in (RandomPolicy(5), PCT(5, 3)):
        orders = []
        for _ in range(2):
            with sim_runtime(pol) as rt:
                _program(rt)
                orders.append([(o.stream, o.seq) for o in rt.trace.executed])
        assert orders[0] == orders[1]


def test_the_runtime_takes_a_policy_value_not_a_spelling():
    with pytest.raises(TypeError, match="parse_policy"):
        with sim_runtime("lazy"):
            pass


# --- the questions the device asks, and the schedule it records ------------------------------

class _Spy(Policy, Chooser):
    """Asks ``inner`` and keeps every question and answer."""

    def __init__(self, inner: Policy) -> None:
        self.inner, self.asked = inner, []

    def chooser(self):
        self.c = self.inner.chooser()
        return self

    def choose(self, runnable, last, names):
        answer = self.c.choose(runnable, last, names)
        self.asked.append((list(runnable), last, answer))
        return answer

    def runs_idle(self, stream, names):
        return self.c.runs_idle(stream, names)

    def __str__(self) -> str:
        return f"spy({self.inner})"


@pytest.mark.parametrize("spec", ["eager", "lazy", "stall(forward)", "random(3)", "pct(2,3)"])
def test_the_device_asks_only_where_there_is_a_choice_and_records_every_answer(spec):
    spy = _Spy(parse_policy(spec))
    with sim_runtime(spy) as rt:
        _program(rt)
        schedule = list(rt.trace.schedule)
        executed = [op.stream for op in rt.trace.executed]
    assert spy.asked and schedule == [a for _, _, a in spy.asked]
    for runnable, last, answer in spy.asked:
        assert runnable and runnable == sorted(runnable)  # never asked with nothing to run
        assert answer == HOST or answer in runnable
        assert last is None or last in executed
    # a stream the answer named ran next (answers are not all of it: drains and the idle
    # fast path run ops without a question)
    ran = [a for _, _, a in spy.asked if a != HOST]
    assert len(ran) <= len(executed)


def test_eager_skips_the_question_for_an_idle_stream_and_lazy_is_asked_at_every_enqueue():
    counts = {}
    for spec in ("eager", "lazy"):
        spy = _Spy(parse_policy(spec))
        with sim_runtime(spy) as rt:
            _program(rt)
            counts[spec] = (len(spy.asked), len(rt.trace.executed))
    eager_asked, ops = counts["eager"]
    assert eager_asked < ops // 2  # the fast path ran most ops without a question
    assert counts["lazy"][0] > eager_asked


def test_a_chooser_naming_a_stream_that_cannot_run_is_a_device_error():
    class Bad(Policy, Chooser):
        def chooser(self):
            return self

        def choose(self, runnable, last, names):
            return max(runnable) + 1

        def __str__(self):
            return "bad"

    with sim_runtime(Bad()) as rt:
        with pytest.raises(SimDeviceError, match="policy bad chose stream"):
            _program(rt)


def _trace_bytes(trace) -> str:
    return json.dumps(chrome_trace(trace, []), sort_keys=True)


@pytest.mark.parametrize("spec", ["eager", "lazy", "stall(forward)", "random(3)", "random(11)",
                                  "pct(1,3)", "pct(9,5)"])
def test_a_recorded_schedule_replays_the_same_trace_byte_for_byte(spec):
    pol = parse_policy(spec)
    with sim_runtime(pol) as rt:
        values = _program(rt)
        recorded, trace = rt.trace.schedule, _trace_bytes(rt.trace)
    with sim_runtime(Recorded(pol, recorded)) as rt:
        assert _program(rt) == values
        assert rt.trace.schedule == recorded
        assert rt.dev.policy.chooser.diverged_at is None
        assert _trace_bytes(rt.trace) == trace


def test_a_schedule_that_does_not_fit_the_program_is_told_not_hidden():
    pol = parse_policy("random(3)")
    with sim_runtime(pol) as rt:
        _program(rt)
        recorded = rt.trace.schedule.choices
    i = next(k for k, c in enumerate(recorded) if c != HOST)
    tampered = Schedule(recorded[:i] + (99,) + recorded[i + 1:])  # a stream never made
    with sim_runtime(Recorded(pol, tampered)) as rt:
        _program(rt)  # the run goes on (the host goes on from there): no engine crash
        assert rt.dev.policy.chooser.diverged_at == i
        assert rt.trace.schedule != tampered


class _ShortPct(Policy):
    """PCT with its change points among the first 12 real choices (the program is short)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def chooser(self):
        return PctChooser(self.seed, depth=3, steps=12)

    def __str__(self) -> str:
        return f"pct({self.seed},3) within 12"


def test_pct_change_points_count_only_real_choices():
    """Scheduling points with nothing to choose (host syncs while no head may run) are no
    questions, so they move no change point: the schedule is the same with or without
    them, and every recorded answer was one real choice."""
    mattered = 0
    for seed in range(8):
        runs = []
        for idle_points in (0, 3):
            with sim_runtime(_ShortPct(seed)) as rt:
                _program(rt, n=12, idle_points=idle_points)
                chooser = rt.dev.policy.chooser
                syncs = sum(isinstance(r, SyncRecord) for r in rt.trace.log)
                runs.append(([(o.stream, o.seq) for o in rt.trace.executed],
                             list(rt.trace.schedule), syncs))
                assert chooser.real_choices == len(rt.trace.schedule)
        (order0, sched0, syncs0), (order3, sched3, syncs3) = runs
        assert (order3, sched3) == (order0, sched0)
        # counting mattered where idle points were made and a change point fell inside
        mattered += syncs3 > syncs0 and len(chooser.changes) < 2
    assert mattered >= 2


# --- what runs when ---------------------------------------------------------------------------



def test_eager_runs_at_enqueue():
    with sim_runtime(parse_policy("eager")) as rt:
        m, S, F = overlap_streams(rt)
        x = torch.zeros(4, device=rt.device)
        for s in (S, F, S):
            with m.stream(s):
                x.add_(1)
                assert rt.dev.pending_ops() == 0
        assert x._buf.tolist() == [3.0] * 4


def test_lazy_runs_only_on_demand():
    with sim_runtime(parse_policy("lazy")) as rt:
        m, S, F = overlap_streams(rt)
        with m.stream(F):
            a = torch.ones(4, device=rt.device) * 2
        with m.stream(S):
            b = torch.ones(4, device=rt.device) + 1
        assert rt.dev.pending_ops() == 4
        with m.stream(S):
            assert b.tolist() == [2.0] * 4
        assert F.done == 0 and len(F.pending) == 2  # S's sync did not run F
        F.synchronize()
        assert rt.dev.pending_ops() == 0 and a._buf.tolist() == [2.0] * 4


def test_stall_delays_only_the_named_stream():
    with sim_runtime(parse_policy("stall(forward)")) as rt:
        m, S, F = overlap_streams(rt)
        x = torch.zeros(4, device=rt.device)  # default stream: runs at once
        assert rt.dev.pending_ops() == 0
        with m.stream(F):
            x.add_(1)
            x.mul_(3)
        with m.stream(S):
            y = torch.full((4,), 7.0, device=rt.device)
            y.add_(1)
        assert S.done == S.enq == 2 and rt.dev.default_stream.done == rt.dev.default_stream.enq
        assert F.done == 0 and F.enq == 2
        with m.stream(S):
            S.wait_stream(F)  # S now waits behind forward: blocked, not forcing it
            z = x + y
        assert F.done == 0 and len(S.pending) == 2
        with m.stream(S):
            assert z.tolist() == [11.0] * 4  # a sync on S drains forward through the wait
        assert F.done == 2


def test_stall_of_several_streams():
    with sim_runtime(parse_policy("stall(forward,schedule)")) as rt:
        m, S, F = overlap_streams(rt)
        for s in (S, F):
            with m.stream(s):
                torch.ones(2, device=rt.device).add_(1)
        assert S.done == F.done == 0
        torch.ones(2, device=rt.device)  # default stream is free
        assert rt.dev.default_stream.done == rt.dev.default_stream.enq


def test_timed_stall_expires_with_host_progress():
    """stall(ms) holds the stream in virtual time; the host's API calls advance it."""
    with sim_runtime(parse_policy("eager")) as rt:
        m, S, F = overlap_streams(rt)
        with m.stream(F):
            rt.stall(0.005)  # 5 virtual microseconds
            x = torch.ones(2, device=rt.device) * 5
        assert F.done == 0
        with m.stream(S):
            for _ in range(8):  # each host API call is one virtual microsecond
                torch.ones(1, device=rt.device)
        assert F.done == F.enq
        assert x._buf.tolist() == [5.0, 5.0]


def test_unbounded_stall_held_until_forced():
    with sim_runtime(parse_policy("eager")) as rt:
        m, S, F = overlap_streams(rt)
        with m.stream(F):
            rt.stall(None)
            x = torch.ones(2, device=rt.device) * 5
        with m.stream(S):
            for _ in range(50):
                torch.ones(1, device=rt.device)
        assert F.done == 0
        with m.stream(F):
            assert x.tolist() == [5.0, 5.0]  # the sync forces the stall


@pytest.mark.parametrize("spec", ["lazy", "stall(forward)", "eager", "random(2)", "pct(3,3)"])
def test_query_polling_terminates(spec):
    with sim_runtime(parse_policy(spec)) as rt:
        m, S, F = overlap_streams(rt)
        x = torch.arange(4, device=rt.device)
        host = torch.zeros(4, dtype=torch.int64, pin_memory=True)
        m.synchronize()
        with m.stream(F):
            rt.stall(None)
            for _ in range(5):
                x = x + 1
            host.copy_(x, non_blocking=True)
            done = m.Event()
            done.record()
        polls = 0
        while not done.query():
            polls += 1
            assert polls < 100
        assert host.tolist() == [5, 6, 7, 8]
        assert F.query()
        if spec != "eager":
            assert polls >= 1  # the work really was pending


def test_stream_query_polling_terminates_lazy():
    with sim_runtime(parse_policy("lazy")) as rt:
        m, S, F = overlap_streams(rt)
        with m.stream(F):
            y = torch.ones(3, device=rt.device).cumsum(0)
        polls = 0
        while not F.query():
            polls += 1
            assert polls < 100
        assert polls >= 1 and y._buf.tolist() == [1.0, 2.0, 3.0]
