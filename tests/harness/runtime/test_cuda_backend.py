"""The CUDA backend: calibration, stalls, trace capture -- and the parts testable on a CPU.

Tests marked ``cuda`` run on a GPU only (the plugin skips them elsewhere). The others
exercise, without a GPU: backend resolution, the worker -> GPU mapping, the calibration
math, the watchdog, and the capture logic itself (the dispatch mode with CPU tensors
standing in for device memory, the stream/event wrappers on fake stream classes that
behave like ``torch.cuda.Stream`` / ``torch.cuda.Event``), fed to the real detector.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from harness.detect import detect
from specrace.pytest_plugin import _share_cores, gpu_for_worker, parse_nvidia_smi_list
from harness.runtime import BackendError, open_runtime, resolve_backend
from harness.runtime import cuda as C
from harness.runtime.cuda import calibration as CAL
from harness.runtime.trace import (WAIT_EVENT, AllocRecord, EventRecord, FreeRecord,
                                   HostAccess, OpKind, OpRecord, QueryRecord,
                                   RecordStreamRecord, SyncRecord, Trace)
import targets

ROOT = Path(__file__).resolve().parents[3]
HAS_CUDA = torch.cuda.is_available()


# =======================================================================================
# CPU-runnable
# =======================================================================================

@pytest.mark.skipif(HAS_CUDA, reason="this machine has a GPU")
def test_resolve_cuda_without_gpu_raises():
    with pytest.raises(BackendError):
        resolve_backend("cuda")
    with pytest.raises(BackendError):
        with open_runtime("cuda"):
            pass
    assert resolve_backend("auto") == "sim"


@pytest.mark.parametrize("worker,count,gpu", [
    ("gw0", 4, 0), ("gw1", 4, 1), ("gw5", 4, 1), ("gw7", 8, 7), ("gw3", 1, 0),
    ("gw2", 0, None), ("master", 4, None), ("", 4, None), ("gwx", 2, None), ("gw12", 5, 2),
])
def test_gpu_for_worker(worker, count, gpu):
    assert gpu_for_worker(worker, count) == gpu


@pytest.mark.parametrize("preset,expected", [(None, "1"), ("3", "3")])
def test_an_xdist_worker_takes_its_share_of_the_cores(monkeypatch, preset, expected):
    """Two workers on two cores: one intra-op thread each, for the worker's torch and the
    CLI processes it starts; a user's OMP_NUM_THREADS wins."""
    before = torch.get_num_threads()
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    if preset is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", preset)
    try:
        _share_cores()
        assert os.environ["OMP_NUM_THREADS"] == expected
        assert torch.get_num_threads() == int(expected)
    finally:
        torch.set_num_threads(before)


def test_nvidia_smi_parsing():
    two = ("GPU 0: NVIDIA H200 (UUID: GPU-aaaa)\n"
           "GPU 1: NVIDIA H200 (UUID: GPU-bbbb)\n")
    assert parse_nvidia_smi_list(two) == 2
    assert parse_nvidia_smi_list("") == 0
    mig = ("GPU 0: NVIDIA H200 (UUID: GPU-aaaa)\n"
           "  MIG 1g.18gb     Device  0: (UUID: MIG-cccc)\n")
    assert parse_nvidia_smi_list(mig) is None


def test_calibration_math():
    samples = [(1_000_000, 0.52), (2_000_000, 1.04), (1_000_000, 0.50), (2_000_000, 5.0)]
    rate = C.cycles_per_ms_from_samples(samples)
    # median of 1.923e6, 1.923e6, 2.0e6, 0.4e6 -> 1.923e6: one slow outlier does not move it
    assert rate == pytest.approx(1_000_000 / 0.52)
    assert C.cycles_per_ms_from_samples([(1e6, 0.0), (1e6, -1.0), (1e6, 0.5)]) == 2e6
    with pytest.raises(ValueError):
        C.cycles_per_ms_from_samples([(1e6, 0.0)])
    with pytest.raises(ValueError):
        C.cycles_per_ms_from_samples([])


def test_stall_cycles_caps_and_defaults():
    cpm = 2e6
    assert C.stall_cycles(1.0, cpm) == 2_000_000
    assert C.stall_cycles(None, cpm) == int(C.DEFAULT_STALL_MS * cpm)
    assert C.stall_cycles(10 * C.MAX_STALL_MS, cpm) == int(C.MAX_STALL_MS * cpm)
    assert C.stall_cycles(-5, cpm) == 0
    assert C.stall_cycles(0, cpm) == 0


def _run_py(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})


def test_watchdog_fires_and_stays_quiet():
    proc = _run_py("""
        import time
        from harness.runtime.cuda import watchdog
        with watchdog(30, "quick block"):
            pass
        with watchdog(None):
            pass
        print("passed-quiet", flush=True)
        with watchdog(0.3, "hung block"):
            time.sleep(30)
        print("not reached")
    """)
    assert proc.returncode == 3, proc.stderr
    assert "passed-quiet" in proc.stdout
    assert "not reached" not in proc.stdout
    assert "hung block" in proc.stderr and "watchdog" in proc.stderr


