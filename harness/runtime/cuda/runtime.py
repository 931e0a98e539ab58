"""The CUDA runtime's lifecycle: ``cuda_runtime(trace=True)`` yields a ``CudaRuntime``.

``impl/`` code runs on it unchanged (``rt.device`` is a real ``cuda`` device, ``rt.module``
is ``torch.cuda``). A run is a run context of its own (``seams.context``): its pinned
registry, its host recorder and -- when traced -- its capture, with the dispatch mode on
and the API wrappers (installed once per process) logging into it. ``trace=False``
installs nothing (no mode, no logging): repro-rate measurements run at full speed, with
only the stall and the labels. Runtimes nest (a reference run inside a trial): the outer
capture pauses while an inner runtime is open.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional

import torch

from seams.context import current, field_set, opened
from harness.runtime import BackendError, Runtime
from harness.runtime.pinning import CudaPinning, needs_cuda_pinning
from harness.runtime.trace import STALL_OP, OpKind, Trace, user_frame
from harness.runtime.watchdog import watchdog
from harness.runtime.cuda import calibration
from harness.runtime.cuda.api import ensure_api_wrapped
from harness.runtime.cuda.capture import Capture, handle_of
from harness.runtime.cuda.dispatch import CaptureMode
from harness.runtime.device_names import answered, generic_names


def mapped_view(host: torch.Tensor, device, capture=None) -> torch.Tensor:
    """A CUDA tensor over ``host``'s pinned memory, zero-copy through
    ``__cuda_array_interface__`` (what vLLM's ``get_cuda_view_from_cpu_tensor`` op does in
    C++): kernels that take it read and write the host memory when they execute. With a
    ``capture`` (a traced run) its accesses are recorded as the pinned buffer's."""
    if not host.is_pinned():  # a device view of pageable memory would fault
        raise ValueError("a UVA view needs pinned host memory (pin_memory=True)")
    with torch._C.DisableTorchFunctionSubclass():
        ptr, shape = host.data_ptr(), tuple(host.shape)
        strides = tuple(x * host.element_size() for x in host.stride())
        typestr = torch.empty(0, dtype=host.dtype).numpy().dtype.str

    class _Mapped:
        __cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                    "data": (ptr, False), "strides": strides, "version": 2}

    view = torch.as_tensor(_Mapped(), device=device)
    if capture is not None:
        capture.ptr_sid[view.untyped_storage().data_ptr()] = Runtime.pinned_sid(host)
    return view


def _raw_stream_fn(index: int) -> Callable[[], int]:
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return lambda: raw(index)
    return lambda: torch.cuda.current_stream(index).cuda_stream


class CudaRuntime(Runtime):
    backend = "cuda"
    _dev_type = "cuda"  # whose tensors are device memory (the CPU tests swap in "cpu")

    def __init__(self, trace: bool = True) -> None:
        index = torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        self.trace = Trace()
        self.tracing = trace
        default = torch.cuda.default_stream(self.device).cuda_stream
        self._cap = Capture(self.trace, _raw_stream_fn(index), default_handle=default,
                            dev_type=self._dev_type)
        self._cycles_per_ms: Optional[float] = None

    # --- streams ---------------------------------------------------------------------
    def label(self, stream, name: str) -> None:
        self._cap.stream_id(handle_of(stream), name)

    def stream_id(self, stream=None) -> int:
        """The trace id of ``stream`` (None: the current stream)."""
        return self._cap.stream_of(stream)

    # --- stalls ----------------------------------------------------------------------
    def calibrate(self, force: bool = False) -> float:
        self._cycles_per_ms = calibration.calibrate(force)
        return self._cycles_per_ms

    @property
    def cycles_per_ms(self) -> float:
        if self._cycles_per_ms is None:
            self.calibrate()
        return self._cycles_per_ms  # type: ignore[return-value]

    def stall(self, ms: Optional[float] = None) -> None:
        """Hold the *current* stream busy for ``ms`` (None: ``DEFAULT_STALL_MS``), capped
        at ``MAX_STALL_MS``; logged as a stall op when tracing."""
        cycles = calibration.stall_cycles(ms, self.cycles_per_ms)
        if cycles > 0:
            torch.cuda._sleep(cycles)
        if self.tracing:
            cap = self._cap
            cap.op(cap.cur(), STALL_OP, [], [], user_frame(2), kind=OpKind.STALL,
                   duration=calibration.clamp_ms(ms) * 1000.0)

    def uva_view(self, host: torch.Tensor) -> torch.Tensor:
        """Pinned memory is mapped into the device's address space under UVA, at the same
        address (``mapped_view``); the capture knows its storage as the pinned buffer's
        (``Runtime.uva_view``)."""
        return mapped_view(host, self.device, self._cap)

    def loaded(self, load):
        from harness.runtime.cuda.load import cuda_load
        return cuda_load(load)

    watchdog = staticmethod(watchdog)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


@contextlib.contextmanager
def capturing(cap: Capture) -> Iterator[Capture]:
    """Make ``cap`` the capture the API wrappers log into, for the block (tests drive a
    capture without a runtime)."""
    with field_set("cuda_capture", cap):
        yield cap


@contextlib.contextmanager
def cuda_runtime(trace: bool = True) -> Iterator[CudaRuntime]:
    """The CUDA backend for one run; ``trace=False`` installs no capture at all.

    Runtimes nest (a reference run inside a trial): while an inner one is open, the outer
    capture records nothing; its pinned-memory registry and host recorder come back with
    its run context on exit.
    """
    if not torch.cuda.is_available():
        raise BackendError("--backend cuda: no CUDA device is available on this machine")
    rt = CudaRuntime(trace)
    rt.calibrate()
    outer = current().cuda_capture
    if outer is not None:
        outer.depth += 1  # pause the outer run's capture (mode and wrappers pass through)
    # A process that opened the simulator must ask CUDA about pinned memory explicitly.
    pinning = CudaPinning() if needs_cuda_pinning() else contextlib.nullcontext()
    try:
        if not trace:
            with opened(recorder=None), torch.no_grad(), pinning:
                yield rt
            return
        cap = rt._cap
        ensure_api_wrapped(torch.cuda.Stream, torch.cuda.Event, torch.cuda,
                           getattr(torch.cuda, "CUDAGraph", None))
        # torch.Event / torch.Stream (vLLM's names) answered by torch.cuda's classes,
        # whose API the capture wraps
        with opened(cuda_capture=cap, recorder=cap.note_host_access), torch.no_grad(), \
                pinning, answered(generic_names(torch.cuda)), CaptureMode(cap):
            yield rt
    finally:
        if outer is not None:
            outer.depth -= 1
