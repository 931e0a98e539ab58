"""The simulator behind the ``Runtime`` interface."""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch

from harness.runtime import Runtime
from harness.runtime.limits import MAX_STALL_MS  # every stall is capped, on the simulator too
from harness.runtime.policy import Policy
from harness.runtime.trace import STALL_OP, OpKind, OpRecord, user_frame
from harness.runtime.load import NONE, Load
from harness.runtime.sim import session
from harness.runtime.sim.load import set_load
from harness.runtime.sim.device import FOREVER, SimDevice


class SimRuntime(Runtime):
    backend = "sim"

    def __init__(self, dev: SimDevice) -> None:
        self.dev = dev
        self.device = torch.device("sim", 0)
        self.trace = dev.trace

    @property
    def module(self):
        return torch.get_device_module(self.device)

    def label(self, stream, name: str) -> None:
        self.dev.label(stream, name)

    def stall(self, ms: Optional[float]) -> None:
        """A stall marker on the current stream: later ops there wait until the virtual
        host clock passes it, or until a sync or an event wait forces it (``None``: only
        then)."""
        duration = FOREVER if ms is None else min(max(ms, 0.0), MAX_STALL_MS) * 1000.0
        self.dev.enqueue(OpRecord(self.dev.current.sid, STALL_OP, [], [], user_frame(3),
                                  kind=OpKind.STALL, duration=duration))

    def synchronize(self) -> None:
        self.dev.synchronize_all()

    def uva_view(self, host: torch.Tensor) -> torch.Tensor:
        """The pinned buffer's own memory as a simulated device tensor on the buffer's
        storage id: a deferred kernel computes from it when its stream runs it, so it
        reads what the host wrote by then (``Runtime.uva_view``)."""
        from harness.runtime.sim.tensor import SimTensor
        sid = self.pinned_sid(host)
        # the same memory as a plain tensor: no host access is reported for taking it
        return SimTensor(torch.Tensor.as_subclass(host, torch.Tensor), sid)

    @contextlib.contextmanager
    def loaded(self, load: Load) -> Iterator[None]:
        before = self.dev.load
        set_load(self.dev, load)
        try:
            yield
        finally:
            set_load(self.dev, before)


@contextlib.contextmanager
def sim_runtime(policy: Optional[Policy] = None, load: Load = NONE) -> Iterator[SimRuntime]:
    with session(policy) as dev:
        set_load(dev, load)
        yield SimRuntime(dev)
