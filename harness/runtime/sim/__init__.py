"""The ``sim`` device: a deterministic asynchronous device on the CPU.

``install()`` (idempotent) renames torch's PrivateUse1 backend to ``sim`` and registers
``torch.sim`` as its device module, so ``torch.device("sim")`` parses and
``torch.get_device_module("sim")`` returns the stream/event API below -- the same calls
server code makes on ``torch.cuda``. ``session(policy)`` gives a fresh device, with the
dispatch mode active, for one run.
"""
from __future__ import annotations

import contextlib
import gc
import sys
import types
from typing import Iterator, Optional

import torch

from seams.context import current, opened
from harness.runtime.policy import Policy
from harness.runtime.sim import allocator as _allocator
from harness.runtime.sim import cuda_api as _cuda_api
from harness.runtime.sim import graphs as _graphs
from harness.runtime.sim import dispatch as _dispatch
from harness.runtime.sim import tensor as _tensor
from harness.runtime.sim.device import SimDevice, SimDeviceError
from harness.runtime.sim.streams import Event, Stream, current_device

__all__ = ["install", "session", "module", "SimDevice", "SimDeviceError", "Stream", "Event"]

_INSTALLED = False


def _gpu_outside_a_session():
    """``torch.cuda`` where no simulator session is open on a machine with a GPU, else
    None. Once ``sim`` is registered torch names it the accelerator, so device-less
    calls (``torch.get_device_module().current_stream()``: upstream's
    ``get_current_device_stream_fast`` in its graph capture) reach this module during a
    CUDA run too; they mean the GPU there (measured on an H100: a CUDA run after a
    simulator run in one process captured nothing)."""
    if current().sim_device is None and torch.cuda.is_available():
        return torch.cuda
    return None


def _current_stream(device=None) -> Stream:
    gpu = _gpu_outside_a_session()
    if gpu is not None:
        return gpu.current_stream(device)
    return current_device().current


def _default_stream(device=None) -> Stream:
    gpu = _gpu_outside_a_session()
    if gpu is not None:
        return gpu.default_stream(device)
    return current_device().default_stream


def _set_stream(stream: Stream) -> None:
    stream._mine("set_stream")
    current_device().current = stream


class _StreamContext:
    """``with torch.sim.stream(s):`` -- make ``s`` current for the block."""

    def __init__(self, stream: Optional[Stream]) -> None:
        self.stream = stream
        self.prev: Optional[Stream] = None

    def __enter__(self) -> Optional[Stream]:
        if self.stream is not None:
            self.stream._mine("stream context")
            dev = current_device()
            self.prev = dev.current
            dev.current = self.stream
        return self.stream

    def __exit__(self, *exc) -> None:
        if self.stream is not None:
            current_device().current = self.prev


def _synchronize(device=None) -> None:
    gpu = _gpu_outside_a_session()
    if gpu is not None:
        return gpu.synchronize(device)
    current_device().synchronize_all()


def _empty_cache() -> None:
    current_device().allocator.empty_cache()


def _make_module() -> types.ModuleType:
    m = types.ModuleType("torch.sim")
    m.__doc__ = "specrace's simulated asynchronous device (stream/event API as torch.cuda)."
    m.Stream = Stream
    m.Event = Event
    m.StreamContext = _StreamContext
    m.stream = _StreamContext
    m.current_stream = _current_stream
    m.default_stream = _default_stream
    m.set_stream = _set_stream
    m.synchronize = _synchronize
    m.empty_cache = _empty_cache
    m.is_available = lambda: True
    m.is_initialized = lambda: True
    m._lazy_init = lambda: None
    m._is_in_bad_fork = lambda: False
    m.device_count = lambda: 1
    m.current_device = lambda: 0
    m.set_device = lambda d: None
    m.get_device_name = lambda d=None: "specrace sim"
    m.manual_seed = lambda seed: None
    m.manual_seed_all = lambda seed: None
    m.get_rng_state = lambda device=None: torch.empty(0, dtype=torch.uint8)
    m.set_rng_state = lambda state, device=None: None
    m.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16]
    m.SimDeviceError = SimDeviceError
    # CUDA graphs, under torch.cuda's names (sim/graphs.py)
    m.CUDAGraph = _graphs.CUDAGraph
    m.graph = _graphs.graph
    m.graph_pool_handle = _graphs.graph_pool_handle
    m.is_current_stream_capturing = _graphs.is_current_stream_capturing
    return m


module = _make_module()


