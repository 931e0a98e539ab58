"""What upstream's decode graph runner needs of the machine to capture on the simulator,
for the length of ``ModelRunner.init_cuda_graphs`` only (restored after; a CUDA device
needs none of it: its platform is sglang's own CUDA one).

* the platform: specrace's simulator platform (``boundary/platform.py``) is an
  out-of-tree platform whose capabilities default to "no graph capture"; here it answers
  as ``CudaSRTPlatform`` does -- graphs captured (its ``capabilities.graph_capture`` from
  0.5.22, its ``support_cuda_graph()`` before), upstream's ``DecodeCudaGraphRunner`` the
  runner class, the device's memory read for the capture's log line;
* ``torch.cuda.CUDAGraph``: the full-graph backend constructs its graphs from
  ``torch.cuda`` by name (everything else it asks of ``device_module``): on the
  simulator that name is the simulator's ``CUDAGraph`` while it captures.

The replays need neither: a graph replays through its own object.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator

import torch

SIM_MEMORY = 80 << 30  # the capture's log line reads the device's size; any value does


def as_a_new_process() -> None:
    """Forget what upstream keeps for the life of a process between graph runners, as a
    server's new process starts without it: the input-buffer pool that
    ``share_input_buffer`` coalesces every runner's static inputs into, and
    ``GraphSharedOutput``'s logits buffer (0.5.18 on). A server builds its runners once
    per process; specrace builds an engine per run, and a run must not depend on the runs
    its process made before (it did: a report recorded after another run replayed with
    another trace, the reused buffers skipping allocations and holding the last run's
    values). Called once per engine, before its first runner: the runners of one engine
    share these as a server's do."""
    try:
        from sglang.srt.model_executor import input_buffers
        input_buffers._forward_input_buffer_pool.clear()
    except (ImportError, AttributeError):
        pass  # a release before the pool
    try:
        from sglang.srt.model_executor.graph_shared_output import GraphSharedOutput
        GraphSharedOutput._process_shared = None
    except ImportError:
        pass  # a release before the shared output (0.5.14-0.5.17)


@contextlib.contextmanager
def capturing_on(device) -> Iterator[None]:
    mod = torch.get_device_module(torch.device(device))
    if mod is torch.cuda:
        yield
        return
    import sglang.srt.platforms as platforms
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
        DecodeCudaGraphRunner)
    platform = platforms.current_platform
    saved = [(torch.cuda, "CUDAGraph", torch.cuda.CUDAGraph), (gc, "collect", gc.collect)] + [
        (platform, name, vars(platform).get(name)) for name in _PLATFORM]
    torch.cuda.CUDAGraph = mod.CUDAGraph
    gc.collect = _young_collect
    if hasattr(platform, "capabilities"):  # the platform's answers as one struct (0.5.22)
        from sglang.srt.platforms.interface import PlatformCapabilities
        platform.capabilities = PlatformCapabilities(
            **{**_fields(platform.capabilities), "graph_capture": True})
    else:  # one method per answer (before 0.5.22)
        platform.support_cuda_graph = lambda: True
    platform.get_graph_runner_cls = lambda: DecodeCudaGraphRunner
    platform.get_device_total_memory = lambda gpu_id=0: SIM_MEMORY
    platform.get_current_memory_usage = lambda *a, **kw: 0
    try:
        yield
    finally:
        for owner, name, value in saved:
            if value is None and owner is platform:
                vars(platform).pop(name, None)  # back to the class's
            else:
                setattr(owner, name, value)


def _young_collect(generation: int = 2, _collect=gc.collect) -> int:
    """Upstream's capture collects the whole heap before and after (``freeze_gc``: once
    per server process); specrace captures once per engine, in a process holding torch,
    sglang and every earlier run's imports, where a full collection took 0.4-0.7 s -- half
    of a capture on the simulator, 130 s of the sglang state machine's 300 s. Collected
    young only, what this engine made goes as before; what a trace records does not
    change, as no collection's free enters one (the simulator counts a storage the
    collector frees as leaked: ``harness/runtime/sim/allocator.py``)."""
    return _collect(min(generation, 1))


_PLATFORM = ("capabilities", "support_cuda_graph", "get_graph_runner_cls",
             "get_device_total_memory", "get_current_memory_usage")


def _fields(struct) -> dict:
    return {name: getattr(struct, name) for name in struct.__struct_fields__}
