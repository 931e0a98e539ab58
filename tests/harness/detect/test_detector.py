"""The happens-before detector, one rule at a time.

Each test pins one rule of ``harness/detect/hb.py``; breaking that rule makes the test
fail. Most build traces by hand (exactly the records the rule is about); the sync-API
tests run real programs on the simulator under ``lazy`` so the records come from the
runtime itself.
"""
from __future__ import annotations

import collections

import pytest
import torch

from harness.detect import detect
from harness.policies import parse_policy
from harness.runtime.sim.runtime import sim_runtime
from harness.runtime.trace import (COPY_D2H, COPY_H2D, HOST_READ, WAIT_EVENT, AllocRecord,
                                   FreeRecord, HostAccess, OpKind, OpRecord, QueryRecord,
                                   SyncRecord, Trace)
from litmus.programs import PROGRAMS

F, S, T = 1, 2, 3  # stream ids: forward, schedule, a third
X, Y = 100, 200  # storage ids


class Prog:
    """Builds a trace the way the runtime does: every record in host order."""

    def __init__(self) -> None:
        self.trace = Trace(stream_names={0: "default", F: "forward", S: "schedule", T: "third"})
        self.enq = collections.Counter()

    def op(self, stream, name, reads=(), writes=(), wait_for=None):
        self.enq[stream] += 1
        rec = OpRecord(stream, name, list(reads), list(writes),
                       ("prog.py", len(self.trace.log), name),
                       kind=OpKind.WAIT if wait_for else OpKind.KERNEL, wait_for=wait_for)
        rec.seq = self.enq[stream]
        self.trace.add(rec)
        return (stream, rec.seq)

    def write(self, stream, acc, name="write"):
        return self.op(stream, name, writes=[acc])

    def read(self, stream, acc, name="read"):
        return self.op(stream, name, reads=[acc])

    def wait(self, stream, position):
        return self.op(stream, WAIT_EVENT, wait_for=position)

    def sync(self, *positions, label="stream.synchronize"):
        self.trace.add(SyncRecord(label, list(positions), None))

    def query(self, position):
        self.trace.add(QueryRecord("event.query", position, None))

    def host(self, acc, write=False, name="host"):
        self.trace.add(HostAccess(acc, write, name, ("prog.py", len(self.trace.log), name)))

    def alloc(self, sid, stream, block=1, prev=None):
        self.trace.add(AllocRecord(block, sid, stream, 16, ("prog.py", len(self.trace.log),
                                                            "alloc"), prev))

    def free(self, sid, stream, block=1, waits=()):
        self.trace.add(FreeRecord(block, sid, stream, list(waits), None))

    def races(self):
        return detect(self.trace)


def _acc(sid=X, lo=0, hi=16):
    return (sid, lo, hi)


# --- program order ----------------------------------------------------------------------

def test_program_order_same_stream():
    p = Prog()
    p.write(F, _acc())
    p.read(F, _acc())
    p.write(F, _acc())
    p.host(_acc(Y), write=True)
    p.host(_acc(Y))
    assert p.races() == []


def test_program_order_carries_through_an_event():
    """An event recorded after two writes covers the first one too."""
    p = Prog()
    p.write(F, _acc())
    pos = p.op(F, "other", writes=[_acc(Y)])
    p.wait(S, pos)
    p.read(S, _acc())
    p.read(S, _acc(Y))
    assert p.races() == []


# --- host -> op at enqueue ----------------------------------------------------------------

def test_host_write_then_enqueued_op_is_ordered():
    p = Prog()
    p.host(_acc(Y), write=True, name="host fills staging")
    p.read(F, _acc(Y), name=COPY_H2D)
    assert p.races() == []


def test_host_sync_then_later_enqueue_on_another_stream():
    p = Prog()
    w = p.write(F, _acc())
    p.sync(w)
    p.read(S, _acc())  # enqueued after the host learned F finished
    assert p.races() == []


# --- event record / wait ------------------------------------------------------------------

def test_event_wait_orders():
    p = Prog()
    w = p.write(F, _acc())
    p.wait(S, w)
    p.read(S, _acc())
    assert p.races() == []


def test_event_wait_is_point_in_time():
    p = Prog()
    w1 = p.write(F, _acc(), name="w1")
    p.write(F, _acc(), name="w2")
    p.wait(S, w1)
    p.read(S, _acc())
    races = p.races()
    assert len(races) == 1 and races[0].first.op == "w2" and races[0].kind == "RAW"


