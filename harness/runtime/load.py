"""Background load: the work a real server does beside the step under test, which is what
breaks a readback that is correct only *by timing* -- no injected stall needed.

Each load is named for what causes it in a server:

* ``bulk-d2h``  -- KV-cache offload / HiCache write-back (memcpy io backends): bulk
  device-to-host copies on another stream, back to back;
* ``bulk-h2d``  -- weight or LoRA loads: bulk host-to-device copies on another stream;
* ``host-busy`` -- a CPU-bound host thread (tokenizer, detokenizer, metrics) contending
  for the interpreter lock: the loop's launches come late and unevenly.

Both backends run them. On CUDA a load is real traffic on the GPU's copy engines, from a
background thread with a stream of its own (``runtime.cuda.load``). On the simulator it is a
modelled copy-engine queue (``runtime.sim.load``): a copy of one direction starts only
after the bulk copy queued ahead of it in that direction's engine, whose duration is its
bytes over the engine's bandwidth (``COPY_ENGINE_GBPS``, measured on the H200); the host's
lock contention is a host delay per launch. So a schedule the GPU produces under the load
is one the simulator explores, deterministically.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

# One pinned copy's bandwidth per direction (GB/s, 256 MiB copies, one stream, the engine
# otherwise idle), measured by tools/gpu/load_probe.py on an H100 80GB HBM3 (2026-12-05;
# reports/measurements.md, the copy engines: d2h 54.97, h2d 54.68). The simulator times a bulk copy
# with it; only the order of copies matters to a verdict, the figure sets how much host
# time a bulk copy spans. The same probe found the model's three facts on that GPU: a small
# D2H behind a 256 MiB D2H on another stream finished 4.90 ms after it started (the bulk's
# own time: FIFO behind it), behind a 256 MiB H2D 0.06 ms (each direction its own queue),
# and a blocking D2H queued after an async one returned with the async one landed 100/100.
COPY_ENGINE_GBPS: Dict[str, float] = {"d2h": 54.97, "h2d": 54.68}
BULK_BYTES = 256 << 20  # one bulk copy of the copy loads (the probe's smallest chunk)
HOST_BUSY_US = 200.0  # the simulated host's delay per launch under ``host-busy``


@dataclass(frozen=True)
class Load:
    name: str
    cause: str  # what makes it in a real server
    d2h_bytes: int = 0  # bulk copies queued back to back on the D2H engine (0: none)
    h2d_bytes: int = 0  # ... on the H2D engine
    host_busy: bool = False  # a CPU-bound thread beside the loop

    def bulk_bytes(self, direction: str) -> int:
        return self.d2h_bytes if direction == "d2h" else self.h2d_bytes

    def bulk_us(self, direction: str) -> float:
        """How long one bulk copy keeps ``direction``'s engine, in microseconds."""
        return self.bulk_bytes(direction) / (COPY_ENGINE_GBPS[direction] * 1e3)

    def to_json(self) -> str:
        return self.name


NONE = Load("none", "no background work")
LOADS: Dict[str, Load] = {load.name: load for load in (
    NONE,
    Load("bulk-d2h", "KV offload / HiCache write-back: bulk device-to-host copies on "
                     "another stream", d2h_bytes=BULK_BYTES),
    Load("bulk-h2d", "weight or LoRA loads: bulk host-to-device copies on another stream",
         h2d_bytes=BULK_BYTES),
    Load("host-busy", "a CPU-bound host thread contending for the interpreter lock",
         host_busy=True),
)}


def get_load(name: str) -> Load:
    """The load called ``name`` (``ValueError`` naming the choices)."""
    try:
        return LOADS[name]
    except KeyError:
        raise ValueError(f"unknown load {name[:40]!r}; expected one of: "
                         f"{', '.join(LOADS)}") from None
