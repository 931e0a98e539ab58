"""The simulated device's errors (their own module: the device and its scheduler raise them)."""
from __future__ import annotations

from .. import DeadlockError

__all__ = ["SimDeviceError", "SimDeadlock"]


class SimDeviceError(RuntimeError):
    """A kernel failed on the simulated device (like a CUDA device-side assert), or a
    stream or event was used outside the session it belongs to."""


class SimDeadlock(SimDeviceError, DeadlockError):
    """A host sync waits on something that can never complete."""
