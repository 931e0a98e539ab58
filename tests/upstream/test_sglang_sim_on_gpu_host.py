"""A simulator run on a machine with a GPU (``targets/sglang/platform.as_without_gpu``):
upstream sees the flags and platform it sees on a machine without one, for the run only
-- otherwise it launches its Triton kernels with simulator tensors (an illegal access
that poisons the real GPU's context; measured on the H200). Here the GPU is pretended:
the machine's flags are set as a GPU machine's import would have set them."""
import sys
import types

import pytest
import torch

import targets
from targets.sglang.platform import as_without_gpu


@pytest.fixture(scope="module", autouse=True)
def sglang():
    targets.get("sglang")


@pytest.fixture
def gpu_host(monkeypatch):
    """A loaded sglang module with GPU flags, a platform that supports Triton, and a
    torch that says it has CUDA."""
    import msgspec
    from sglang.srt.platforms import current_platform
    module = types.ModuleType("sglang.specrace_probe")
    module._is_cuda, module._is_hip, module._is_cpu = True, False, False
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(current_platform, "capabilities", msgspec.structs.replace(
        current_platform.capabilities, supports_triton=True))
    return module, current_platform


def test_a_sim_run_sees_no_gpu_and_the_flags_come_back(gpu_host):
    module, platform = gpu_host
    from sglang.srt.managers import overlap_utils
    from sglang.srt.utils.common import support_triton
    assert support_triton("triton")
    with as_without_gpu("sim"):
        assert module._is_cuda is False
        assert not support_triton("triton")  # compute_position takes its torch path
        assert overlap_utils._is_cuda is True  # the harness's own choice stays
    assert module._is_cuda is True and platform.capabilities.supports_triton


def test_a_cuda_run_keeps_the_machines_flags(gpu_host):
    module, platform = gpu_host
    with as_without_gpu("cuda:0"):  # a CUDA run: nothing to mask
        assert module._is_cuda is True and platform.capabilities.supports_triton