def test_event_wait_is_transitive():
    p = Prog()
    w = p.write(F, _acc())
    p.wait(S, w)
    s2 = p.op(S, "noop")
    p.wait(T, s2)
    p.read(T, _acc())
    assert p.races() == []


# --- host sync edges (through the simulator's own records) ---------------------------------

def _d2h_setup(rt):
    """The forward stream (labelled), ``x`` = 0..3 on the device and a pinned ``host`` of
    four zeros to copy it into, everything settled: ``(m, Fs, x, host)``."""
    m = rt.module
    Fs = m.Stream()
    rt.label(Fs, "forward")
    x = torch.arange(4, device=rt.device)
    host = torch.zeros(4, dtype=torch.int64, pin_memory=True)
    m.synchronize()
    return m, Fs, x, host


def _sync_program(how: str) -> list:
    with sim_runtime(parse_policy("lazy")) as rt:
        m = rt.module
        Fs, Ss = m.Stream(), m.Stream()
        rt.label(Fs, "forward")
        rt.label(Ss, "schedule")
        x = torch.zeros(4, dtype=torch.int32, device=rt.device)
        host = torch.zeros(4, dtype=torch.int32, pin_memory=True)
        m.synchronize()
        with m.stream(Fs):
            x.add_(1)
            host.copy_(x, non_blocking=True)
            ev = m.Event()
            ev.record()
            if how == "blocking .cpu":
                x.cpu()
            elif how == "blocking .item":
                x[0].item()
            elif how == "blocking .tolist":
                x.tolist()
            elif how == "int()":
                int(x[1])
            elif how == "nonzero (implicit)":
                x.nonzero()
            elif how == "copy_ into pageable":
                torch.zeros(4, dtype=torch.int32).copy_(x)
        if how == "stream.synchronize":
            Fs.synchronize()
        elif how == "event.synchronize":
            ev.synchronize()
        elif how == "device.synchronize":
            m.synchronize()
        elif how == "wrong stream.synchronize":
            Ss.synchronize()
        elif how == "none":
            pass
        host.tolist()  # host read of the pinned buffer
        with m.stream(Ss):
            x.tolist()  # a schedule-stream read of the device buffer
        m.synchronize()
        return detect(rt.trace)


@pytest.mark.parametrize("how", ["stream.synchronize", "event.synchronize", "device.synchronize",
                                 "blocking .cpu", "blocking .item", "blocking .tolist", "int()",
                                 "nonzero (implicit)", "copy_ into pageable"])
def test_host_sync_edge(how):
    assert _sync_program(how) == []


@pytest.mark.parametrize("how", ["none", "wrong stream.synchronize"])
def test_missing_host_sync_is_a_race(how):
    races = _sync_program(how)
    kinds = sorted((r.kind, r.first.actor, r.second.actor, r.storage.startswith("pinned"))
                   for r in races)
    assert kinds == [("RAW", "forward", "host", True), ("RAW", "forward", "schedule", False)]


def test_sync_record_joins_only_the_named_position():
    p = Prog()
    w1 = p.write(F, _acc(), name="w1")
    p.write(F, _acc(Y), name="w2")
    p.sync(w1, label="event.synchronize")
    p.host(_acc())  # covered
    p.host(_acc(Y))  # not covered: w2 came after the event
    races = p.races()
    assert [(r.first.op, r.second.actor) for r in races] == [("w2", "host")]


# --- query() == True ----------------------------------------------------------------------

def test_query_true_is_a_sync():
    p = Prog()
    w = p.write(F, _acc(), name=COPY_D2H)
    p.query(w)
    p.host(_acc())
    assert p.races() == []


def test_query_poll_loop_on_sim_no_false_positive():
    for policy in ("lazy", "stall(forward)", "eager", "random(4)"):
        with sim_runtime(parse_policy(policy)) as rt:
            m, Fs, x, host = _d2h_setup(rt)
            with m.stream(Fs):
                rt.stall(None)
                host.copy_(x * 3, non_blocking=True)
                ev = m.Event()
                ev.record()
            while not ev.query():
                pass
            assert host.tolist() == [0, 3, 6, 9]
            assert detect(rt.trace) == [], policy


def test_query_false_is_not_a_sync():
    with sim_runtime(parse_policy("lazy")) as rt:
        m, Fs, x, host = _d2h_setup(rt)
        with m.stream(Fs):
            rt.stall(None)
            host.copy_(x, non_blocking=True)
            ev = m.Event()
            ev.record()
        assert ev.query() is False
        host.tolist()
        races = detect(rt.trace)
        assert [(r.kind, r.second.actor) for r in races] == [("RAW", "host")]


