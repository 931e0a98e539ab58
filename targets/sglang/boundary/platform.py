"""specrace's simulator as an sglang hardware platform (sglang's own plugin entry point).

sglang asks its platform, not torch, whether host staging may be pinned
(``current_platform.is_pin_memory_available``). The generic platform answers no on a
machine without a GPU, and then ``async_d2h`` becomes a blocking ``.to("cpu")`` and
``filter_batch`` stages its keep indices in pageable memory: the overlap collapses and
the seed's race cannot happen (measured: 0 races, 0 stale). This platform answers as
``CudaSRTPlatform`` does, so upstream takes its GPU code paths on the ``sim`` device.

Registered in ``pyproject.toml`` under ``[project.entry-points."sglang.srt.platforms"]``
as ``specrace_sim``. ``activate()`` selects it when asked for by name
(``SGLANG_PLATFORM=specrace_sim``, which the sglang target sets for simulator runs) or
when no GPU is present; on a GPU machine sglang's own CUDA platform stays in charge.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional
from seams.vocab import Platform

PLUGIN_NAME = "specrace_sim"
QUALNAME = "targets.sglang.boundary.platform.SimSRTPlatform"


def activate() -> Optional[str]:
    import torch
    if os.environ.get("SGLANG_PLATFORM") == PLUGIN_NAME or not torch.cuda.is_available():
        return QUALNAME
    return None


# The module flags sglang computes from the machine at import (``_is_cuda = is_cuda()``
# and its kin) and reads at call time to choose a GPU kernel or its torch fallback.
HOST_FLAGS = ("_is_cuda", "_is_hip", "_is_musa", "_is_xpu", "_is_npu", "_is_cpu")
# ... except the one the harness sets on purpose (``upstream.take_gpu_paths``)
KEPT_FLAGS = {("sglang.srt.managers.overlap_utils", "_is_cuda")}
# The names sglang's modules bind to ask whether a JIT GPU kernel compiles on this machine
# (``can_use_store_cache``: the KV write's store_cache, registered for CUDA alone). On a
# machine without a GPU the compile fails and upstream writes the KV with torch; on a GPU
# machine it succeeds, and the kernel then meets the simulator's tensors (measured on an
# H100: "Could not run 'sglang::store_cache' with arguments from the 'CPU' backend").
JIT_PROBES = ("can_use_store_cache",)


def _no_jit_kernel(*args, **kwargs) -> bool:
    return False


@contextlib.contextmanager
def as_without_gpu(device) -> Iterator[None]:
    """A simulator run on a machine that has a GPU sees what it sees on one without.

    sglang's platform there is CUDA's, and its modules computed their flags from the GPU
    at import: upstream would launch its Triton kernels (the draft's top-k postprocess,
    ``compute_position``) with simulator tensors -- addresses that mean nothing to the
    GPU, an illegal access that poisons the process's CUDA context for every run after
    it (measured on the H200) -- and would not consult the simulator platform's seams
    (the verify window's slots). For the run, specrace's platform is sglang's current
    one (``_current_platform`` and every loaded module's ``current_platform`` name) and
    every loaded sglang module's host flags read as on a machine without a GPU: upstream
    takes the code paths CI runs, so a simulator verdict is the same on any machine;
    likewise a JIT kernel's probe (``JIT_PROBES``) answers that it does not compile.
    Restored after the run; a module first imported during the run (the slices import
    theirs before it, but upstream imports some lazily) is given the GPU platform and
    the machine's flags, which it computed from the simulator's: a CUDA run later in
    the process must not take the simulator's paths."""
    import torch
    if str(device).split(":")[0] != "sim" or not torch.cuda.is_available():
        yield
        return
    import sys

    import sglang.srt.platforms as platforms
    gpu_platform = platforms.current_platform
    sim_platform = _platform_class()()
    before = set(sys.modules)
    saved = [(platforms, "_current_platform", platforms._current_platform)]
    platforms._current_platform = sim_platform
    for name, module in list(sys.modules.items()):
        if not name.startswith("sglang.") or module is None or module is platforms:
            continue
        values = vars(module)
        if values.get("current_platform") is gpu_platform:
            saved.append((module, "current_platform", gpu_platform))
            module.current_platform = sim_platform
        for flag in HOST_FLAGS:
            if values.get(flag) is True and (name, flag) not in KEPT_FLAGS:
                saved.append((module, flag, True))
                setattr(module, flag, False)
        for probe in JIT_PROBES:
            if callable(values.get(probe)):
                saved.append((module, probe, values[probe]))
                setattr(module, probe, _no_jit_kernel)
    try:
        yield
    finally:
        for module, attr, value in reversed(saved):
            setattr(module, attr, value)
        machine_flags = {attr for _, attr, _ in saved if attr in HOST_FLAGS}
        for name in set(sys.modules) - before:
            module = sys.modules[name]
            if not name.startswith("sglang.") or module is None:
                continue
            values = vars(module)
            if values.get("current_platform") is sim_platform:
                module.current_platform = gpu_platform
            for flag in machine_flags:
                if values.get(flag) is False:
                    setattr(module, flag, True)


def _platform_class():
    from sglang.srt.platforms.device_mixin import PlatformEnum
    from sglang.srt.platforms.interface import SRTPlatform

    class SimSRTPlatform(SRTPlatform):
        """An out-of-tree platform whose device is specrace's simulator."""

        _enum = PlatformEnum.OOT
        device_name = "sim"
        device_type = "sim"

        def is_pin_memory_available(self, device=None) -> bool:
            # As CudaSRTPlatform: pinned staging for anything headed to the device.
            return not (device is not None and str(device) == "cpu")

        def get_device(self, device_id: int = 0):
            import torch
            return torch.device("sim", device_id)

        def get_device_name(self, device_id: int = 0) -> str:
            return "specrace sim"

        def synchronize(self) -> None:
            import torch
            torch.get_device_module("sim").synchronize()

        def get_speculative_cache_locs_fn(self):
            # upstream's out-of-tree seam for the verify window's KV slots (its Triton
            # kernel on a GPU): specrace's declared stand-in
            from targets.sglang.slices.eagle_kernels import extend_cache_locs
            return extend_cache_locs

    SimSRTPlatform.__module__ = __name__
    SimSRTPlatform.__qualname__ = "SimSRTPlatform"
    return SimSRTPlatform


def __getattr__(name: str):
    # sglang loads the class by qualname; build it lazily so importing this module (the
    # entry point) never imports sglang itself.
    if name == "SimSRTPlatform":
        cls = _platform_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


PLATFORMS = tuple(p.value for p in Platform)


@contextlib.contextmanager
def as_platform(platform: str) -> Iterator[None]:
    """Upstream read as running on ``platform`` for the run: on ``rocm`` every loaded sglang
    module's ``is_cuda()`` / ``is_hip()`` (the names it imported) and ``_is_cuda`` /
    ``_is_hip`` flags answer as on a ROCm machine, so each upstream branch on the platform
    is ROCm's -- the result copy on the forward stream (``run_batch``), the WAR barrier off
    unless ``SGLANG_ENABLE_WAR_BARRIER`` (``Scheduler.run_event_loop``), the FutureMap
    without its CUDA-only private D2H stream. What only runs on that hardware and the
    driven paths reach is the simulator's, as on CUDA: there are no HIP kernels on the
    paths the target drives. Restored after the run."""
    if platform == Platform.CUDA:
        yield
        return
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; expected one of: {', '.join(PLATFORMS)}")
    import sys
    answers = {"_is_cuda": False, "_is_hip": True, "is_cuda": lambda: False,
               "is_hip": lambda: True}
    saved = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("sglang.") or module is None:
            continue
        values = vars(module)
        for attr, value in answers.items():
            if attr in values and not (callable(value) and not callable(values[attr])):
                saved.append((module, attr, values[attr]))
                setattr(module, attr, value)
    try:
        yield
    finally:
        for module, attr, value in reversed(saved):
            setattr(module, attr, value)