# --- the capture logic on CPU stand-ins -------------------------------------------------

class FakeEvent:
    """Behaves like torch.cuda.Event as far as the wrappers can tell."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.recorded = False

    def record(self, stream=None):
        self.recorded = True

    def wait(self, stream=None):
        pass

    def query(self):
        return True

    def synchronize(self):
        pass


class FakeStream:
    """Like torch.cuda.Stream: wait_event -> event.wait, wait_stream -> record + wait."""
    made = 100  # handles of streams made without one (torch.Stream(), as vLLM makes)

    def __init__(self, handle=None, priority=0):
        if handle is None:
            FakeStream.made += 1
            handle = FakeStream.made
        self.cuda_stream = handle

    def wait_event(self, event):
        event.wait(self)

    def wait_stream(self, stream):
        self.wait_event(stream.record_event())

    def record_event(self, event=None):
        event = event or FakeEvent()
        event.record(self)
        return event

    def query(self):
        return True

    def synchronize(self):
        pass


class FakeGraph:
    """Like torch.cuda.CUDAGraph as far as the wrappers can tell (capture is the caller's
    business: on CPU stand-ins the kernels simply run)."""

    def capture_begin(self, pool=None, capture_error_mode="global"):
        pass

    def capture_end(self):
        pass

    def replay(self):
        pass

    def reset(self):
        pass


class FakeDevice:
    """A current-stream slot, like the CUDA current stream, plus a fake device module."""

    def __init__(self):
        self.current = 0
        self.module = types.SimpleNamespace(synchronize=lambda device=None: None)

    @contextlib.contextmanager
    def on(self, stream):
        prev, self.current = self.current, stream.cuda_stream
        try:
            yield
        finally:
            self.current = prev


@contextlib.contextmanager
def cpu_capture():
    """The CUDA capture with CPU tensors as device memory and fake streams/events."""
    fake = FakeDevice()
    cap = C.Capture(Trace(), lambda: fake.current, default_handle=0, dev_type="cpu")
    C.ensure_api_wrapped(FakeStream, FakeEvent, fake.module, FakeGraph)
    with C.capturing(cap), torch.no_grad(), C.CaptureMode(cap):
        yield cap, fake


def _ops(trace):
    return [r for r in trace.log if isinstance(r, OpRecord)]


def test_capture_records_reads_writes_and_skips_views():
    with cpu_capture() as (cap, fake):
        x = torch.zeros(8)  # factory: writes fresh memory
        v = x[2:4]  # view: metadata only
        v.add_(1)  # in-place: read + write of x's storage
        y = x * 2  # reads x, writes y
        e = torch.empty(3)  # allocation only: no op
        z = torch.zeros_like(x)  # uses x's metadata only
        del e
    ops = _ops(cap.trace)
    names = [o.name for o in ops]
    assert names == ["zeros.default", "add_.Tensor", "mul.Tensor", "zeros_like.default"]
    zeros, add, mul, zl = ops
    sx = zeros.writes[0][0]
    assert zeros.reads == [] and zeros.writes == [(sx, 0, 32)]
    assert add.reads == [(sx, 8, 16)] and add.writes == [(sx, 8, 16)]
    assert mul.reads == [(sx, 0, 32)] and len(mul.writes) == 1 and mul.writes[0][0] != sx
    assert zl.reads == [] and len(zl.writes) == 1
    assert [o.seq for o in ops] == [1, 2, 3, 4] and all(o.stream == 0 for o in ops)
    assert all(o.frame is not None and o.frame[0] == __file__ for o in ops)
    assert y.shape == z.shape == (8,)


def test_capture_implicit_syncs():
    with cpu_capture() as (cap, fake):
        x = torch.arange(6.0)
        x.nonzero()
        x[x > 2]  # boolean mask: data-dependent shape
        x[torch.tensor([0, 1])]  # integer index: no sync
        x.sum().item()
    log = [r for r in cap.trace.log if isinstance(r, (OpRecord, SyncRecord))]
    kinds = [(type(r).__name__, getattr(r, "name", getattr(r, "label", ""))) for r in log]
    syncs = [r for r in log if isinstance(r, SyncRecord)]
    assert [s.label for s in syncs] == ["implicit sync: nonzero.default",
                                       "implicit sync: index.Tensor",
                                       "blocking D2H (.item)"], kinds
    for s in syncs:  # each sync covers the op just before it
        before = log[log.index(s) - 1]
        assert s.waits == [(0, before.seq)]


def test_capture_new_sid_after_free():
    with cpu_capture() as (cap, fake):
        a = torch.full((1024,), 1.0)
        sid_a = _ops(cap.trace)[-1].writes[0][0]
        del a
        b = torch.full((1024,), 2.0)
        sid_b = _ops(cap.trace)[-1].writes[0][0]
    assert sid_a != sid_b
    del b


def test_capture_holds_no_storage():
    """The caching allocator must be free to reuse blocks mid-run, as it does untraced."""
    import weakref
    with cpu_capture() as (cap, fake):
        x = torch.full((256,), 1.0)
        y = x * 2
        w = weakref.ref(x)
        del x
        assert w() is None
    allocs = [r for r in cap.trace.log if isinstance(r, AllocRecord)]
    assert len(allocs) == 2 and allocs[1].sid == _ops(cap.trace)[1].writes[0][0]
    del y


def _reuse_on_capture(record: bool, via_dispatch: bool = False):
    """x made on forward, read on schedule, freed; a new storage starts at x's address on
    forward (two tensors over one bytearray stand for the block the allocator hands back:
    which address the CPU allocator returns is not ours to decide)."""
    block = bytearray(64)
    with cpu_capture() as (cap, fake):
        fwd, sch = FakeStream(11), FakeStream(22)
        cap.stream_id(11, "forward")
        cap.stream_id(22, "schedule")
        with fake.on(fwd):
            x = torch.frombuffer(block, dtype=torch.int32)
            cap.allocated(x, ("prog.py", 1, "make x"))
            x.fill_(1)
        fake.module.synchronize()
        with fake.on(sch):
            y = x * 10
            if record and via_dispatch:
                C.CudaBackend(cap, None).record_stream(types.SimpleNamespace(func=lambda *a: None),
                                                       (x, sch), {})
            elif record:
                cap.record_stream(x, sch, ("prog.py", 2, "record"))
        del x
        with fake.on(fwd):
            z = torch.frombuffer(block, dtype=torch.int32)
            cap.allocated(z, ("prog.py", 3, "make z"))
            z.fill_(7)
    del y, z
    return cap, detect(cap.trace)


def test_capture_sees_a_reuse_and_the_detector_reports_it():
    cap, races = _reuse_on_capture(record=False)
    assert [(r.kind, r.first.actor, r.second.actor) for r in races] == [
        ("WAR", "schedule", "forward")]
    reuse = races[0].reuse
    assert (reuse.old.stream, reuse.new.stream) == ("forward", "forward")
    assert reuse.old.frame[2] == "make x" and reuse.new.frame[2] == "make z"
    frees = [r for r in cap.trace.log if isinstance(r, FreeRecord)]
    assert len(frees) == 1 and frees[0].frame is None  # inferred at the reuse


@pytest.mark.parametrize("via_dispatch", [False, True])
def test_capture_honours_record_stream(via_dispatch):
    cap, races = _reuse_on_capture(record=True, via_dispatch=via_dispatch)
    assert races == []
    free = next(r for r in cap.trace.log if isinstance(r, FreeRecord))
    sch = cap.stream_id(22)
    assert free.waits == [(sch, 1)]  # schedule's position at x's last use (the multiply)
    assert any(isinstance(r, RecordStreamRecord) for r in cap.trace.log)


def test_capture_record_stream_tracks_later_uses():
    """record_stream before the use (upstream's habit): the free waits for the use too."""
    block = bytearray(64)
    with cpu_capture() as (cap, fake):
        fwd, sch = FakeStream(11), FakeStream(22)
        with fake.on(fwd):
            x = torch.frombuffer(block, dtype=torch.int32)
            cap.allocated(x, None)
        fake.module.synchronize()
        cap.record_stream(x, sch, None)
        with fake.on(sch):
            y = x + 1
            y2 = x + 2
        del x
        with fake.on(fwd):
            z = torch.frombuffer(block, dtype=torch.int32)
            cap.allocated(z, None)
            z.fill_(0)
    free = next(r for r in cap.trace.log if isinstance(r, FreeRecord))
    assert free.waits == [(cap.stream_id(22), 2)]
    assert detect(cap.trace) == []
    del y, y2, z


def _seed_program(coarse: bool):
    with cpu_capture() as (cap, fake):
        fwd, sch = FakeStream(11), FakeStream(22)
        default = FakeStream(0)
        C_label = cap.stream_id
        C_label(11, "forward")
        C_label(22, "schedule")
        accept = torch.zeros(8)  # default stream
        fwd.wait_stream(default)
        sch.wait_stream(default)
        early = FakeEvent()
        with fake.on(fwd):
            early.record()  # the fine fence: recorded BEFORE the write
            accept.fill_(3.0)  # forward writes accept_lens
        with fake.on(sch):
            if coarse:
                sch.wait_stream(fwd)
            else:
                sch.wait_event(early)
            got = accept[1:3].clone()  # schedule gathers
    return cap, got


def test_seed_race_detected_through_wrappers():
    cap, _ = _seed_program(coarse=False)
    races = detect(cap.trace)
    raw = [r for r in races if r.kind == "RAW"]
    assert raw, [r.summary() for r in races]
    r = raw[0]
    assert (r.first.actor, r.first.op, r.first.write) == ("forward", "fill_.Scalar", True)
    assert (r.second.actor, r.second.op, r.second.write) == ("schedule", "clone.default", False)
    assert r.first.frame[0] == __file__ and r.second.frame[0] == __file__


def test_wait_stream_orders_and_logs_one_wait():
    cap, _ = _seed_program(coarse=True)
    assert detect(cap.trace) == []
    waits = [o for o in _ops(cap.trace) if o.kind == OpKind.WAIT]
    # fwd.wait_stream(default), sch.wait_stream(default), sch.wait_stream(fwd): one each,
    # despite wait_stream calling record_event + wait_event + Event.wait internally.
    assert len(waits) == 3
    assert [w.name for w in waits] == [WAIT_EVENT] * 3
    sch = cap.stream_id(22)
    fwd = cap.stream_id(11)
    last = waits[-1]
    assert last.stream == sch and last.wait_for == (fwd, cap.seqs[fwd])
    events = [r for r in cap.trace.log if isinstance(r, EventRecord)]
    assert len(events) == 4  # three wait_stream markers and the early event


def test_event_wait_is_a_stream_op_and_point_in_time():
    with cpu_capture() as (cap, fake):
        s = FakeStream(5)
        x = torch.zeros(4)
        ev = FakeEvent()
        ev.record()  # on the default stream, after the zeros
        ev.wait(s)
        with fake.on(s):
            y = x + 1
        never = FakeEvent()
        never.wait(s)  # never recorded: CUDA makes it a no-op; nothing logged
    sid = cap.stream_id(5)
    ops = [o for o in _ops(cap.trace) if o.stream == sid]
    assert [(o.kind, o.seq) for o in ops] == [(OpKind.WAIT, 1), (OpKind.KERNEL, 2)]
    assert ops[0].wait_for == (0, 1)
    assert detect(cap.trace) == []
    del y


def test_syncs_and_queries_are_logged():
    with cpu_capture() as (cap, fake):
        s = FakeStream(7)
        with fake.on(s):
            x = torch.ones(4)
            ev = FakeEvent()
            ev.record()
        assert ev.query() is True
        ev.synchronize()
        assert s.query() is True
        s.synchronize()
        fake.module.synchronize()
    sid = cap.stream_id(7)
    recs = [r for r in cap.trace.log if isinstance(r, (SyncRecord, QueryRecord))]
    assert [(type(r).__name__, r.label) for r in recs] == [
        ("QueryRecord", "event.query"), ("SyncRecord", "event.synchronize"),
        ("QueryRecord", "stream.query"), ("SyncRecord", "stream.synchronize"),
        ("SyncRecord", "device.synchronize")]
    assert recs[0].position == (sid, 1) and recs[1].waits == [(sid, 1)]
    assert sorted(recs[-1].waits) == [(0, 0), (sid, 1)]
    del x


def test_api_wrapped_once_and_silent_outside_a_capture():
    with cpu_capture():
        first = FakeEvent.record
    with cpu_capture() as (cap, fake):
        assert FakeEvent.record is first  # not wrapped twice
        ev = FakeEvent()
        ev.record()
    assert len(cap.trace.log) == 1
    ev.record()  # no capture active: a plain call, nothing logged anywhere
    ev.synchronize()
    assert len(cap.trace.log) == 1 and ev.recorded


def test_event_from_an_earlier_capture_is_not_trusted():
    with cpu_capture():
        ev = FakeEvent()
        ev.record()
    with cpu_capture() as (cap, fake):
        fwd = FakeStream(5)
        fwd.wait_event(ev)  # recorded in another run: a no-op wait, as never recorded
        ev.synchronize()
    assert not [r for r in cap.trace.log if isinstance(r, (OpRecord, SyncRecord))]


def test_host_read_of_pinned_buffer_is_recorded():
    """The hostmem path (pinned registry) is backend-neutral: check the CUDA recorder."""
    from seams import context
    from harness.runtime import hostmem
    trace = Trace()
    cap = C.Capture(trace, lambda: 0, dev_type="cuda")
    with context.opened(recorder=cap.note_host_access):
        buf = hostmem.register(torch.zeros(4), "pinned float32[4] test")
        buf.tolist()
        with C.CaptureMode(cap):
            buf[1].item()  # a view (no access) then a host read through dispatch
            buf.fill_(1)  # host write
    accs = [r for r in trace.log if isinstance(r, HostAccess)]
    assert [(a.write, a.access[1:]) for a in accs] == [(False, (0, 16)), (False, (4, 8)),
                                                       (True, (0, 16))]


@pytest.fixture
def fake_cuda(monkeypatch):
    """Enough of torch.cuda faked for ``cuda_runtime`` to run its whole lifecycle on a CPU
    (CPU tensors stand for device memory; streams and events are the fakes above)."""
    # what a run imports at its first device-name swap, imported before the fake: torch's
    # dynamo binds _cuda_getCurrentRawStream at import, and an import that fails under the
    # fake leaves torch._dynamo half-initialised for every later test of the worker (on a
    # GPU machine, where nothing imported it earlier: 6 tests broke after this one)
    from harness.runtime import device_names
    for module in device_names._BIND_AT_IMPORT:
        importlib.import_module(module)
    state = types.SimpleNamespace(current=0, sleeps=[])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "default_stream",
                        lambda device=None: types.SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: types.SimpleNamespace(cuda_stream=state.current))
    monkeypatch.delattr(torch._C, "_cuda_getCurrentRawStream", raising=False)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: state.sleeps.append(cycles))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(CAL, "_CYCLES_PER_MS", 2e6)
    monkeypatch.setattr(C.CudaRuntime, "_dev_type", "cpu")

    @contextlib.contextmanager
    def on(stream):
        prev, state.current = state.current, stream.cuda_stream
        try:
            yield
        finally:
            state.current = prev

    state.on = on
    return state


