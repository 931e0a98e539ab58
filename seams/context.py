"""The current run: one object holding everything "this run" means, instead of module
globals swapped in lockstep.

A ``RunContext`` holds the simulated device, the pinned host memory registry and storage-id
count, the host-access recorder, the CUDA capture and the fault plan of the run that is
open. ``current()`` is the one accessor. A runtime (``sim.session``, ``cuda_runtime``)
opens a context for its run with ``opened(...)`` and the outer one comes back on exit, so
runs nest (a reference run inside a trial) without any module saving and restoring its
own piece. What a run does not set it shares with the run around it (a sim session inside
a CUDA run keeps the CUDA capture; the fault plan is whatever the innermost
``faults.installed`` put there); the pinned registry and storage ids are always fresh, so
the same run gives the same trace also when it is not the first in its process.

Like ``faults`` (which keeps its plan here), this module imports nothing from the rest of
the harness: it sits below every layer.
"""
from __future__ import annotations

import contextlib
import itertools
from typing import Any, Callable, Dict, Iterator, Optional, Tuple


class RunContext:
    """The state of one open run (fields are plain attributes: the hot paths read them)."""

    __slots__ = ("sim_device", "pinned", "sids", "recorder", "cuda_capture", "plan")

    def __init__(self, outer: Optional["RunContext"] = None) -> None:
        # the simulated device (``sim.device.SimDevice``) of the open sim session
        self.sim_device: Any = outer.sim_device if outer is not None else None
        # storage data_ptr -> (sid, name, tensor) of watched pinned host memory (hostmem)
        self.pinned: Dict[int, Tuple[int, str, Any]] = {}
        self.sids = itertools.count(1)  # storage ids, numbered per run
        # recorder(access, write, name, frame): where host accesses of pinned memory go
        self.recorder: Optional[Callable[..., None]] = outer.recorder if outer else None
        # the CUDA capture (``cuda.capture.Capture``) the API wrappers log into
        self.cuda_capture: Any = outer.cuda_capture if outer is not None else None
        self.plan: Any = outer.plan if outer is not None else None  # faults.installed

    def __repr__(self) -> str:
        return (f"<RunContext sim={self.sim_device is not None} pinned={len(self.pinned)} "
                f"capture={self.cuda_capture is not None} plan={self.plan is not None}>")


_CURRENT = RunContext()  # the process's own context: no run open


def current() -> RunContext:
    return _CURRENT


@contextlib.contextmanager
def opened(**fields: Any) -> Iterator[RunContext]:
    """A fresh context for one run (``fields`` set on it), current for the block."""
    global _CURRENT
    outer = _CURRENT
    ctx = RunContext(outer)
    for name, value in fields.items():
        setattr(ctx, name, value)
    _CURRENT = ctx
    try:
        yield ctx
    finally:
        _CURRENT = outer


@contextlib.contextmanager
def field_set(name: str, value: Any) -> Iterator[Any]:
    """One field of the current context set to ``value`` for the block, and the outer
    value back afterwards (a fault plan around a nested reference run; a capture that
    tests drive without a runtime)."""
    ctx = current()
    outer = getattr(ctx, name)
    setattr(ctx, name, value)
    try:
        yield value
    finally:
        setattr(ctx, name, outer)
