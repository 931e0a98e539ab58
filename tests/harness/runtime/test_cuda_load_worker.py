"""The CUDA load's background workers (``runtime.cuda.load``): made once, resumed for a
run, paused after it with nothing in flight -- checked with a plain body, no GPU."""
import threading
import time

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch._C, "_CudaEventBase"):
    pytest.skip("this torch build has no CUDA event type", allow_module_level=True)

from harness.runtime.cuda.load import _Worker  # noqa: E402


def test_a_worker_runs_only_while_resumed_and_pauses_idle():
    ticks, inside = [], threading.Event()

    def body(running):
        inside.set()
        while running.is_set():
            ticks.append(1)
            time.sleep(0.001)
        inside.clear()

    w = _Worker("test-worker", body)
    assert w.idle.is_set() and not ticks
    w.resume()
    assert inside.wait(5)
    w.pause()  # returns once the body left: nothing in flight
    assert w.idle.is_set() and not inside.is_set()
    n = len(ticks)
    time.sleep(0.02)
    assert len(ticks) == n  # paused: no more work
    w.resume()
    assert inside.wait(5)
    w.pause()
    assert len(ticks) > n