def install() -> None:
    """Make ``sim`` a torch device (once per process)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend
    # rename, generate Tensor.sim()/is_sim, register the module, the hooks and the device
    # guard -- in the order torch needs them.
    _setup_privateuseone_for_python_backend(rename="sim", backend_module=module)
    sys.modules.setdefault("torch.sim", module)
    # ``torch.get_device_module`` memoizes its answers: one for the default device asked
    # before ``sim`` existed (a module that runs ``get_device_module()`` at import, e.g.
    # sglang 0.5.21's ``mem_cache/l2_transfer.py``) would answer ``torch.cpu`` for the
    # life of the process, where the accelerator is now ``sim`` (upstream's
    # ``get_current_device_stream_fast`` then hands its graph capture a CPU stream)
    torch.get_device_module.cache_clear()
    _tensor.SIM = torch.device("sim", 0)
    _tensor.BACKEND = _dispatch.BACKEND
    from harness.runtime import pinning
    pinning.install_sim_tensor_factory(lambda: current().sim_device is not None)
    from seams import process
    process.note("sim-device")
    _allocator.watch_collector()
    process.note("gc-phase-callback")
    _INSTALLED = True


@contextlib.contextmanager
def _dynamo_off() -> Iterator[None]:
    """Compiled code runs eagerly on the simulator, op by op through its handler: dynamo
    tracing into the dispatch handler only graph-breaks and recompiles (e.g. upstream's
    ``@torch.compile`` debug asserts). Only if dynamo is loaded at all (it is heavy)."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        yield
        return
    # set and restored by hand: ``config.patch`` makes a class per call, a small
    # reference cycle per session
    config = dynamo.config
    before = config.disable
    config.disable = True
    try:
        yield
    finally:
        config.disable = before


@contextlib.contextmanager
def session(policy: Optional[Policy] = None) -> Iterator[SimDevice]:
    """A fresh simulated device with ``policy``, the dispatch mode on, autograd off, and
    ``torch.cuda``'s stream/event names answered by the simulator (``cuda_api``).

    Sessions nest (a reference run inside a running trial): each is a run context of its
    own (``seams.context``), so the outer device, its pinned memory registry and its
    host-access recorder come back on exit.
    """
    install()
    with opened() as ctx, _gc_frozen():
        dev = ctx.sim_device = SimDevice(policy)
        ctx.recorder = dev.note_host_access
        try:
            with torch.no_grad(), _dynamo_off(), _cuda_api.answered_by_simulator(module), \
                    _dispatch.SimMode():
                yield dev
        finally:
            dev.allocator.close()


@contextlib.contextmanager
def _gc_frozen() -> Iterator[None]:
    """The objects that exist when a session opens (torch's, the test's) set aside from
    the cyclic collector until it closes (``gc.freeze``). A session makes many records
    that live as long as its trace; once enough have piled up, Python runs a full
    collection, which walks every object in the process -- an eighth of ``bench engine``'s
    wall time went to three of them. Frozen, a full collection walks the session's own
    objects. Only *when* the collector runs changes, never what it finds of the session's
    (and what it finds is never reused: ``allocator.py``).

    Objects frozen here go back to the oldest generation uncounted, so a dead cycle that
    the next session freezes may wait long for a full collection: the session's own state
    therefore holds none (streams and the allocator hold their device weakly), and is
    freed by reference counting once its last holder lets go.

    For the same reason the youngest generation is collected every ``_SESSION_GEN0``
    allocations instead of Python's 700: nearly all a session allocates is records that
    outlive it, which each young collection walks again on their way to the old
    generation (0.06-0.07 of the wrapper floor per op in ``bench runtime``)."""
    global _FROZEN_DEPTH
    # An outer session froze them already: nothing to do -- and no gc.get_freeze_count(),
    # which counts the frozen objects one by one (a nested session per reference run made
    # it most of the test suite's time). At the outermost session the count is of the
    # program's own freeze, if any, which a session leaves alone.
    if _FROZEN_DEPTH or gc.get_freeze_count():
        _FROZEN_DEPTH += 1
        try:
            yield
        finally:
            _FROZEN_DEPTH -= 1
        return
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], _SESSION_GEN0), *thresholds[1:])
    _FROZEN_DEPTH = 1
    try:
        yield
    finally:
        _FROZEN_DEPTH = 0
        gc.set_threshold(*thresholds)
        gc.unfreeze()


_FROZEN_DEPTH = 0  # sessions open inside the one that froze the older objects
_SESSION_GEN0 = 100_000  # a session's young-generation threshold (a few MB of objects)
