"""``torch.cuda``'s stream and event API, answered by the simulator inside a session.

sglang asks ``torch.get_device_module(device)`` for its streams and events, which the
``sim`` device module answers. Other servers (vLLM) call ``torch.cuda.Stream()``,
``torch.cuda.Event(blocking=True)``, ``with torch.cuda.stream(s):``,
``torch.cuda.current_stream()`` and the device-generic ``torch.Event()`` by name. Inside a
simulator session those names are the simulator's: there is one device in a session, and
a real CUDA stream made there would escape the schedule (on a GPU machine) or raise (on a
CPU one). The names are put back when the session closes, so nothing outside a session
-- the CUDA backend included -- ever sees them. Only stream/event names are covered:
``torch.cuda.is_available()`` and device properties stay torch's, so code that branches on
the hardware sees the machine it runs on.
"""
from __future__ import annotations

import contextlib
import importlib
from typing import Any, Iterator, List, Tuple

import torch

# torch modules that subclass or bind these names when first imported (``class
# Event(torch.Event)`` in dynamo's device interface, which a meta kernel's lazy import
# pulls in mid-run): imported before the first swap, so none is first imported while a
# session has the names swapped -- a class cannot subclass the simulator's factory
# function, and a binding made then would outlive the session. (Imported lazily: ~2 s of
# dynamo that every simulated run pays at its first meta kernel anyway, and a command
# that never opens a session should not.)
_BIND_AT_IMPORT = ("torch._streambase", "torch.mtia", "torch._dynamo.device_interface",
                   "torch._dynamo.variables.streams", "torch._inductor.standalone_compile")


def _names(module: Any) -> List[Tuple[Any, str, Any]]:
    """(owner, attribute, simulator's answer) for every name this module covers."""

    def generic_event(device: Any = None, *, enable_timing: bool = False,
                      blocking: bool = False, interprocess: bool = False) -> Any:
        """``torch.Event(device, ...)``, the device-generic event."""
        return module.Event(enable_timing=enable_timing, blocking=blocking,
                            interprocess=interprocess)

    def generic_stream(device: Any = None, priority: int = 0, **_: Any) -> Any:
        return module.Stream(priority=priority)

    return [
        (torch.cuda, "Stream", module.Stream),
        (torch.cuda, "Event", module.Event),
        (torch.cuda, "StreamContext", module.StreamContext),
        (torch.cuda, "stream", module.stream),
        (torch.cuda, "current_stream", module.current_stream),
        (torch.cuda, "default_stream", module.default_stream),
        (torch.cuda, "set_stream", module.set_stream),
        (torch.cuda, "synchronize", module.synchronize),
        (torch, "Event", generic_event),
        (torch, "Stream", generic_stream),
    ]


_MISSING: Any = object()


@contextlib.contextmanager
def answered_by_simulator(module: Any) -> Iterator[None]:
    """Within the block, the CUDA stream/event names are ``module``'s -- the simulator's
    device module (nests: each block puts back what it found)."""
    for name in _BIND_AT_IMPORT:
        importlib.import_module(name)  # (a dict lookup once imported)
    names = _names(module)
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