def test_runtime_lifecycle_on_fake_cuda(fake_cuda):
    from seams import context
    with C.cuda_runtime() as rt:
        assert rt.backend == "cuda" and rt.cycles_per_ms == 2e6
        fwd = FakeStream(3)
        rt.label(fwd, "forward")
        x = torch.zeros(4)
        torch.cuda.synchronize()
        with fake_cuda.on(fwd):
            rt.stall(2)
            x.add_(1)
            ev = torch.cuda.Event()
            ev.record()
        with C.cuda_runtime() as inner:  # nested: the outer capture pauses
            y = torch.ones(2)
            inner.stall(None)
            ev.synchronize()
        with C.cuda_runtime(trace=False) as plain:
            torch.ones(3)
            plain.stall(1)
        assert context.current().recorder == rt._cap.note_host_access
        ev.wait()
        z = x + 1
    assert [(o.name, o.stream, o.seq) for o in rt.trace.ops()] == [
        ("zeros.default", 0, 1), ("stall", 1, 1), ("add_.Tensor", 1, 2),
        (WAIT_EVENT, 0, 2), ("add.Tensor", 0, 3)]
    assert rt.trace.stream_names == {0: "default", 1: "forward"}
    assert [o.name for o in inner.trace.ops()] == ["ones.default", "stall"]
    assert inner.trace.ops()[1].duration == C.DEFAULT_STALL_MS * 1000.0
    assert plain.trace.log == []
    assert fake_cuda.sleeps == [4_000_000, int(C.DEFAULT_STALL_MS * 2e6), 2_000_000]
    syncs = [r for r in rt.trace.log if isinstance(r, SyncRecord)]
    assert [s.label for s in syncs] == ["device.synchronize"]  # not the inner's
    assert detect(rt.trace) == []
    # everything is put back: the API wrappers stay (installed once) but log nothing
    n = len(rt.trace.log)
    ev.record()
    ev.synchronize()
    torch.cuda.synchronize()
    assert len(rt.trace.log) == n
    assert getattr(FakeEvent.record, "_specrace_wrapper", False)
    assert context.current().recorder is None
    assert torch._C._only_lift_cpu_tensors() is False
    assert context.current().cuda_capture is None
    del y, z