# --- host reads of pinned memory (what CSAN lacks) -----------------------------------------

def test_host_read_of_pending_d2h_is_a_race():
    p = Prog()
    p.op(F, COPY_D2H, reads=[_acc(X)], writes=[_acc(Y)])
    p.host(_acc(Y), name=HOST_READ)
    races = p.races()
    assert len(races) == 1
    r = races[0]
    assert (r.kind, r.first.actor, r.first.op, r.second.actor) == (
        "RAW", "forward", COPY_D2H, "host")


def test_host_write_of_pending_h2d_source_is_a_race():
    p = Prog()
    p.op(F, COPY_H2D, reads=[_acc(Y)], writes=[_acc(X)])
    p.host(_acc(Y), write=True, name="host refill")
    races = p.races()
    assert [(r.kind, r.first.op, r.second.actor) for r in races] == [("WAR", COPY_H2D, "host")]


def test_pinned_tolist_is_recorded_on_sim():
    """tolist() reads memory without dispatching; the pinned subclass still reports it."""
    with sim_runtime(parse_policy("lazy")) as rt:
        host = torch.zeros(3, dtype=torch.int32, pin_memory=True)
        host.tolist()
        host[1:].tolist()
        accesses = [r for r in rt.trace.log if isinstance(r, HostAccess)]
        assert len(accesses) >= 2 and not any(a.write for a in accesses[-2:])
        assert accesses[-1].access[1:] == (4, 12)  # the view's byte range


def test_pinned_views_are_not_host_reads():
    """Slicing / reshaping a pinned buffer before the sync touches no data: no race."""
    with sim_runtime(parse_policy("lazy")) as rt:
        m, Fs, x, host = _d2h_setup(rt)
        with m.stream(Fs):
            host.copy_(x, non_blocking=True)
            done = m.Event()
            done.record()
        first, grid, col = host[:2], host.view(2, 2), host.view(2, 2)[:, 0]
        grid.t_()
        like = (torch.zeros_like(host), host.new_zeros(3))
        before = sum(isinstance(r, HostAccess) for r in rt.trace.log)
        done.synchronize()
        assert (first.tolist(), grid.tolist(), col.tolist()) == ([0, 1], [[0, 2], [1, 3]], [0, 2])
        assert like[0].tolist() == [0, 0, 0, 0]
        assert detect(rt.trace) == []
        reads = [r for r in rt.trace.log if isinstance(r, HostAccess)]
        assert len(reads) - before == 3 and not any(r.write for r in reads[before:])


# --- byte ranges --------------------------------------------------------------------------

def test_disjoint_byte_ranges_do_not_race():
    p = Prog()
    p.write(F, _acc(X, 0, 16))
    p.read(S, _acc(X, 16, 32))
    p.write(S, _acc(X, 32, 48))
    p.read(F, _acc(Y, 0, 16))
    p.write(S, _acc(X + 1, 0, 16))  # another storage, same bytes
    assert p.races() == []


def test_overlapping_byte_ranges_race():
    p = Prog()
    p.write(F, _acc(X, 0, 16))
    p.read(S, _acc(X, 12, 20))
    assert len(p.races()) == 1


def test_rows_and_views_on_sim():
    def run(reader):
        with sim_runtime(parse_policy("eager")) as rt:
            m = rt.module
            Fs, Ss = m.Stream(), m.Stream()
            rt.label(Fs, "forward")
            rt.label(Ss, "schedule")
            x = torch.zeros(4, 8, dtype=torch.int32, device=rt.device)
            m.synchronize()
            with m.stream(Fs):
                x[0].fill_(1)  # row 0 only
            with m.stream(Ss):
                reader(x).add_(2)
            m.synchronize()
            return detect(rt.trace)

    def kinds(races):
        return sorted(r.kind for r in races)

    assert run(lambda x: x[1]) == []  # distinct rows
    assert run(lambda x: x[2:4]) == []
    # add_ reads and writes what it overwrites: both conflicts with forward's fill
    assert kinds(run(lambda x: x[:, 3])) == ["RAW", "WAW"]  # a column view crosses row 0
    assert kinds(run(lambda x: x.view(-1)[4:12])) == ["RAW", "WAW"]  # a flat view into row 0
    assert kinds(run(lambda x: x.view(-1)[8:12])) == []  # ... or just past it


