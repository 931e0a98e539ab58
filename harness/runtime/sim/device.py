"""The simulated asynchronous device: FIFO streams, events, host syncs, a virtual clock.

Semantics (CUDA's stream semantics, as the CUDA programming guide states them):

1. A stream is a FIFO. Its head may execute once every event it waits on has completed
   (a wait is itself a queued marker op) and, for a timed stall, once the host clock has
   passed its end.
2. Enqueueing never blocks the host; *when* runnable heads execute is the policy's choice,
   asked at each scheduling point and recorded (``Arbiter``, ``runtime/policy.py``).
3. A host sync waits for the positions it names only, plus what they transitively wait on:
   ``drain`` executes exactly those ops and nothing else, which is how stale data reaches
   the host under a lazy or stalled schedule.
4. A device-side error (an out-of-range gather) is sticky and surfaces at the next sync,
   as CUDA's asynchronous errors do.
5. Streams and events belong to the session (device) they were made in; using one in
   another session is an error, not a silent wait on a position of some other run. A host
   sync that can never return (a wait cycle) raises ``SimDeadlock``; it never recurses.
6. Device memory comes from a caching allocator with PyTorch's per-stream reuse
   (``allocator.py``): a block freed on the host goes to the next allocation on its stream.

Everything is single-threaded and deterministic; the order of execution is a function of
the program and the policy (and its seed) alone.
"""
from __future__ import annotations

import itertools
from typing import Any, List, Optional

from harness.runtime.policy import Policy, RunAll
from harness.runtime.sim.allocator import SimAllocator
from harness.runtime.sim.arbiter import Arbiter
from harness.runtime.trace import (Frame, HostAccess, OpKind, OpRecord, Position, QueryRecord,
                                   SyncRecord, Trace, short_path, user_frame)
from harness.runtime.sim.errors import SimDeadlock, SimDeviceError, check_session  # noqa: F401 (re-exported)
from harness.runtime.load import NONE
from harness.runtime.sim import load
from harness.runtime.sim.streams import Stream

import torch

_NoDispatch = torch._C._DisableTorchDispatch
_NoSubclassFunction = torch._C.DisableTorchFunctionSubclass

HOST_STEP_US = 1.0  # virtual host time per device API call
FOREVER = float("inf")
# Module globals, not ``OpKind.WAIT``: an enum's class attribute costs ~70 ns to look up,
# and these are asked several times per op.
_WAIT, _STALL = OpKind.WAIT, OpKind.STALL