def test_device_generic_events_and_streams_are_traced_in_a_cuda_run(fake_cuda):
    """vLLM makes ``torch.Event()`` / ``torch.Stream()``: inside a traced CUDA run they are
    torch.cuda's classes, whose API the capture wraps (``torch.Event`` is an immutable C
    type: its own synchronize could never be logged, and every host access after one
    looked unordered -- the H100 run of vLLM's fixed code reported 339 false race sites).
    Outside the run the names are torch's again."""
    generic = (torch.Event, torch.Stream)
    with C.cuda_runtime() as rt:
        side = torch.Stream()
        assert isinstance(side, FakeStream)
        with fake_cuda.on(side):
            x = torch.zeros(4)
            done = torch.Event(blocking=True)
            assert isinstance(done, FakeEvent)
            done.record()
        done.synchronize()
        assert x.sum().item() == 0  # the host read after the event's sync: ordered
    assert (torch.Event, torch.Stream) == generic
    syncs = [r for r in rt.trace.log if isinstance(r, SyncRecord)]
    assert [r.label for r in syncs] == ["event.synchronize", "blocking D2H (.item)"]
    assert syncs[0].waits == [(rt._cap.stream_id(side.cuda_stream), 1)]
    assert detect(rt.trace) == []


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
def test_a_cuda_uva_view_is_the_pinned_memory_and_the_captures_storage_for_it():
    """On a GPU the UVA view is the pinned buffer at the same address (zero-copy): a host
    write is what a later kernel reads, and the capture knows the view's storage as the
    pinned buffer's (so its kernels are ordered against the host's accesses)."""
    from harness.runtime import hostmem

    with C.cuda_runtime() as rt:
        host = torch.zeros(4, dtype=torch.int32, pin_memory=True)
        uva = rt.uva_view(host)
        assert uva.is_cuda and uva.data_ptr() == host.data_ptr()
        host.numpy()[:] = [1, 2, 3, 4]
        assert (uva * 10).tolist() == [10, 20, 30, 40]
        assert rt._cap.storage_id(uva)[0] == hostmem.lookup(host)[0]