# --- classification ------------------------------------------------------------------------

@pytest.mark.parametrize("first,second,kind", [(True, False, "RAW"), (False, True, "WAR"),
                                               (True, True, "WAW")])
def test_classification(first, second, kind):
    p = Prog()
    p.op(F, "a", **({"writes": [_acc()]} if first else {"reads": [_acc()]}))
    p.op(S, "b", **({"writes": [_acc()]} if second else {"reads": [_acc()]}))
    races = p.races()
    assert len(races) == 1
    r = races[0]
    assert r.kind == kind
    assert (r.first.actor, r.first.op, r.first.write) == ("forward", "a", first)
    assert (r.second.actor, r.second.op, r.second.write) == ("schedule", "b", second)


def test_read_read_is_not_a_race():
    p = Prog()
    p.read(F, _acc())
    p.read(S, _acc())
    p.host(_acc())
    assert p.races() == []


# --- shadow-state pruning must not lose races -----------------------------------------------

def test_write_survives_an_ordered_read():
    p = Prog()
    w = p.write(F, _acc(), name="w")
    p.wait(S, w)
    p.read(S, _acc())  # ordered after w, covers it
    p.read(T, _acc(), name="late")  # NOT ordered after w
    races = p.races()
    assert [(r.first.op, r.second.op) for r in races] == [("w", "late")]


def test_unordered_reads_all_survive():
    p = Prog()
    p.read(S, _acc(), name="r1")
    r2 = p.read(T, _acc(), name="r2")
    p.wait(F, r2)
    p.write(F, _acc(), name="w")  # waits for r2 only
    races = p.races()
    assert [(r.kind, r.first.op) for r in races] == [("WAR", "r1")]


# --- caching-allocator reuse -----------------------------------------------------------------
# X (home: forward) is read on schedule, freed, and its block handed to Y on forward.

def _reuse_prog(old_on=S, old_write=False, waits=None, new_on=F, new_write=True,
                sync=False, wait_new_on_old=False, new_range=(0, 16)):
    p = Prog()
    p.alloc(X, F)
    p.write(F, _acc(X), name="fill old")
    p.sync(p.write(F, _acc(Y + 1), name="setup"), label="device.synchronize")
    old = p.op(old_on, "old use", reads=[] if old_write else [_acc(X)],
               writes=[_acc(X)] if old_write else [])
    if sync:
        p.sync(old, label="stream.synchronize")
    p.free(X, F, waits=[old] if waits == "covering" else
           [(old[0], old[1] - 1)] if waits == "before" else ())
    p.alloc(Y, F, prev=X)
    if wait_new_on_old:
        p.wait(new_on, old)
    acc = (Y, *new_range)
    p.op(new_on, "new use", reads=[] if new_write else [acc], writes=[acc] if new_write else [])
    return p.races()


def test_reuse_without_record_stream_is_a_race_reported_at_the_reuse():
    races = _reuse_prog()
    assert len(races) == 1
    r = races[0]
    assert (r.kind, r.first.actor, r.first.op, r.second.actor, r.second.op) == (
        "WAR", "schedule", "old use", "forward", "new use")
    assert r.reuse is not None and r.reuse.block == 1
    assert (r.reuse.old.stream, r.reuse.new.stream) == ("forward", "forward")
    assert r.reuse.old.frame[2] == r.reuse.new.frame[2] == "alloc"  # both allocation sites
    assert r.reuse.old.frame != r.reuse.new.frame
    assert "across a reuse of block 1" in r.summary()
    assert r.to_json()["reuse"]["old"]["stream"] == "forward"


def test_reuse_kinds_follow_the_accesses():
    assert [r.kind for r in _reuse_prog(old_write=True)] == ["WAW"]
    assert [r.kind for r in _reuse_prog(old_write=True, new_write=False)] == ["RAW"]
    assert _reuse_prog(new_write=False) == []  # read after read: no conflict


def test_reuse_on_the_same_stream_is_clean():
    assert _reuse_prog(old_on=F) == []


def test_reuse_after_a_host_sync_is_clean():
    assert _reuse_prog(sync=True) == []


def test_new_owner_waiting_on_the_old_use_is_clean():
    assert _reuse_prog(wait_new_on_old=True) == []


def test_record_stream_waits_are_honoured_exactly():
    assert _reuse_prog(waits="covering") == []  # the allocator waited for the old read
    assert len(_reuse_prog(waits="before")) == 1  # a position before it covers nothing


