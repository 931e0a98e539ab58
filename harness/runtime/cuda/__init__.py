"""The CUDA backend: torch.cuda itself, plus a calibrated stall and an op-trace capture.

``cuda_runtime(trace=True)`` yields a ``CudaRuntime`` (``runtime.py``: the lifecycle).
The rooms, one job each:

* ``calibration.py`` -- stalls: ``torch.cuda._sleep`` cycles per millisecond, calibrated
  once per process, every stall capped (the watchdog, ``runtime/watchdog.py``, exits a
  hung GPU run with status 3);
* ``capture.py`` -- the capture's bookkeeping: stream ids and seqs, storage ids, inferred
  frees of reused blocks, event positions;
* ``dispatch.py`` -- the dispatch mode: the CUDA rungs of the shared ``ops`` ladder (CUDA
  runs the op; the capture records its reads, writes and host syncs);
* ``api.py`` -- the stream/event/graph API wrappers, generated from one table, installed
  once per process;
* ``runtime.py`` -- ``CudaRuntime`` and ``cuda_runtime``: a run context per run, nesting.

The trace is in the format the simulator writes (``trace.py``), so the happens-before
detector runs on it unchanged. Differences from the simulator worth knowing (both follow
CUDA / PyTorch): ``*_like`` / ``new_*`` factories do not read their input's data; views
of pinned memory are metadata, not host reads; blocking H2D copies sync the stream.
"""
from __future__ import annotations

from harness.runtime.limits import DEFAULT_STALL_MS, MAX_STALL_MS
from harness.runtime.watchdog import WATCHDOG_EXIT, watchdog
from harness.runtime.cuda.api import ensure_api_wrapped
from harness.runtime.cuda.calibration import calibrate, cycles_per_ms_from_samples, stall_cycles
from harness.runtime.cuda.capture import Capture, passthrough
from harness.runtime.cuda.dispatch import CaptureMode, CudaBackend
from harness.runtime.cuda.runtime import CudaRuntime, capturing, cuda_runtime

__all__ = [
    "CudaRuntime", "cuda_runtime", "calibrate", "cycles_per_ms_from_samples",
    "stall_cycles", "watchdog", "DEFAULT_STALL_MS", "MAX_STALL_MS", "WATCHDOG_EXIT",
    "Capture", "CaptureMode", "CudaBackend", "capturing", "ensure_api_wrapped",
    "passthrough",
]