def test_capture_numbers_storages_per_run(fake_cuda):
    """The same run twice in one process gives the same trace (storage ids per run)."""
    traces = []
    for _ in range(2):
        with C.cuda_runtime() as rt:
            x = torch.zeros(4)
            y = x + 1
        traces.append([(o.name, o.reads, o.writes) for o in rt.trace.ops()])
        del x, y
    assert traces[0] == traces[1]
    assert traces[0][0][2][0][0] == 1  # the first storage of a run is storage 1


@pytest.mark.parametrize("value", ["1e12", "nan", "inf", "-2e6", "0", "fast", "1e3"])
def test_cycles_per_ms_from_the_environment_is_validated(monkeypatch, value):
    from harness.runtime import limits
    monkeypatch.setattr(CAL, "_CYCLES_PER_MS", None)
    monkeypatch.setenv("SPECRACE_CYCLES_PER_MS", value)
    with pytest.raises(limits.LimitError) as info:
        C.calibrate()
    msg = str(info.value)
    assert "SPECRACE_CYCLES_PER_MS" in msg and "\n" not in msg
    assert CAL._CYCLES_PER_MS is None


def test_cycles_per_ms_from_the_environment_skips_calibration(monkeypatch):
    monkeypatch.setattr(CAL, "_CYCLES_PER_MS", None)
    monkeypatch.setenv("SPECRACE_CYCLES_PER_MS", "1.98e6")
    assert C.calibrate() == 1.98e6