class SimDevice:
    """State of the one simulated device: its streams, the policy, the trace."""

    def __init__(self, policy: Optional[Policy] = None) -> None:
        self.trace = Trace()
        self.streams: List[Stream] = []
        self.default_stream = self.new_stream(name="default")
        self.current = self.default_stream
        self.host_clock = 0.0
        self.last_start = 0.0
        self.queued = 0  # ops enqueued on any stream and not yet executed
        self.error: Optional[BaseException] = None
        self._eids = itertools.count(1)  # event ids, per session
        self.allocator = SimAllocator(self)
        # The CUDA graph capture under way, if any, the side stream ``graph()`` captures
        # on by default, and graph ids (per device, so traces repeat run for run): all
        # sim/graphs.py.
        self.capture: Any = None
        self.captured = False  # a graph was captured in this session (its replays may run)
        self.graph_stream: Optional[Stream] = None
        self.graph_ids = itertools.count(1)
        self.policy = Arbiter(policy or RunAll())
        load.set_load(self, NONE)  # background traffic on the copy engines: none yet

    # --- setup ------------------------------------------------------------------------
    def set_policy(self, policy: Policy) -> None:
        self.policy = Arbiter(policy)

    def new_stream(self, name: Optional[str] = None, priority: int = 0) -> Stream:
        s = Stream(priority=priority, _sim=self)
        if name:
            self.trace.stream_names[s.sid] = name
        return s

    def label(self, stream: Stream, name: str) -> None:
        self.trace.stream_names[stream.sid] = name

    def stream(self, sid: int) -> Stream:
        return self.streams[sid]

    def new_eid(self) -> int:
        return next(self._eids)

    # --- enqueue and execute ----------------------------------------------------------
    def enqueue(self, op: OpRecord) -> OpRecord:
        capture = self.capture
        if capture is not None and capture.takes(op.stream):
            return capture.record(op)  # part of a graph: recorded, run only by replays
        s = self.streams[op.stream]
        if op.kind == _WAIT and not 0 <= op.wait_for[0] < len(self.streams):
            raise SimDeviceError(f"{op.name}: waits on stream {op.wait_for[0]}, which this "
                                 f"session does not have")
        s.enq += 1
        op.seq = s.enq
        self.host_clock += HOST_STEP_US
        op.enq = self.host_clock
        self.trace.add(op)
        s.pending.append(op)
        self.queued += 1
        self.policy.on_point(self, s)
        return op

    def runnable(self, s: Stream) -> bool:
        if not s.pending:
            return False
        op = s.pending[0]
        if op.kind == _WAIT:
            ws, wseq = op.wait_for
            return self.streams[ws].done >= wseq
        if op.kind == _STALL:
            return op.enq + op.duration <= self.host_clock
        return True

    def run_head(self, s: Stream) -> None:
        """Execute the head of ``s`` (the caller checked it may run)."""
        op = s.pending.popleft()
        self.queued -= 1
        fn = op.fn
        self.clock_op(s, op)
        if fn is not None and self.error is None:
            try:
                # Kernels compute on plain CPU buffers: keep them out of our own dispatch
                # (and out of the pinned-memory host-access accounting).
                with _NoDispatch(), _NoSubclassFunction():
                    fn()
            except Exception as exc:  # the sticky device error; raised at the next sync
                # the file as reports show it (no checkout's absolute path: a committed
                # report's crash must read the same on any machine that replays it)
                where = f" ({short_path(op.frame[0])}:{op.frame[1]})" if op.frame else ""
                self.error = SimDeviceError(
                    f"device-side error in {op.name} on {self.trace.stream_name(s.sid)}"
                    f"{where}: {type(exc).__name__}: {exc}")
        self.trace.executed.append(op)

    def ran_at_once(self, s: Stream, op: OpRecord) -> None:
        """Book a kernel that already ran on the idle stream ``s`` (the dispatch's fast
        path) as enqueued, then executed: the clock and the trace as ``enqueue`` and
        ``run_head`` leave them, with nothing run. The timing is ``clock_op``'s for a
        kernel (no wait, no stall, no closure), written out: asked for most ops."""
        enq = s.enq = s.enq + 1
        op.seq = enq
        now = self.host_clock = self.host_clock + HOST_STEP_US
        op.enq = now
        trace = self.trace
        trace.add(op)
        # ``max(s.clock, now, self.last_start)``, compared out (a builtin call per op)
        start = s.clock
        if now > start:
            start = now
        last = self.last_start
        if last > start:
            start = last
        op.start = start
        end = op.end = start + op.duration
        self.last_start = start
        s.clock = end
        s.done += 1
        s.ends.append(end)
        trace.executed.append(op)
        if self.queued:  # else nothing is queued anywhere: nothing for the policy to decide
            self.policy.on_point(self, s)

    def clock_op(self, s: Stream, op: OpRecord) -> None:
        """Time ``op`` as the next op of ``s`` to execute, on the virtual clock."""
        start = max(s.clock, op.enq, self.last_start)
        kind = op.kind
        if kind == _WAIT:  # after the position it waits for
            ws, wseq = op.wait_for
            start = max(start, self.streams[ws].ends[wseq])
        duration = op.duration
        if kind == _STALL and duration == FOREVER:
            duration = max(0.0, self.host_clock - start)  # held until something forced it
        op.start = start
        op.end = start + duration
        self.last_start = start
        s.clock = op.end
        s.done += 1
        s.ends.append(op.end)
        op.fn = None  # (the closure holds device memory: let it go once run)

    def drain(self, sid: int, seq: int) -> None:
        """Execute stream ``sid`` up to ``seq``, and exactly what that needs from others.

        Iterative (a chain of waits can be long): ``chain`` holds the positions still
        needed, each blocked on its stream's head; a head that needs a stream already in
        the chain can never run."""
        chain: List[Position] = [(sid, seq)]
        while chain:
            s = self.streams[chain[-1][0]]
            if s.done >= chain[-1][1]:
                chain.pop()
                continue
            need = self._unmet(s, chain)
            if need is not None:
                if any(c[0] == need[0] for c in chain):
                    raise self._deadlock(chain + [need], "a wait cycle")
                chain.append(need)
                continue
            self.run_head(s)

    def _unmet(self, s: Stream, chain: List[Position]) -> Optional[Position]:
        """The position the head of ``s`` still waits for (None: it may run now)."""
        if not s.pending:
            raise self._deadlock(chain, f"op {chain[-1][1]} of "
                                        f"{self.trace.stream_name(s.sid)} is never enqueued")
        op = s.pending[0]
        if op.kind == _WAIT and self.streams[op.wait_for[0]].done < op.wait_for[1]:
            return op.wait_for
        return None

    def _deadlock(self, chain: List[Position], why: str) -> SimDeadlock:
        path = " -> ".join(f"{self.trace.stream_name(sid)} op {seq}" for sid, seq in chain)
        return SimDeadlock(f"deadlock: the host waits for {path}: {why}, so it can never "
                           f"complete")

    # --- host side --------------------------------------------------------------------
    def host_sync(self, waits: List[Position], label: str, frame: Optional[Frame] = None) -> None:
        """``frame``: the user frame, when the caller (an op's dispatch) has it already."""
        if self.capture is not None:
            self.capture.refuse(label, waits)  # no host syncs inside a graph capture
        if self.load is not NONE:
            load.before_sync(self)
        for sid, seq in waits:
            self.drain(sid, seq)
            self.host_clock = max(self.host_clock, self.streams[sid].ends[seq])
        frame = frame if frame is not None else user_frame(3)
        self.trace.add(SyncRecord(label, list(waits), frame, self.host_clock))
        self.policy.on_point(self, None)
        if self.error is not None:
            raise self.error

    def sync_current(self, label: str, frame: Optional[Frame] = None) -> None:
        s = self.current
        self.host_sync([(s.sid, s.enq)], label, frame)

    def synchronize_all(self) -> None:
        self.host_sync([(s.sid, s.enq) for s in self.streams], "device.synchronize")

    def poll(self, position: Position, label: str) -> bool:
        """``query()``: True once ``position`` executed (a sync edge for the detector).

        A False answer is a scheduling point, and the device keeps working while the host
        polls: one op on the way to ``position`` executes, so a polling loop terminates
        under every policy, however lazy.
        """
        if self.capture is not None:
            self.capture.refuse(label, [position])
        sid, seq = position
        if self.streams[sid].done < seq:
            self.policy.on_point(self, None)
            if self.streams[sid].done < seq:
                self._step_towards(sid, seq)
            self.host_clock += HOST_STEP_US
            return False
        self.trace.add(QueryRecord(label, position, user_frame(3), self.host_clock))
        return True

    def _step_towards(self, sid: int, seq: int) -> None:
        """Run one op on the way to ``(sid, seq)``: the first head along its chain of
        waits that may run (a polling host never spins on a wait cycle: it raises)."""
        chain: List[Position] = [(sid, seq)]
        while True:
            s = self.streams[chain[-1][0]]
            need = self._unmet(s, chain)
            if need is None:
                self.run_head(s)
                return
            if any(c[0] == need[0] for c in chain):
                raise self._deadlock(chain + [need], "a wait cycle")
            chain.append(need)

    def note_host_access(self, access, write: bool, name: str, frame) -> None:
        self.host_clock += HOST_STEP_US
        self.trace.add(HostAccess(access, write, name, frame, self.host_clock))
        self.trace.storage_names.setdefault(access[0], name)

    def position_end(self, position: Optional[Position]) -> float:
        if position is None:
            return 0.0
        sid, seq = position
        self.drain(sid, seq)
        return self.streams[sid].ends[seq]

    def pending_ops(self) -> int:
        return self.queued
