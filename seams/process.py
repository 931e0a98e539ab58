"""Every permanent change specrace makes to its own process, in one list, each with why.

They are made at first use, once (each site is idempotent), and never undone: a
process that ran a simulator trial or loaded the sglang target stays changed. Each site
calls ``note(name)`` when it makes its change, so ``applied()`` says which of them this
process has (reports and ``specrace list`` can show it; a test holds every site to the
list). Nothing else in the tree may change the process for good.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Tuple

# name -> (where, what and why)
CHANGES: Dict[str, Tuple[str, str]] = {
    "sim-device": (
        "harness/runtime/sim/__init__.py: install",
        "torch's PrivateUse1 backend renamed to `sim` and `torch.sim` registered as its "
        "device module: `torch.device('sim')` must parse and "
        "`torch.get_device_module('sim')` give the simulator's streams and events, so "
        "impl/ and sglang run on it unchanged; `torch.get_device_module`'s memo dropped "
        "then, so that an answer for the default device given before `sim` existed "
        "(`torch.cpu`) does not stand for the process"),
    "gc-phase-callback": (
        "harness/runtime/sim/__init__.py: install (allocator.watch_collector)",
        "a callback in `gc.callbacks` that notes when the cyclic collector runs: a "
        "storage the collector frees is not handed to the next allocation, since when "
        "the collector runs is not a property of the program under test"),
    "torch.tensor-pinning": (
        "harness/runtime/pinning.py: install_sim_tensor_factory",
        "`torch.tensor` wrapped: `torch.tensor(..., pin_memory=True)` asks a CUDA-capable "
        "build for pinned memory, which a CPU-only torch refuses; under the simulator "
        "the tensor is made and then pinned the simulator's way"),
    "cuda-api-wrapped": (
        "harness/runtime/cuda/api.py: ensure_api_wrapped",
        "the stream/event/graph methods of torch.cuda wrapped (once): the CUDA backend's "
        "trace must see every record, wait, sync and capture the code under test makes, "
        "and these are C++ methods a dispatch mode does not reach"),
    "sglang-stand-ins": (
        "targets/sglang/boundary/bootstrap.py: install_stand_ins",
        "an import finder at the front of `sys.meta_path` for absent GPU-only packages "
        "(triton, sgl_kernel, ...): sglang imports them at module level, and the code "
        "under test never calls them on the paths the target drives"),
    "sglang-env-defaults": (
        "targets/sglang/boundary/bootstrap.py: load; targets/sglang/__init__.py: load",
        "`SGLANG_IS_IN_CI=0` and, without CUDA, `SGLANG_PLATFORM` = specrace's platform "
        "plugin (setdefault: a value the user set wins): quiet CPU defaults, and pinned "
        "staging as on a GPU when the simulator stands for one"),
    "sglang-gpu-paths": (
        "targets/sglang/boundary/upstream.py: take_gpu_paths",
        "`overlap_utils._is_cuda = True`: the FutureMap's private D2H stream, pinned "
        "mirror and confidence ring exist only on CUDA, and the simulator stands for "
        "that GPU (set once, after the contract checked the attribute exists)"),
    "sglang-kernel-seams": (
        "targets/sglang/slices/eagle_launch.py: install (and eagle_fused.py: install); "
        "targets/sglang/engine/kv_lifecycle.py: install",
        "upstream modules' module-level names of Triton kernel launchers (EAGLE's tree "
        "build and verify, the fused chain-tree / commit / draft-extend kernels of the "
        "GPU path, the KV-column write `assign_req_to_token_pool_func`, ...) bound "
        "to specrace's declared ops of the same effect: a Triton kernel has no simulator "
        "path, and on CUDA its reads and writes would be outside the happens-before trace; "
        "torch.compile'd plain-torch functions (the draft's later top-k, the repetition "
        "penalty's `apply_scaling_penalties`: engine/worker.py penalties_run_eagerly) bound "
        "to their eager originals, as inductor has no simulator backend"),
    "vllm-env-defaults": (
        "targets/vllm/boundary/platform.py: set_env_defaults",
        "vLLM's environment for a one-machine offline run (gloo on loopback, no usage "
        "statistics, the engine core in this process, errors-only logging; setdefault: "
        "a value the user set wins), set before vLLM is imported"),
    "vllm-platform": (
        "targets/vllm/boundary/platform.py: base_platform_first, as_gpu",
        "vLLM's `current_platform` is its base UnspecifiedPlatform on both backends (set "
        "before vLLM resolves CudaPlatform on a GPU: that one needs compiled extensions a "
        "python-only install lacks) and answers device type `sim` or `cuda`, pinned "
        "memory available and 0 bytes in use"),
    "vllm-numba-placeholder": (
        "targets/vllm/engine/absent.py: install",
        "`sys.modules['numba']` = a placeholder, only where numba is absent: vLLM 0.13.0 / "
        "0.14.0's V1 runner imports the n-gram proposer, which imports numba at module "
        "level; the target never builds that proposer, and the placeholder's functions "
        "raise if anything calls them"),
}

_APPLIED: List[str] = []


def note(name: str) -> None:
    """Record that the change ``name`` (a key of ``CHANGES``) is now in effect."""
    if name not in CHANGES:
        raise KeyError(f"unlisted process change {name!r}: add it to seams.process")
    if name not in _APPLIED:
        _APPLIED.append(name)


def applied() -> List[str]:
    """The changes in effect in this process, in the order they were made."""
    return list(_APPLIED)


@contextlib.contextmanager
def changed_for_the_block(get: Callable[[], Any], set_: Callable[[Any], Any],
                          value: Any) -> Iterator[None]:
    """A process-wide setting (torch's intra-op threads, the profile hook) at ``value`` for
    the block, and what ``get()`` read before it set back however the block ends: a
    change that does not outlast its block, so none of ``CHANGES``."""
    before = get()
    set_(value)
    try:
        yield
    finally:
        set_(before)
