"""Simulator sessions are closed worlds: ids are numbered per run (same run, same trace, in
one process too), streams and events cannot leak into the next session, and a host sync
that can never return raises a clear deadlock error instead of hanging or recursing."""
from __future__ import annotations

import json

import pytest
import torch

from harness.trials.drive import server_args
from harness.trials.trial import run_trial
from harness.report.chrome import chrome_trace
from harness.runtime.sim import SimDeviceError
from harness.runtime.sim.streams import current_device
from harness.runtime.sim.runtime import sim_runtime
from harness.runtime.trace import WAIT_EVENT, OpKind, OpRecord
from harness.policies import parse_policy
from scenarios.registry import get
import targets


# --- same input, same trace, also in-process --------------------------------------------

def _seed_trial(variant="pre-fix"):
    sc = get("ngram-filter-race")
    wl = sc.workload(0)
    args = server_args(wl, {**sc.variants[variant].args, "war_barrier": "fine"}, targets.get("impl"))
    return run_trial("sim", parse_policy("eager"), wl, args, sc.stalls(None), keep_trace=True,
                     answers=sc.answers, target=targets.get("impl"))


def test_the_same_run_twice_in_one_process_gives_the_same_trace():
    first, second = _seed_trial(), _seed_trial()
    assert first.races and first.trace is not None
    a = json.dumps(chrome_trace(first.trace, first.races), sort_keys=True)
    b = json.dumps(chrome_trace(second.trace, second.races), sort_keys=True)
    assert a == b
    assert [r.summary() for r in first.races] == [r.summary() for r in second.races]


def test_storage_and_event_ids_start_afresh_in_each_session():
    seen = []
    for _ in range(2):
        with sim_runtime() as rt:
            x = torch.zeros(4, device=rt.device)
            ev = rt.module.Event()
            ev.record()
            seen.append((x._sid, ev.eid))
    assert seen[0] == seen[1] == (1, 1)


# --- streams and events belong to their session -----------------------------------------

def test_an_event_carried_into_the_next_session_is_a_clear_error():
    with sim_runtime() as rt:
        ev = rt.module.Event()
        torch.ones(3, device=rt.device)
        ev.record()
    with sim_runtime() as rt:
        s = rt.module.Stream()
        for use in (lambda: s.wait_event(ev), lambda: ev.wait(), ev.query, ev.synchronize,
                    ev.record):
            with pytest.raises(SimDeviceError, match="another simulator session"):
                use()
        rt.synchronize()  # nothing was enqueued on the old event's account


def test_a_stream_carried_into_the_next_session_is_a_clear_error():
    with sim_runtime() as rt:
        old = rt.module.Stream()
    with sim_runtime() as rt:
        for use in (old.synchronize, old.query, lambda: rt.module.set_stream(old),
                    lambda: rt.module.Event().record(old)):
            with pytest.raises(SimDeviceError, match="another simulator session"):
                use()
        with pytest.raises(SimDeviceError, match="another simulator session"):
            with rt.module.stream(old):
                pass


def test_an_event_made_outside_a_session_joins_the_first_it_is_used_in():
    from harness.runtime.sim import module
    ev = module.Event()
    with sim_runtime() as rt:
        torch.ones(2, device=rt.device)
        ev.record()
        ev.synchronize()
        assert ev.query() and ev.eid == 1


# --- deadlocks: raised, never a hang or a RecursionError --------------------------------

def _wait(dev, stream, on):
    return dev.enqueue(OpRecord(stream.sid, WAIT_EVENT, [], [], None, kind=OpKind.WAIT,
                                wait_for=on, duration=0.0))


@pytest.mark.parametrize("policy", ["eager", "lazy"])
def test_a_wait_cycle_is_a_deadlock_at_the_host_sync(policy):
    from harness.policies import parse_policy
    from harness.runtime import DeadlockError
    from harness.runtime.sim.device import SimDeadlock
    with sim_runtime(parse_policy(policy)) as rt:
        dev = current_device()
        a, b = rt.module.Stream(), rt.module.Stream()
        _wait(dev, a, (b.sid, 2))  # a waits for b's second op ...
        _wait(dev, b, (a.sid, 1))  # ... which waits for a's first: a cycle
        with pytest.raises(SimDeadlock, match="wait cycle") as info:
            a.synchronize()
        assert isinstance(info.value, DeadlockError)
        with pytest.raises(SimDeadlock, match="wait cycle"):
            while not a.query():  # a polling host does not spin forever either
                pass


def test_a_wait_for_an_op_never_enqueued_is_a_deadlock():
    from harness.runtime.sim.device import SimDeadlock
    with sim_runtime(None) as rt:
        dev = current_device()
        a, b = rt.module.Stream(), rt.module.Stream()
        from harness.policies import Lazy
        dev.set_policy(Lazy())
        _wait(dev, a, (b.sid, 5))
        with pytest.raises(SimDeadlock, match="never enqueued"):
            a.synchronize()


def test_a_long_chain_of_waits_drains_without_recursion():
    from harness.policies import Lazy
    with sim_runtime(Lazy()) as rt:
        streams = [rt.module.Stream() for _ in range(3000)]  # deeper than the recursion limit
        with rt.module.stream(streams[0]):
            x = torch.ones(4, device=rt.device)
        for prev, nxt in zip(streams, streams[1:]):
            nxt.wait_stream(prev)
        with rt.module.stream(streams[-1]):
            y = x + 1
        streams[-1].synchronize()
        assert y.cpu().tolist() == [2.0] * 4


def test_the_trial_runner_reports_a_deadlock_as_a_finding(monkeypatch):
    from impl.scheduler import Scheduler
    step = Scheduler.step

    def stuck(self):
        if self.iteration == 2 and self.args.overlap:  # the trial, not the reference: a
            # stream made to wait on an op that never comes
            dev = current_device()
            _wait(dev, dev.current, (dev.current.sid, dev.current.enq + 5))
        return step(self)

    monkeypatch.setattr(Scheduler, "step", stuck)
    res = _seed_trial("fixed")
    assert res.divergence.kind == "deadlock" and res.divergence.where == "trial"
    assert "deadlock" in res.divergence.message


# --- one stall cap -----------------------------------------------------------------------

def test_one_stall_cap_for_every_backend_and_the_cli():
    from harness.report.schema import REPORT_SCHEMA
    from harness.runtime import cuda, limits
    from harness.runtime.sim import runtime as simrt
    assert simrt.MAX_STALL_MS == cuda.MAX_STALL_MS == limits.MAX_STALL_MS
    assert REPORT_SCHEMA["properties"]["stall_ms"]["maximum"] == limits.MAX_STALL_MS
    with sim_runtime() as rt:
        rt.stall(10 * limits.MAX_STALL_MS)
        op = rt.trace.ops()[-1]
    assert op.kind == OpKind.STALL and op.duration == limits.MAX_STALL_MS * 1000.0
