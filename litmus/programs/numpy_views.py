"""Pinned memory through numpy views, and streams named through ``torch.cuda``: how vLLM
writes the same programs as the ``host_sync`` family.

vLLM takes a numpy view of each pinned staging buffer once, at construction
(``CpuGpuBuffer.np``, ``InputBatch``'s ``*_cpu`` arrays), and reads and writes that array
every step; it names its streams and events ``torch.cuda.Stream()`` / ``torch.cuda.Event()``
/ ``torch.Event()`` instead of asking ``torch.get_device_module``. The ordering rules are
the host_sync family's: a host read of pinned memory a non_blocking D2H fills must wait for
the copy's event, and a pinned source must not be rewritten while its H2D is queued. Here
the read and the write go through a numpy view taken *before* the copy, which torch never
sees -- the programs show the simulator and the detector see it anyway.
"""
from __future__ import annotations

from functools import partial
from typing import List

import torch

from .common import _CLEAN, Litmus, _pinned_zeros, _racy, _stall, overlap_streams
from .host_sync import _d2h


def _view_refill(rt, stall: bool, fence: bool) -> bool:
    """The host rewrites a pinned input buffer through its numpy view while (or after)
    the previous step's H2D from it is queued -- #24527 / #25279's shape."""
    m, S, F = overlap_streams(rt)
    staging = _pinned_zeros(4)
    view = staging.numpy()
    view[:] = [1, 2, 3, 4]  # step 1's inputs, written on the host
    dev = torch.zeros(4, dtype=torch.int32, device=rt.device)
    m.synchronize()
    with m.stream(F):
        _stall(rt, stall)
        dev.copy_(staging, non_blocking=True)  # reads the pinned buffer when it executes
        uploaded = m.Event()
        uploaded.record()
    if fence:
        uploaded.synchronize()  # vLLM's prepare_inputs_event fence
    view[:4] = 9  # step 2's inputs into the same buffer
    with m.stream(F):
        got = dev.tolist()
    m.synchronize()
    return got != [1, 2, 3, 4]


def _cuda_named(rt, stall: bool, wait: bool) -> bool:
    """Message passing written against ``torch.cuda`` / ``torch.Event`` by name, as vLLM
    writes it: on the simulator these names must be the simulated device's."""
    main = torch.cuda.current_stream()
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    rt.label(consumer, "schedule")
    rt.label(producer, "forward")
    x = torch.zeros(4, dtype=torch.int32, device=rt.device)
    main.synchronize()
    with torch.cuda.stream(producer):
        _stall(rt, stall)
        x.add_(5)
        ready = torch.Event()
        ready.record()
    with torch.cuda.stream(consumer):
        if wait:
            torch.cuda.current_stream().wait_event(ready)
        got = x.tolist()
    torch.cuda.synchronize()
    return got != [5, 5, 5, 5]


NUMPY_VIEWS: List[Litmus] = [
    Litmus("pinned_view_read_before_event", "non_blocking D2H into pinned memory, read "
           "through a numpy view taken at construction before the copy's event",
           partial(_d2h, how="none", via_view=True), race=True, stale=_racy()),
    Litmus("pinned_view_read_after_event", "non_blocking D2H into pinned memory, read "
           "through the numpy view after event.synchronize()",
           partial(_d2h, how="event.synchronize", via_view=True), race=False,
           stale=dict(_CLEAN)),
    Litmus("pinned_view_write_while_upload_queued", "the host rewrites a pinned input "
           "buffer through its numpy view while the H2D from it is queued",
           partial(_view_refill, fence=False), race=True, stale=_racy()),
    Litmus("pinned_view_write_after_fence", "the host rewrites a pinned input buffer "
           "through its numpy view after the upload's event.synchronize()",
           partial(_view_refill, fence=True), race=False, stale=dict(_CLEAN)),
    Litmus("cuda_named_nosync", "torch.cuda.Stream()s by name: one writes, the other "
           "reads with nothing between", partial(_cuda_named, wait=False), race=True,
           stale=_racy()),
    Litmus("cuda_named_wait_event", "torch.cuda.Stream()s by name, ordered by a "
           "torch.Event() the reader waits for", partial(_cuda_named, wait=True),
           race=False, stale=dict(_CLEAN)),
]


def _uva_read(rt, stall: bool, fence: bool) -> bool:
    """A kernel reads pinned host memory in place through its UVA view (vLLM's
    ``UvaBuffer``: Model Runner V2's input prep) -- when the kernel executes, not when it
    is launched -- while the host rewrites the buffer through its numpy view for the next
    step (with ``fence``: after the kernel's event)."""
    m, S, F = overlap_streams(rt)
    staging = _pinned_zeros(4)
    view = staging.numpy()
    view[:] = [1, 2, 3, 4]  # this step's inputs, written on the host
    uva = rt.uva_view(staging)
    dev = torch.zeros(4, dtype=torch.int32, device=rt.device)
    m.synchronize()
    with m.stream(F):
        _stall(rt, stall)
        dev.copy_(uva * 10)  # the input-prep kernel: reads host memory as it runs
        done = m.Event()
        done.record()
    if fence:
        done.synchronize()  # the kernel has read the buffer
    view[:4] = 9  # the next step's inputs into the same buffer
    m.synchronize()
    return dev.tolist() != [10, 20, 30, 40]


UVA = [
    Litmus("uva_kernel_read_then_host_write", "a kernel reads pinned memory through its "
           "UVA view as it executes; the host rewrites the buffer through its numpy view "
           "before the kernel ran (WAR: the kernel reads the next step's inputs)",
           partial(_uva_read, fence=False), race=True, stale=_racy(lazy=True)),
    Litmus("uva_kernel_read_fenced", "the same, the host rewriting only after the "
           "kernel's event: ordered",
           partial(_uva_read, fence=True), race=False, stale=_CLEAN),
]
