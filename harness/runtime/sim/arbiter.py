"""Between the simulated device and a policy's chooser (the protocol: ``runtime/policy.py``).

At a scheduling point the ``Arbiter`` turns the device's state into the chooser's plain
data (the runnable stream ids, the stream the last answer ran, the labels), runs what the
chooser names, asks again until the answer is the host, and records every answer in
``trace.schedule`` -- the schedule that ran, which a ``Recorded`` policy replays.
"""
from __future__ import annotations

from typing import Any, List, Optional

from harness.runtime.policy import Chooser, Policy
from harness.runtime.trace import HOST
from harness.runtime.sim.errors import SimDeviceError

__all__ = ["Arbiter", "runnable_ids"]

# ``dev`` below is a ``device.SimDevice`` (not imported: the device imports this module)


def runnable_ids(dev: Any) -> List[int]:
    """The streams whose head may execute now, ascending: what a chooser chooses from."""
    runnable = dev.runnable
    return [s.sid for s in dev.streams if s.pending and runnable(s)]


class Arbiter:
    """The device's scheduling hook, ``dev.policy``: the dispatch asks it whether an op
    enqueued on an idle stream runs at once (``runs_idle``, the per-op fast path)
    and calls ``on_point`` at every scheduling point. It turns the device's state into the
    chooser's plain data and records each answer in ``trace.schedule``."""

    def __init__(self, policy: Policy) -> None:
        if not isinstance(policy, Policy):  # a spelling is parsed once, above the runtime
            raise TypeError(f"a schedule policy value is needed (harness.policies."
                            f"parse_policy makes one), not {type(policy).__name__}")
        self.value = policy
        self.chooser = policy.chooser()  # a graph capture wraps it (sim/graphs.py)

    @property
    def chooser(self) -> Chooser:
        return self._chooser

    @chooser.setter
    def chooser(self, chooser: Chooser) -> None:
        self._chooser = chooser
        # ``runs_idle(stream_id, names)``: does an op enqueued on that idle stream run at
        # once? The chooser's own method, asked for every op: no frame of ours around it.
        self.runs_idle = chooser.runs_idle

    def on_point(self, dev: Any, stream: Optional[Any]) -> None:
        """Ask while some head may run, until the answer is the host."""
        choose = self.chooser.choose
        names = dev.trace.stream_names
        record = dev.trace.choices.append  # the value is ``trace.schedule``
        last = None
        while dev.queued:  # (nothing queued anywhere: no head to run, nothing to ask)
            runnable = runnable_ids(dev)
            if not runnable:
                return
            choice = choose(runnable, last, names)
            record(choice)
            if choice == HOST:
                return
            if choice not in runnable:  # a policy bug; running it would break the FIFO
                raise SimDeviceError(f"policy {self.value} chose stream {choice}, which "
                                     f"cannot run now (runnable: {runnable})")
            dev.run_head(dev.streams[choice])
            last = choice

    def __str__(self) -> str:
        return str(self.value)
