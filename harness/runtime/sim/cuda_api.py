"""``torch.cuda``'s stream and event API, answered by the simulator inside a session.

sglang asks ``torch.get_device_module(device)`` for its streams and events, which the
``sim`` device module answers. Other servers (vLLM) call ``torch.cuda.Stream()``,
``torch.cuda.Event(blocking=True)``, ``with torch.cuda.stream(s):``,
``torch.cuda.current_stream()`` and the device-generic ``torch.Event()`` by name. Inside a
simulator session those names are the simulator's: there is one device in a session, and
a real CUDA stream made there would escape the schedule (on a GPU machine) or raise (on a
CPU one). The names are put back when the session closes (``device_names``), so nothing
outside a session ever sees them; a traced CUDA run answers the device-generic two with
``torch.cuda``'s own classes the same way. Only stream/event names are covered:
``torch.cuda.is_available()`` and device properties stay torch's, so code that branches on
the hardware sees the machine it runs on.
"""
from __future__ import annotations

import contextlib
from typing import Any, List, Tuple

import torch

from harness.runtime.device_names import answered, generic_names


def _names(module: Any) -> List[Tuple[Any, str, Any]]:
    """(owner, attribute, simulator's answer) for every name this module covers."""
    return [
        (torch.cuda, "Stream", module.Stream),
        (torch.cuda, "Event", module.Event),
        (torch.cuda, "StreamContext", module.StreamContext),
        (torch.cuda, "stream", module.stream),
        (torch.cuda, "current_stream", module.current_stream),
        (torch.cuda, "default_stream", module.default_stream),
        (torch.cuda, "set_stream", module.set_stream),
        (torch.cuda, "synchronize", module.synchronize),
        *generic_names(module),
    ]


def answered_by_simulator(module: Any) -> "contextlib.AbstractContextManager[None]":
    """Within the block, the CUDA stream/event names are ``module``'s -- the simulator's
    device module (``device_names.answered``: nests, puts back what it found)."""
    return answered(_names(module))
