"""Layer 1: the asynchronous device runtime -- real CUDA or the deterministic simulator.

``open_runtime(backend, policy)`` yields a ``Runtime``: the ``device`` that ``impl/`` code
is handed, the device module (``torch.get_device_module(device)``), stream labels, the
stall primitive behind fault points, and the trace the detector reads.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch

from harness.runtime.load import NONE, Load
from harness.runtime.policy import Policy
from harness.runtime.trace import Trace
from seams.vocab import Backend

__all__ = ["Runtime", "open_runtime", "cuda_available", "resolve_backend", "BackendError",
           "DeadlockError"]


class BackendError(RuntimeError):
    """The requested backend cannot run here (e.g. ``cuda`` on a machine without a GPU)."""


class DeadlockError(RuntimeError):
    """A host sync can never return: what it waits for waits, in the end, on itself (or on
    an op that was never enqueued). The trial runner reports it as a finding."""


def cuda_available() -> bool:
    return torch.cuda.is_available()


def resolve_backend(backend: str) -> str:
    if backend == "auto":
        return "cuda" if cuda_available() else "sim"
    if backend == Backend.CUDA and not cuda_available():
        raise BackendError("--backend cuda: no CUDA device is available on this machine")
    if backend not in ("sim", "cuda"):
        raise BackendError(f"unknown backend {backend!r}; expected sim, cuda or auto")
    return backend


class Runtime:
    """What a run needs from its backend; both backends implement this."""

    backend: str
    device: torch.device
    trace: Trace

    @property
    def module(self):
        return torch.get_device_module(self.device)

    def label(self, stream, name: str) -> None:
        raise NotImplementedError

    def stall(self, ms: Optional[float]) -> None:
        """Hold the *current* stream busy for ``ms`` (None: until something needs it)."""
        raise NotImplementedError

    def synchronize(self) -> None:
        self.module.synchronize()

    def loaded(self, load: Load):
        """A block of the run with ``load`` beside it (``runtime.load``): a litmus program
        puts bulk traffic around its own copies."""
        raise NotImplementedError

    def uva_view(self, host: torch.Tensor) -> torch.Tensor:
        """A device tensor over ``host``'s pinned memory, read and written in place by the
        kernels that take it -- when they *execute*, not when they are launched (Unified
        Virtual Addressing: vLLM's ``UvaBuffer``). Its accesses are the pinned buffer's,
        ordered by the detector against the host's reads and writes of it."""
        raise NotImplementedError

    @staticmethod
    def pinned_sid(host: torch.Tensor) -> int:
        """The storage id of ``host``'s watched pinned memory (what a UVA view is of)."""
        from harness.runtime import hostmem
        hit = hostmem.lookup(host)
        if hit is None:
            raise ValueError("a UVA view needs pinned host memory (pin_memory=True)")
        return hit[0]



@contextlib.contextmanager
def open_runtime(backend: str = "auto", policy: Optional[Policy] = None,
                 trace: bool = True, load: Optional[Load] = None) -> Iterator[Runtime]:
    """A runtime for the run; ``load``: background work beside it (``runtime.load``)."""
    backend = resolve_backend(backend)
    load = load or NONE
    if backend == Backend.SIM:
        from harness.runtime.sim.runtime import sim_runtime
        with sim_runtime(policy, load) as rt:
            yield rt
    else:
        from harness.runtime.cuda import cuda_runtime
        from harness.runtime.cuda.load import cuda_load
        with cuda_runtime(trace=trace) as rt, cuda_load(load):
            yield rt
