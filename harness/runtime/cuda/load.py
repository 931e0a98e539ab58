"""A background load on a real GPU (``runtime.load``): a thread of its own beside the run.

A copy load keeps one direction's copy engine busy: bulk copies between a pinned host
buffer and a device buffer on a stream of the thread's own, at most two queued at a time
(the thread waits for the older one before it queues the next), so the run's own copies of
that direction queue behind real traffic. ``host-busy`` spins pure Python, contending
with the loop for the interpreter lock. The thread's ops are not the program's: it has no
dispatch mode (modes are per thread) and reaches the stream and event methods beneath
the traced wrappers, so nothing of it enters the run's trace.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import torch

from harness.runtime.load import NONE, Load

_EVENT = torch._C._CudaEventBase  # beneath torch.cuda.Event's traced wrappers


def _copies(load: Load, direction: str, stop: threading.Event) -> None:
    n = load.bulk_bytes(direction)
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    queued = []
    with torch.cuda.stream(stream):
        while not stop.is_set():
            if direction == "d2h":
                host.copy_(dev, non_blocking=True)
            else:
                dev.copy_(host, non_blocking=True)
            done = torch.cuda.Event()
            _EVENT.record(done, stream)
            queued.append(done)
            if len(queued) > 2:
                _EVENT.synchronize(queued.pop(0))
    for done in queued:
        _EVENT.synchronize(done)


def _busy(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        for i in range(10_000):  # pure Python: holds the interpreter lock between switches
            x ^= i


@contextlib.contextmanager
def cuda_load(load: Load) -> Iterator[None]:
    """Run ``load`` in background threads for the duration of the block."""
    if load is NONE:
        yield
        return
    stop = threading.Event()
    threads = [threading.Thread(target=_copies, args=(load, d, stop), daemon=True,
                                name=f"specrace-load-{d}")
               for d in ("d2h", "h2d") if load.bulk_bytes(d)]
    if load.host_busy:
        threads.append(threading.Thread(target=_busy, args=(stop,), daemon=True,
                                        name="specrace-load-host"))
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
