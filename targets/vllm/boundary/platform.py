"""What vLLM needs of the process to run its GPU path: on specrace's simulated device, or
on a GPU from a python-only install.

On a GPU machine vLLM resolves its own ``CudaPlatform``, whose module imports the compiled
custom ops (``vllm._C``) first thing to register them. specrace's release environments
hold only the wheel's Python files, so an empty module stands in for the extension
(``compiled_ops_stand_in``): the driven path -- eager mode, a toy model with its own
attention, greedy sampling, the spec-decode kernels as torch stand-ins -- calls none of
its ops, and one that did would fail loudly (``torch.ops._C`` has no such op).

Without CUDA:

vLLM resolves its platform at import; without CUDA that is ``UnspecifiedPlatform``
(never ``CpuPlatform``: it turns async scheduling off, the very thing under test). The
simulator stands for the GPU, so four answers of that platform are set, once, for the
process (``seams.process``: "vllm-platform"):

* ``device_type`` is ``sim`` (``DeviceConfig`` builds the run's device from it);
* pinned memory is available (the simulator pins; a CPU-only torch cannot) --
  ``is_pin_memory_available`` is cached by vLLM, so its cache is cleared;
* the memory in use is 0 (the base platform raises; vLLM's memory profiler asks around
  model loading);
* seeding "every device" does nothing more (0.23.0's ``set_random_seed`` asks the
  platform, whose base raises; ``torch.manual_seed`` just before seeds the generator the
  simulated device draws from, and the runs are greedy).

And vLLM's environment defaults for a run on one machine with no network: gloo on the
loopback interface, no usage statistics, the engine core in this process, its log to critical messages only (its import logs errors about the absent Triton)
(``setdefault``: a value the user set wins).
"""
from __future__ import annotations

import glob
import os
import sys
import types

from seams import process

ENV_DEFAULTS = {"VLLM_HOST_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo",
                "VLLM_NO_USAGE_STATS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "VLLM_LOGGING_LEVEL": "CRITICAL", "VLLM_CONFIGURE_LOGGING": "1"}


def set_env_defaults() -> None:
    for name, value in ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    process.note("vllm-env-defaults")


def as_simulated_gpu() -> None:
    """``current_platform`` answers as a GPU platform whose device is the simulator's."""
    import harness.runtime.sim as sim
    from vllm.platforms import current_platform
    from vllm.utils import platform_utils
    sim.install()  # torch.device("sim") must parse before a config names it
    current_platform.device_type = "sim"
    current_platform.is_pin_memory_available = lambda: True
    current_platform.get_current_memory_usage = lambda device=None: 0.0
    current_platform.manual_seed_all = lambda seed: None  # 0.23.0 on asks
    platform_utils.is_pin_memory_available.cache_clear()
    process.note("vllm-platform")


def compiled_ops_stand_in() -> None:
    """An empty ``vllm._C`` where the installed vLLM has no compiled extension (read from
    the files: asking the import system would import vLLM, and resolve its platform)."""
    from targets import static
    root = static.package_root("vllm")
    if root and glob.glob(os.path.join(root, "_C.*")):
        return  # a full install: its own extension
    sys.modules.setdefault("vllm._C", types.ModuleType("vllm._C"))
    process.note("vllm-compiled-ops-absent")
