"""The engine a target's ``scheduler(args, device, grammar_backend)`` returns, declared:
what the harness drives (``harness.trials.drive``), the mirror's ``Scheduler``, the sglang
target's ``UpstreamLoop`` and the vLLM target's ``VllmEngine`` / ``DraftTokensEngine``
all are. ``EngineLoop`` is the one ``run_to_completion`` they share.
"""
from __future__ import annotations

from typing import Any, Dict, Protocol, runtime_checkable


@runtime_checkable
class Engine(Protocol):
    """One engine of a run: requests in, one scheduler iteration per ``step``."""

    iteration: int  # the iterations run so far (a run stops at a limit of them)

    @property
    def streams(self) -> Dict[str, Any]:
        """name -> the stream of that name (None where a run has none), labelled in
        traces."""

    def add_request(self, req: Any) -> None: ...

    def has_work(self) -> bool:
        """Anything waiting, running or in flight."""

    def step(self) -> None:
        """One iteration of the server's event loop."""

    def run_to_completion(self, max_iterations: int = 10_000) -> None:
        """Step until nothing is left (or the limit), then settle what is in flight."""

    def close(self) -> None:
        """Release what the engine holds; safe after a step that raised."""


class EngineLoop:
    """``run_to_completion`` written once: step while there is work, then ``drain`` what
    the last step left in flight (nothing, unless an engine keeps results past its
    ``has_work``)."""

    iteration: int

    def run_to_completion(self, max_iterations: int = 10_000) -> None:
        while self.has_work() and self.iteration < max_iterations:
            self.step()
        self.drain()

    def drain(self) -> None:
        """Settle what is still in flight once no step is due (default: nothing)."""