@pytest.mark.parametrize("measured", [1e12, 10.0])
def test_a_measured_rate_off_a_gpu_clock_is_an_error_not_an_endless_stall(monkeypatch, measured):
    """A calibration that measures far off the clock (timed under interference, a timer
    glitch) would make every capped stall minutes long: it is refused, named, and nothing
    is cached. Fails on the old calibrate, which kept any measurement."""
    from harness.runtime.limits import LimitError
    monkeypatch.setattr(CAL, "_CYCLES_PER_MS", None)
    monkeypatch.delenv("SPECRACE_CYCLES_PER_MS", raising=False)
    monkeypatch.setattr(CAL, "_measure_cycles_per_ms", lambda: measured)
    with pytest.raises(LimitError, match="SPECRACE_CYCLES_PER_MS"):
        C.calibrate()
    assert CAL._CYCLES_PER_MS is None


def test_a_load_calibrates_before_its_copies_start(monkeypatch):
    """The stall calibration never shares the GPU with a run's background load: cuda_load
    calibrates, then resumes its workers."""
    from harness.runtime.cuda import load as L
    from harness.runtime.load import LOADS
    order = []

    class Worker:
        def resume(self):
            order.append("resume")

        def pause(self):
            order.append("pause")

    monkeypatch.setattr(L, "calibrate", lambda: order.append("calibrate"))
    monkeypatch.setattr(L, "_worker", lambda kind: Worker())
    with L.cuda_load(LOADS["bulk-d2h"]):
        pass
    assert order == ["calibrate", "resume", "pause"]


def test_gpu_watchdog_is_armed_for_cuda_with_a_limit_from_the_work(monkeypatch):
    from harness.runtime import limits
    from harness.runtime import watchdog as W
    armed = []

    @contextlib.contextmanager
    def fake_watchdog(seconds, what="block"):
        armed.append((seconds, what))
        yield

    monkeypatch.setattr(W, "watchdog", fake_watchdog)
    monkeypatch.delenv(limits.WATCHDOG_ENV, raising=False)
    with limits.gpu_watchdog("sim", 200, None, "sim run"):
        pass
    assert armed == []  # the simulator bounds its own work
    with limits.gpu_watchdog("cuda", 200, 1.0, "repro"):
        pass
    with limits.gpu_watchdog("cuda", 400, 1.0, "repro"):
        pass
    (small, _), (large, what) = armed
    assert what == "repro" and 0 < small < large < limits.MAX_WATCHDOG_S
    assert small == limits.WATCHDOG_SETUP_S + 200 * (limits.WATCHDOG_TRIAL_S
                                                     + limits.WATCHDOG_STALLS_PER_TRIAL * 1e-3)
    monkeypatch.setenv(limits.WATCHDOG_ENV, "42")
    assert limits.watchdog_seconds(10**6) == 42.0
    monkeypatch.setenv(limits.WATCHDOG_ENV, "0")
    assert limits.watchdog_seconds(10) is None
    for bad in ("soon", "nan", "-1", "1e99"):
        monkeypatch.setenv(limits.WATCHDOG_ENV, bad)
        with pytest.raises(limits.LimitError, match=limits.WATCHDOG_ENV):
            limits.watchdog_seconds(1)


# --- the pytest plugin ------------------------------------------------------------------

