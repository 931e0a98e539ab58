"""The scheduling interface the simulated device calls; concrete policies live in
``harness.policies`` (a higher layer), so the runtime only knows this contract.

A policy is told about every scheduling point -- an enqueue, a host sync, a query -- and
may execute any *runnable* stream heads through ``device.run_head(stream)``. Whatever it
leaves pending runs later, when a host sync or an event wait demands it. Policies must be
deterministic functions of their seed and the sequence of calls they receive.
"""
from __future__ import annotations

from typing import Any


class Policy:
    name = "policy"

    def bind(self, device: Any) -> None:
        """Called once when installed on a device (reset per-run state here)."""

    def on_point(self, device: Any, stream: Any) -> None:
        """A scheduling point; ``stream`` is where the host just enqueued (or None)."""
        raise NotImplementedError

    def runs_at_enqueue(self, device: Any, stream: Any) -> bool:
        """True if an op enqueued on an idle ``stream`` would certainly run at once.

        Lets the device execute such ops directly (no meta run, no poison, no closure).
        """
        return False

    def describe(self) -> str:
        return self.name


class RunAll(Policy):
    """Run everything runnable at once: a synchronous device. The runtime's default."""

    name = "eager"

    def on_point(self, device: Any, stream: Any) -> None:
        device.run_runnable()

    def runs_at_enqueue(self, device: Any, stream: Any) -> bool:
        return True
