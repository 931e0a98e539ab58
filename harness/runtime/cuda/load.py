"""A background load on a real GPU (``runtime.load``): threads of their own beside the run.

A copy load keeps one direction's copy engine busy: bulk copies between a pinned host
buffer and a device buffer on a stream of the thread's own, one in flight at a time: a
worker that keeps the next copy queued behind the running one starves a copy of another
stream in the same direction -- on an H100 a 16-byte D2H behind a loop of 256 MiB D2Hs kept
two deep did not land in 8 s (1,706 bulk copies passed it; 16 MiB ones: 2.5 s), which is
no server's KV offload and hung the load litmus programs. With the engine idle for the
host's turnaround between two bulk copies, another stream's copy takes its turn there.
``host-busy`` spins pure Python, contending with the loop for the interpreter lock.

The threads and their 256 MiB buffers are made once per process and paused between runs
(a repro opens a runtime per trial: page-locking 256 MiB per trial would cost more than
the trial). ``cuda_load`` resumes the load's workers for its block and, on the way out,
pauses them and waits until none has a copy in flight, so nothing of a run's load spills
into the next run. The workers' ops are not the program's: they have no dispatch mode
(modes are per thread) and reach the stream and event methods beneath the traced
wrappers, so nothing of them enters the run's trace.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Dict, Iterator

import torch

from harness.runtime.cuda.calibration import calibrate
from harness.runtime.load import BULK_BYTES, NONE, Load

_EVENT = torch._C._CudaEventBase  # beneath torch.cuda.Event's traced wrappers
PAUSE_TIMEOUT_S = 30.0  # a worker that does not go idle by then: the run reports it


class _Worker:
    """One background worker: resumed and paused, never stopped."""

    def __init__(self, name: str, body) -> None:
        self.running = threading.Event()  # set: work; clear: pause
        self.idle = threading.Event()  # set while paused with nothing in flight
        self.idle.set()
        self._body = body
        self.thread = threading.Thread(target=self._loop, daemon=True, name=name)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            self.running.wait()
            self.idle.clear()
            try:
                self._body(self.running)
            finally:
                self.idle.set()

    def resume(self) -> None:
        self.running.set()

    def pause(self) -> None:
        self.running.clear()
        if not self.idle.wait(PAUSE_TIMEOUT_S):
            raise RuntimeError(f"background load {self.thread.name} did not pause in "
                               f"{PAUSE_TIMEOUT_S:g} s")


def _copies(direction: str):
    host = torch.empty(BULK_BYTES, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(BULK_BYTES, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()

    def body(running: threading.Event) -> None:
        with torch.cuda.stream(stream):
            while running.is_set():
                if direction == "d2h":
                    host.copy_(dev, non_blocking=True)
                else:
                    dev.copy_(host, non_blocking=True)
                done = torch.cuda.Event()
                _EVENT.record(done, stream)
                # one in flight (module docstring); paused, nothing of the run's load
                # stays in flight either
                _EVENT.synchronize(done)
    return body


def _busy(running: threading.Event) -> None:
    x = 0
    while running.is_set():
        for i in range(10_000):  # pure Python: holds the interpreter lock between switches
            x ^= i


_WORKERS: Dict[str, _Worker] = {}


def _worker(kind: str) -> _Worker:
    worker = _WORKERS.get(kind)
    if worker is None:
        body = _busy if kind == "host" else _copies(kind)
        worker = _WORKERS[kind] = _Worker(f"specrace-load-{kind}", body)
    return worker


@contextlib.contextmanager
def cuda_load(load: Load) -> Iterator[None]:
    """Run ``load`` in the background for the duration of the block."""
    if load is NONE:
        yield
        return
    kinds = [d for d in ("d2h", "h2d") if load.bulk_bytes(d)]
    kinds += ["host"] if load.host_busy else []
    workers = [_worker(k) for k in kinds]
    # a stall in the block calibrates first, before the load: the calibration's device-wide
    # syncs and timed spins would otherwise share the GPU with the load's copies
    calibrate()
    for w in workers:
        w.resume()
    try:
        yield
    finally:
        for w in workers:
            w.pause()