def test_plugin_marker_skip_and_report_section(tmp_path):
    (tmp_path / "test_demo.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.cuda
        def test_needs_gpu():
            pass

        def test_fails_with_report(specrace_report):
            specrace_report.attach("/tmp/specrace/run-1/report.json")
            assert False

        def test_backend(specrace_backend):
            assert specrace_backend in ("sim", "cuda")

        def test_runtime(specrace_runtime, specrace_backend):
            assert specrace_runtime.backend == specrace_backend

        def test_runner(scenario_runner):
            assert callable(scenario_runner)
    """))
    import os
    # The plugin goes in with -p alone: when the project is pip-installed its entry point
    # would register it a second time (pluggy refuses one module under two names).
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}  # (a GPU's wheels)
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "specrace.pytest_plugin", "-p",
         "no:cacheprovider", "-rs", "--specrace-backend", "auto", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    out = proc.stdout + proc.stderr
    assert "specrace report: /tmp/specrace/run-1/report.json" in out, out
    assert " error" not in out.lower(), out
    assert "1 failed" in out and "test_fails_with_report" in out, out
    if not HAS_CUDA:
        assert "cuda test: no CUDA GPU is available" in out, out


# =======================================================================================
# GPU only
# =======================================================================================

cuda = pytest.mark.cuda


@pytest.fixture
def rt():
    with C.watchdog(120, "cuda backend test"), open_runtime("cuda") as runtime:
        yield runtime


@cuda
def test_calibration_and_stall_holds_the_stream():
    with C.watchdog(120, "calibration test"), open_runtime("cuda", trace=False) as rt:
        assert rt.backend == "cuda" and rt.device.type == "cuda"
        assert rt.module is torch.cuda
        assert rt.cycles_per_ms > 0
        rt.stall(1)  # warm
        torch.cuda.synchronize()
        # Behaviour, not timing: a stall holds the stream it was issued on (a 50 ms spin is
        # still running when the host asks right after the launch) until it is waited for.
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            rt.stall(50)
        assert not side.query()
        side.synchronize()
        assert side.query()
        assert rt.trace.log == []  # trace=False records nothing


def _two_streams(rt):
    fwd, sch = torch.cuda.Stream(), torch.cuda.Stream()
    rt.label(fwd, "forward")
    rt.label(sch, "schedule")
    return fwd, sch


def _seed_on_gpu(rt, coarse: bool):
    fwd, sch = _two_streams(rt)
    accept_lens = torch.zeros(8, dtype=torch.int32, device=rt.device)
    pool_idx = torch.tensor([1, 4, 6], dtype=torch.int64, device=rt.device)
    verified = torch.tensor([3, 2, 4], dtype=torch.int32, device=rt.device)
    torch.cuda.synchronize()
    with torch.cuda.stream(fwd):
        shared_read_done = torch.cuda.Event()
        shared_read_done.record()  # recorded BEFORE the write: the fine fence
        rt.stall(5)
        accept_lens[pool_idx] = verified  # forward writes
    with torch.cuda.stream(sch):
        if coarse:
            sch.wait_stream(fwd)
        else:
            sch.wait_event(shared_read_done)
        got = accept_lens[pool_idx].tolist()  # schedule reads
    torch.cuda.synchronize()
    return got


@cuda
def test_gpu_seed_race_reported(rt):
    _seed_on_gpu(rt, coarse=False)
    races = detect(rt.trace)
    raw = [r for r in races if r.kind == "RAW" and r.first.actor == "forward"
           and r.second.actor == "schedule"]
    assert raw, [r.summary() for r in races]
    assert raw[0].first.write and not raw[0].second.write
    assert raw[0].first.frame is not None and raw[0].first.frame[0] == __file__


@cuda
def test_gpu_seed_with_wait_stream_is_clean(rt):
    got = _seed_on_gpu(rt, coarse=True)
    assert got == [3, 2, 4]
    assert detect(rt.trace) == [], [r.summary() for r in detect(rt.trace)]
    waits = [o for o in rt.trace.ops() if o.kind == OpKind.WAIT]
    assert len(waits) == 1  # wait_stream logs exactly one wait


def _d2h_on_gpu(rt, how: str, staging: str):
    fwd, _ = _two_streams(rt)
    x = torch.arange(1, 5, dtype=torch.int32, device=rt.device)
    host = torch.zeros(4, dtype=torch.int32, pin_memory=True) if staging == "copy_" else None
    torch.cuda.synchronize()
    with torch.cuda.stream(fwd):
        rt.stall(5)
        y = x * 10
        if staging == "copy_":
            host.copy_(y, non_blocking=True)
        else:
            host = y.to("cpu", non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
    if how == "event.synchronize":
        copied.synchronize()
    elif how == "query":
        while not copied.query():
            pass
    got = host.tolist()
    torch.cuda.synchronize()
    return got


@cuda
@pytest.mark.parametrize("staging", ["copy_", "to"])
def test_gpu_pinned_read_before_sync_is_a_race(rt, staging):
    _d2h_on_gpu(rt, "none", staging)
    races = detect(rt.trace)
    host = [r for r in races if r.second.actor == "host" and r.first.actor == "forward"]
    assert host and host[0].kind == "RAW", [r.summary() for r in races]


@cuda
@pytest.mark.parametrize("staging", ["copy_", "to"])
@pytest.mark.parametrize("how", ["event.synchronize", "query"])
def test_gpu_pinned_read_after_sync_is_clean(rt, how, staging):
    got = _d2h_on_gpu(rt, how, staging)
    assert got == [10, 20, 30, 40]
    assert detect(rt.trace) == [], [r.summary() for r in detect(rt.trace)]


def _reuse_on_gpu(rt, record: bool):
    fwd, sch = _two_streams(rt)
    torch.cuda.empty_cache()  # so the block x frees is the one forward's next allocation gets
    with torch.cuda.stream(fwd):
        x = torch.full((4,), 1, dtype=torch.int32, device=rt.device)
    torch.cuda.synchronize()
    with torch.cuda.stream(sch):
        rt.stall(5)
        y = x * 10
        if record:
            x.record_stream(sch)
    del x
    with torch.cuda.stream(fwd):
        z = torch.full((4,), 7, dtype=torch.int32, device=rt.device)
    torch.cuda.synchronize()
    return y.tolist(), z


@cuda
@pytest.mark.parametrize("record", [False, True])
def test_gpu_reuse_seen_by_the_capture(rt, record):
    got, z = _reuse_on_gpu(rt, record)
    races = detect(rt.trace)
    reused = [r for r in rt.trace.log if isinstance(r, AllocRecord) and r.prev is not None]
    if record:  # the allocator kept the block until schedule had run
        assert got == [10, 10, 10, 10] and races == [], [r.summary() for r in races]
    else:
        assert reused, "the capture did not see forward's next allocation reuse x's block"
        assert got == [70, 70, 70, 70]  # the stalled read saw the new owner's data
        assert [(r.kind, r.first.actor, r.second.actor, r.reuse is not None)
                for r in races] == [("WAR", "schedule", "forward", True)]
    del z


@cuda
def test_gpu_trace_shape(rt):
    """Streams are labelled, waits/stalls count as stream ops, blocking reads sync."""
    fwd, sch = _two_streams(rt)
    x = torch.ones(4, device=rt.device)
    torch.cuda.synchronize()
    with torch.cuda.stream(fwd):
        rt.stall(1)
        x.add_(1)
    sch.wait_stream(fwd)
    with torch.cuda.stream(sch):
        v = x.sum().item()
    assert v == 8.0
    f, s = rt.stream_id(fwd), rt.stream_id(sch)
    assert rt.trace.stream_names[f] == "forward" and rt.trace.stream_names[s] == "schedule"
    assert rt.trace.stream_names[0] == "default"
    fops = [(o.kind, o.seq) for o in rt.trace.ops() if o.stream == f]
    assert fops == [("stall", 1), ("kernel", 2)]
    sops = [o for o in rt.trace.ops() if o.stream == s]
    assert [o.kind for o in sops] == [OpKind.WAIT, OpKind.KERNEL, OpKind.COPY]
    assert sops[0].wait_for == (f, 2)
    syncs = [r for r in rt.trace.log if isinstance(r, SyncRecord)]
    assert syncs[-1].waits == [(s, 3)]
    assert detect(rt.trace) == []


@cuda
def test_gpu_api_wrapped_once_and_silent_outside_a_runtime():
    with open_runtime("cuda") as rt:
        wrapped = torch.cuda.Event.record
        assert getattr(wrapped, "_specrace_wrapper", False)
    n = len(rt.trace.log)
    ev = torch.cuda.Event()
    ev.record()
    ev.synchronize()
    torch.cuda.synchronize()
    assert len(rt.trace.log) == n
    with open_runtime("cuda"):
        assert torch.cuda.Event.record is wrapped  # not wrapped twice


@cuda
def test_gpu_traced_engine_runs_back_to_back_in_one_process():
    """The second traced engine run in a process used to segfault CPython on the H200
    (per-run class patching of the stream/event API): three traced trials of the seed race,
    each reported, in this one process."""
    from harness.trials.drive import server_args
    from harness.trials.trial import run_trial
    from scenarios.registry import get
    sc = get("ngram-filter-race")
    for seed in range(3):
        wl = sc.workload(seed)
        args = server_args(wl, {"relay": "spec_info", "war_barrier": "fine"}, targets.get("impl"))
        res = run_trial("cuda", None, wl, args, sc.stalls(None), detect_races=True, target=targets.get("impl"))
        assert res.races, seed  # happens-before on every trial, schedule-independent


@pytest.mark.cuda_isolated
def test_gpu_out_of_range_token_is_a_sticky_device_error():
    """The toy model's embedding gather fails on an out-of-range id as the real one does:
    a device-side assert, surfacing at the next sync and poisoning the process (so this
    test runs in a process of its own)."""
    from toys.model import ToyTargetModel
    model = ToyTargetModel(torch.device("cuda"))
    bad = torch.tensor([model.vocab_size + 10**6], device="cuda")
    with pytest.raises(Exception, match="device-side assert|CUDA error"):
        model.forward(bad).cpu()
    with pytest.raises(Exception):  # sticky: the process cannot run CUDA work any more
        torch.ones(1, device="cuda").cpu()


def test_another_threads_stream_and_event_calls_are_not_the_programs():
    """A background load issues its own copies and events from a thread of its own: the
    wrappers log only the run's thread (the dispatch mode is per thread already)."""
    import threading
    with cpu_capture() as (cap, fake):
        mine = FakeEvent()
        mine.record()
        other = FakeEvent()
        worker = threading.Thread(target=other.record)
        worker.start()
        worker.join()
        assert other.recorded  # the call itself went through
    events = [r for r in cap.trace.log if isinstance(r, EventRecord)]
    assert len(events) == 1
