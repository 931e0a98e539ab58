"""What vLLM needs of the process to run its GPU path, on specrace's simulated device or
on a GPU, from a python-only install (the release environments hold only the wheel's
Python files).

The platform is vLLM's base ``UnspecifiedPlatform`` on both backends -- what vLLM itself
resolves without CUDA (never ``CpuPlatform``: it turns async scheduling off, the very
thing under test). On a GPU machine vLLM would resolve ``CudaPlatform``, which needs the
compiled extensions at import (``vllm._C`` first thing; ``w8a8_utils`` asks
``torch.ops._C`` whether CUTLASS supports fp8; ``fa_utils`` imports flash attention's
``_vllm_fa2_C``), none of which a python-only install has; so the base platform is set
before vLLM resolves one (``as_gpu``). The driven path -- eager mode, a toy model with its
own attention, greedy sampling, the spec-decode kernels as torch stand-ins -- takes no
branch of ``CudaPlatform``'s, and the GPU runs the very code the simulator judged.

These answers of that platform are set, once, for the process (``seams.process``:
"vllm-platform"):

* ``device_type`` is ``sim`` or ``cuda`` (``DeviceConfig`` builds the run's device from
  it);
* pinned memory is available (the simulator pins; a CPU-only torch cannot) --
  ``is_pin_memory_available`` is cached by vLLM, so its cache is cleared;
* the memory in use is 0 (the base platform raises; vLLM's memory profiler asks around
  model loading, and the KV budget is fixed);
* on a GPU, the SM count is the card's (the runner sizes kernels by it);
* seeding "every device" is CUDA's on a GPU and nothing more on the simulator (0.23.0's
  ``set_random_seed`` asks the platform, whose base raises; ``torch.manual_seed`` just
  before seeds the generator the simulated device draws from, and the runs are greedy).

And vLLM's environment defaults for a run on one machine with no network: gloo on the
loopback interface, no usage statistics, the engine core in this process, its log to
critical messages only (its import logs errors about the absent Triton) (``setdefault``:
a value the user set wins).
"""
from __future__ import annotations

import os

from seams import process

ENV_DEFAULTS = {"VLLM_HOST_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo",
                "VLLM_NO_USAGE_STATS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "VLLM_LOGGING_LEVEL": "CRITICAL", "VLLM_CONFIGURE_LOGGING": "1"}


def set_env_defaults() -> None:
    for name, value in ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    process.note("vllm-env-defaults")


def base_platform_first() -> None:
    """On a GPU machine: the base platform in place before vLLM resolves its own (importing
    ``vllm.platforms`` resolves nothing; its first ``current_platform`` would)."""
    import vllm.platforms as platforms
    from vllm.platforms.interface import UnspecifiedPlatform
    if platforms._current_platform is None:
        platforms._current_platform = UnspecifiedPlatform()


def as_gpu(device_type: str) -> None:
    """``current_platform`` answers as a GPU platform whose device is ``device_type``."""
    import torch
    from vllm.platforms import current_platform
    from vllm.utils import platform_utils
    if device_type == "sim":
        import harness.runtime.sim as sim
        sim.install()  # torch.device("sim") must parse before a config names it
        current_platform.manual_seed_all = lambda seed: None  # 0.23.0 on asks
    else:
        current_platform.manual_seed_all = torch.cuda.manual_seed_all
        # the runner sizes kernels by the SM count (CudaPlatform's answer, from torch)
        current_platform.num_compute_units = (
            lambda device_id=0: torch.cuda.get_device_properties(device_id)
            .multi_processor_count)
    current_platform.device_type = device_type
    # CudaPlatform's answer (the simulator captures graphs too): a config that asks for
    # CUDA graphs keeps them (an eager one never reads this)
    current_platform.support_static_graph_mode = lambda: True
    current_platform.is_pin_memory_available = lambda: True
    current_platform.get_current_memory_usage = lambda device=None: 0.0
    platform_utils.is_pin_memory_available.cache_clear()
    process.note("vllm-platform")
