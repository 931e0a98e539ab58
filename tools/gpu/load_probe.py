"""What the copy engines do under bulk traffic, measured on a GPU (the truth the
simulator's copy-engine model, ``harness/runtime/sim/load.py``, is held to).

    python3 tools/gpu/load_probe.py > load_probe.json

* ``bandwidth``: one 256 MiB pinned copy per direction, the engine otherwise idle (GB/s);
* ``behind_bulk``: a small D2H on stream C queued after a 256 MiB D2H on stream L -- how
  late it starts (its event's time after the bulk's start), and the same behind an H2D
  bulk (a direction's queue of its own?);
* ``fifo_across_streams``: with a bulk D2H on L and a small async D2H on C queued behind
  it, a *blocking* small D2H on a third stream S: when it returns, has C's copy landed?
  (True: one FIFO queue per direction across streams; False: C may still be queued.)
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch

MB = 1 << 20
BULK = 256 * MB


def _bulk_buffers():
    """A pinned host buffer and a device buffer of ``BULK`` bytes each."""
    return (torch.empty(BULK, dtype=torch.uint8, pin_memory=True),
            torch.empty(BULK, dtype=torch.uint8, device="cuda"))


def _bulk_copy(direction: str, host, dev) -> None:
    """One bulk copy, ``d2h`` or ``h2d``, queued on the current stream."""
    if direction == "d2h":
        host.copy_(dev, non_blocking=True)
    else:
        dev.copy_(host, non_blocking=True)


def _bandwidth(direction: str, reps: int = 10) -> float:
    host, dev = _bulk_buffers()
    s = torch.cuda.Stream()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(s):
            a.record()
            _bulk_copy(direction, host, dev)
            b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return BULK / (statistics.median(times) / 1e3) / 1e9


def _behind(bulk_dir: str, trials: int = 50) -> dict:
    host_big, dev_big = _bulk_buffers()
    small_dev = torch.ones(1024, dtype=torch.int32, device="cuda")
    small_host = torch.zeros(1024, dtype=torch.int32, pin_memory=True)
    L, C = torch.cuda.Stream(), torch.cuda.Stream()
    delays = []
    for _ in range(trials):
        torch.cuda.synchronize()
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(L):
            t0.record()
            _bulk_copy(bulk_dir, host_big, dev_big)
        with torch.cuda.stream(C):
            small_host.copy_(small_dev, non_blocking=True)
            t1.record()
        t1.synchronize()
        delays.append(t0.elapsed_time(t1))
        torch.cuda.synchronize()
    return {"bulk": bulk_dir, "small_d2h_done_after_ms": statistics.median(delays),
            "min_ms": min(delays), "max_ms": max(delays), "trials": trials}


def _fifo(trials: int = 100) -> dict:
    host_big, dev_big = _bulk_buffers()
    src = torch.zeros(1024, dtype=torch.int32, device="cuda")
    dst = torch.zeros(1024, dtype=torch.int32, pin_memory=True)
    other = torch.ones(16, dtype=torch.int32, device="cuda")
    L, C, S = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    landed = 0
    for i in range(trials):
        torch.cuda.synchronize()
        src.fill_(i + 1)
        dst.zero_()
        torch.cuda.synchronize()
        with torch.cuda.stream(L):
            _bulk_copy("d2h", host_big, dev_big)
        with torch.cuda.stream(C):
            dst.copy_(src, non_blocking=True)  # queued behind the bulk D2H
        with torch.cuda.stream(S):
            other.cpu()  # blocking: returns when this small D2H has run
        landed += int(dst[0].item() == i + 1)  # a plain host read of the pinned buffer
        torch.cuda.synchronize()
    return {"async_copy_landed_when_blocking_copy_returned": landed, "trials": trials}


def main() -> int:
    torch.cuda.init()
    torch.ones(1, device="cuda").cpu()
    t = time.time()
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "bandwidth_gbps": {d: round(_bandwidth(d), 2) for d in ("d2h", "h2d")},
           "behind_bulk": [_behind("d2h"), _behind("h2d")],
           "fifo_across_streams": _fifo()}
    out["wall_s"] = round(time.time() - t, 1)
    json.dump(out, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
