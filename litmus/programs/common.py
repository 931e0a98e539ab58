"""What every litmus family shares: the ``Litmus`` record, the policy kinds, the
expectation tables and the few helpers the program bodies are written with.

A program is a ``Litmus``: ``body(rt, stall) -> bool`` runs it on a runtime ``rt``
(simulator or CUDA -- it touches only ``rt.device``, ``rt.module``, ``rt.label``,
``rt.stall`` and ordinary torch ops) and returns True iff a stale, poisoned or otherwise
wrong value reached the host, judged against the value a sequential execution (every op
run the moment it is issued, in host program order) gives.

``stall=True`` makes the body call ``rt.stall(STALL_MS)`` on ``stalled_stream`` at the one
point whose delay exposes the race (right before the write / the read that races); the
simulator's schedule policies expose it without that.

Expectations:

* ``race``  -- whether the happens-before detector must report a race. It is a property of
  the program's synchronisation, so it holds on every schedule.
* ``stale`` -- per policy kind: ``eager``, ``lazy``, ``stall`` (= ``stall(<stalled_stream>)``),
  ``random``, ``pct``, ``cuda`` (real GPU, no injected stall) and ``cuda_stall`` (real GPU,
  ``stall=True``): True (must be stale), False (must be fresh) or None (either).
  ``expected_stale(kind)`` fills in ``cuda`` when a program leaves it out.

Every body allocates its inputs, then ``synchronize()``s the device once so the setup is
ordered before the program proper, and ends with a ``synchronize()`` so no work (or stall)
outlives it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

import torch

STALL_MS = 20.0  # the injected delay; on CUDA it dwarfs the host's few µs per launch

KINDS = ("eager", "lazy", "stall", "random", "pct", "cuda", "cuda_stall")


@dataclass(frozen=True)
class Litmus:
    name: str
    doc: str
    body: Callable[..., bool]
    race: bool
    stale: Dict[str, Optional[bool]] = field(default_factory=dict)
    stalled_stream: str = "forward"
    load: str = "none"  # the background load around the program's copies (``family load``)

    def expected_stale(self, kind: str) -> Optional[bool]:
        """True / False / None (either) for a policy kind (see the module docstring)."""
        if kind in self.stale:
            return self.stale[kind]
        if kind == "cuda":  # unstalled hardware: a racy program may go either way
            return None if self.race else self.stale.get("eager")
        raise KeyError(f"{self.name}: no expectation for policy kind {kind!r}")

    def run(self, rt, stall: bool = False) -> bool:
        return bool(self.body(rt, stall))


# Expectation tables --------------------------------------------------------------------

def _racy(lazy: bool = True) -> Dict[str, Optional[bool]]:
    """A racy program: fresh when every op runs at issue; stale when the stalled stream
    (or, with ``lazy``, every stream) runs only on demand; either under the random ones."""
    return {"eager": False, "lazy": lazy, "stall": True, "random": None, "pct": None,
            "cuda": None, "cuda_stall": True}


_CLEAN = {k: False for k in KINDS}
# Uninitialised memory: on the simulator the freed block's old contents (its caching
# allocator hands it straight back) or poison, never what the program wants. On CUDA it is
# whatever the caching allocator hands back -- a freed block's old contents, or fresh
# (often zero) memory when another block comes back -- so either verdict.
_POISON = {k: (None if k.startswith("cuda") else True) for k in KINDS}


# Helpers -------------------------------------------------------------------------------

def overlap_streams(rt):
    """The device module and the two streams of the overlap scheduler, labelled."""
    m = rt.module
    S, F = m.Stream(), m.Stream()
    rt.label(S, "schedule")
    rt.label(F, "forward")
    return m, S, F


def _stall(rt, stall: bool) -> None:
    if stall:
        rt.stall(STALL_MS)


# What a reader that sees the producer's write reads (``produce``)
FIVES = [5, 5, 5, 5]


def produce(rt, stall: bool, record: bool = False):
    """Message passing's first half, which most programs share: the two streams, ``x``
    (four int32 zeros on the device, settled) and on the forward stream -- after the
    stall, when asked -- the producer ``x += 5``, with an event recorded right after it
    when ``record``. ``(m, S, F, x, event or None)``; a reader that sees it reads
    ``FIVES``."""
    m, S, F = overlap_streams(rt)
    x = torch.zeros(4, dtype=torch.int32, device=rt.device)
    m.synchronize()
    with m.stream(F):
        _stall(rt, stall)
        x.add_(5)
        ready = m.Event() if record else None
        if ready is not None:
            ready.record()
    return m, S, F, x, ready


def consume(rt, stall: bool, wait: str) -> bool:
    """Stale? The producer's write (``produce``) read on the schedule stream after
    ``wait``: "" (nothing orders the read after the write), "event" (the event recorded
    after it), "stream" (``wait_stream`` on the forward stream) or "device" (the host's
    ``device.synchronize()``)."""
    m, S, F, x, ready = produce(rt, stall, record=wait == "event")
    if wait == "device":
        m.synchronize()  # waits for every stream
    with m.stream(S):
        if wait == "event":
            S.wait_event(ready)
        elif wait == "stream":
            S.wait_stream(F)
        got = x.tolist()
    m.synchronize()
    return got != FIVES


def _i32(values, rt) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=rt.device)


def _pinned_zeros(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.int32, pin_memory=True)
