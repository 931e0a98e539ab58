"""Device-API names a run answers itself, for the length of the run, on either backend.

Servers name their streams and events in more than one way: sglang through
``torch.get_device_module(device)``, vLLM through ``torch.cuda.Stream()`` and the
device-generic ``torch.Event()`` / ``torch.Stream()``. A backend sees a stream or event
only through the classes it knows -- the simulator's, or ``torch.cuda``'s, whose API the
CUDA capture wraps (``torch.Event`` is an immutable C type: its methods cannot be
wrapped) -- so inside a run those names answer with the backend's own classes
(``answered``), and are put back when the run ends: nothing outside a run ever sees them.
"""
from __future__ import annotations

import contextlib
import importlib
from typing import Any, Iterator, Sequence, Tuple

# torch modules that subclass or bind these names when first imported (``class
# Event(torch.Event)`` in dynamo's device interface, which a meta kernel's lazy import
# pulls in mid-run): imported before the first swap, so none is first imported while a
# run has the names swapped -- a class made then would subclass the run's answer, and a
# binding made then would outlive the run. (Imported lazily: ~2 s of dynamo that every
# simulated run pays at its first meta kernel anyway, and a command that opens no run
# should not.)
_BIND_AT_IMPORT = ("torch._streambase", "torch.mtia", "torch._dynamo.device_interface",
                   "torch._dynamo.variables.streams", "torch._inductor.standalone_compile")

_MISSING: Any = object()


@contextlib.contextmanager
def answered(names: Sequence[Tuple[Any, str, Any]]) -> Iterator[None]:
    """Within the block each ``(owner, attribute, answer)`` holds ``answer`` (nests: each
    block puts back what it found)."""
    for module in _BIND_AT_IMPORT:
        importlib.import_module(module)  # (a dict lookup once imported)
    saved = [(owner, name, getattr(owner, name, _MISSING)) for owner, name, _ in names]
    for owner, name, ours in names:
        setattr(owner, name, ours)
    try:
        yield
    finally:
        for owner, name, before in saved:
            if before is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, before)


def generic_names(module: Any) -> Sequence[Tuple[Any, str, Any]]:
    """``torch.Event`` / ``torch.Stream`` answered by ``module``'s Event and Stream (the
    simulator's device module, or ``torch.cuda``): one device in a run. The answers are
    classes whose construction returns the backend's object, not plain functions, so a
    module first imported inside a run that evaluates ``torch.Stream | None`` at import
    (vLLM 0.34.0's ``eplb_utils``) still imports."""
    import torch

    class GenericEvent:
        """``torch.Event(device, ...)``, the device-generic event."""

        def __new__(cls, device: Any = None, *, enable_timing: bool = False,
                    blocking: bool = False, interprocess: bool = False) -> Any:
            return module.Event(enable_timing=enable_timing, blocking=blocking,
                                interprocess=interprocess)

    class GenericStream:
        """``torch.Stream(device, priority)``, the device-generic stream."""

        def __new__(cls, device: Any = None, priority: int = 0, **_: Any) -> Any:
            return module.Stream(priority=priority)

    return [(torch, "Event", GenericEvent), (torch, "Stream", GenericStream)]
