"""Host staging memory: pinned when the data is headed for (or coming from) an
accelerator, so ``non_blocking`` copies are really asynchronous; ordinary memory when the
device is the CPU itself, where torch cannot pin (``is_pin_memory_available()``)."""
from __future__ import annotations

import torch


def pin_for(device) -> bool:
    return torch.device(device).type != "cpu"


def staged(t: torch.Tensor, device) -> torch.Tensor:
    """``t`` in host memory suitable for an async copy to ``device``."""
    return t.pin_memory() if pin_for(device) else t


def host_empty(shape, dtype, device) -> torch.Tensor:
    """An uninitialised host buffer to receive an async copy from ``device``."""
    return torch.empty(shape, dtype=dtype, pin_memory=pin_for(device))


def mark_used_on(t, stream) -> None:
    """``t`` was allocated on another stream and is used on ``stream``: tell the caching
    allocator, so that once the host drops ``t`` its block is not handed to the next
    allocation on its own stream before ``stream`` has passed this use."""
    if t is not None and t.device.type != "cpu":  # CPU tensors have no stream
        t.record_stream(stream)