def test_new_owner_used_off_its_home_stream_races_the_home_streams_old_use():
    """Stream order protects reuse only on the home stream itself."""
    races = _reuse_prog(old_on=F, new_on=T)
    assert [(r.kind, r.first.actor, r.second.actor) for r in races] == [("WAR", "forward",
                                                                          "third")]


def test_reuse_outside_the_old_owners_range_is_clean():
    assert _reuse_prog(new_range=(16, 32)) == []


def test_reuse_chains_name_the_owner_that_made_the_access():
    p = Prog()
    p.alloc(X, F)
    p.read(S, _acc(X), name="old read")
    p.free(X, F)
    p.alloc(Y, F, prev=X)  # Y never touches the block, and is freed in turn
    p.free(Y, F)
    p.alloc(Y + 5, F, prev=Y)
    p.write(F, _acc(Y + 5), name="third owner")
    races = p.races()
    assert len(races) == 1 and races[0].reuse.old.frame == p.trace.log[0].frame


def test_plain_races_carry_no_reuse():
    p = Prog()
    p.write(F, _acc())
    p.read(S, _acc())
    assert [r.reuse for r in p.races()] == [None]


def _sim_reuse(policy: str, record: bool, same_stream: bool = False):
    with sim_runtime(parse_policy(policy)) as rt:
        m = rt.module
        Ss, Fs = m.Stream(), m.Stream()
        rt.label(Ss, "schedule")
        rt.label(Fs, "forward")
        with m.stream(Fs):
            x = torch.ones(4, dtype=torch.int32, device=rt.device)
        m.synchronize()
        with m.stream(Fs if same_stream else Ss):
            y = x * 10
            if record:
                x.record_stream(Ss)
        del x
        with m.stream(Fs):
            z = torch.full((4,), 7, dtype=torch.int32, device=rt.device)
        m.synchronize()
        del y, z
    return detect(rt.trace)


@pytest.mark.parametrize("policy", ["eager", "lazy", "stall(schedule)", "random(2)"])
def test_reuse_rule_on_the_simulators_records(policy):
    """The same rule fed by the allocator's own records, under every kind of schedule."""
    races = _sim_reuse(policy, record=False)
    assert [(r.kind, r.first.actor, r.second.actor, r.reuse is not None) for r in races] == [
        ("WAR", "schedule", "forward", True)]
    assert _sim_reuse(policy, record=True) == []
    assert _sim_reuse(policy, record=False, same_stream=True) == []


# --- dedupe --------------------------------------------------------------------------------

def test_races_deduplicated_by_site_and_counted():
    p = Prog()
    for _ in range(5):
        # the same two sites every iteration (frames are per site, not per record)
        p.trace.add(_rec(p, F, "w", writes=[_acc()], line=10))
        p.trace.add(_rec(p, S, "r", reads=[_acc()], line=20))
    p.trace.add(_rec(p, S, "r", reads=[_acc()], line=30))  # another site
    races = sorted(p.races(), key=lambda r: r.second.frame[1])
    # RAW w@10 -> r@20 every iteration; WAR r@20 -> the next iteration's w@10; RAW -> r@30
    assert [(r.kind, r.first.frame[1], r.second.frame[1], r.count) for r in races] == [
        ("WAR", 20, 10, 4), ("RAW", 10, 20, 5), ("RAW", 10, 30, 1)]
    assert "(x5)" in races[1].summary() and "(x" not in races[2].summary()


def _rec(p, stream, name, reads=(), writes=(), line=0):
    p.enq[stream] += 1
    rec = OpRecord(stream, name, list(reads), list(writes), ("prog.py", line, name))
    rec.seq = p.enq[stream]
    return rec


# --- schedule independence ------------------------------------------------------------------

@pytest.mark.parametrize("prog", [p for p in PROGRAMS if p.race], ids=lambda p: p.name)
def test_verdict_independent_of_schedule(prog):
    keys = set()
    for policy in ("eager", "lazy", f"stall({prog.stalled_stream})", "random(1)", "pct(2,3)"):
        with sim_runtime(parse_policy(policy)) as rt:
            prog.run(rt, False)
            keys.add(tuple(sorted((r.kind, r.first.actor, r.first.op, r.first.frame,
                                   r.second.actor, r.second.op, r.second.frame)
                                  for r in detect(rt.trace))))
    assert len(keys) == 1 and len(next(iter(keys))) == 1
