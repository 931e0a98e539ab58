"""The simulator's errors, and the check that a stream or event belongs to its session."""
from __future__ import annotations

from typing import Any, Optional

from harness.runtime import DeadlockError

__all__ = ["SimDeviceError", "SimDeadlock", "check_session"]


class SimDeviceError(RuntimeError):
    """A kernel failed on the simulated device (like a CUDA device-side assert), or a
    stream or event was used outside the session it belongs to."""


class SimDeadlock(SimDeviceError, DeadlockError):
    """A host sync waits on something that can never complete."""


def check_session(dev: Any, owner: Optional[Any], what: str) -> None:
    if owner is not dev:
        raise SimDeviceError(f"{what} belongs to another simulator session: streams and "
                             f"events cannot be carried from one run into the next")
