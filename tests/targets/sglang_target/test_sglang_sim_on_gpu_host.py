"""A simulator run on a machine with a GPU (``targets/sglang/platform.as_without_gpu``):
upstream sees the platform and flags it sees on a machine without one, for the run only
-- otherwise it launches its Triton kernels with simulator tensors (an illegal access
that poisons the real GPU's context) and skips the simulator platform's seams (both
measured on the H200). Here the GPU machine is pretended: a platform that is not ours
is current, and a loaded module's flags are set as a GPU machine's import sets them."""
import sys
import types

import pytest
import torch

import targets
from targets.sglang.boundary.platform import as_without_gpu


pytestmark = pytest.mark.usefixtures("sglang")


@pytest.fixture
def gpu_host(monkeypatch):
    import sglang.srt.platforms as platforms
    from sglang.srt.platforms.interface import SRTPlatform
    gpu_platform = SRTPlatform()  # in-tree: no out-of-tree seams
    module = types.ModuleType("sglang.specrace_probe")
    module._is_cuda, module._is_hip, module._is_cpu = True, False, False
    module.can_use_store_cache = lambda *a, **k: True  # the JIT kernel compiles on a GPU box
    module.current_platform = gpu_platform
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(platforms, "_current_platform", gpu_platform)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return module, gpu_platform


def test_a_sim_run_sees_no_gpu_and_all_comes_back(gpu_host):
    module, gpu_platform = gpu_host
    import sglang.srt.platforms as platforms
    from sglang.kernels.ops.speculative.cache_locs import _get_oot_speculative_cache_locs_fn
    from sglang.srt.managers import overlap_utils
    from targets.sglang.slices.eagle_kernels import extend_cache_locs
    assert _get_oot_speculative_cache_locs_fn() is None
    with as_without_gpu("sim"):
        assert module._is_cuda is False
        assert type(module.current_platform).__name__ == "SimSRTPlatform"
        assert platforms.current_platform is module.current_platform
        assert not platforms.current_platform.capabilities.supports_triton
        assert _get_oot_speculative_cache_locs_fn() is extend_cache_locs  # the seam
        assert overlap_utils._is_cuda is True  # the harness's own choice stays
        assert module.can_use_store_cache(64, 64) is False  # as where it does not compile
    assert module._is_cuda is True and module.current_platform is gpu_platform
    assert module.can_use_store_cache(64, 64) is True
    assert platforms.current_platform is gpu_platform


def test_a_cuda_run_keeps_the_machines_platform_and_flags(gpu_host):
    module, gpu_platform = gpu_host
    with as_without_gpu("cuda:0"):
        assert module._is_cuda is True and module.current_platform is gpu_platform
        assert module.can_use_store_cache(64, 64) is True


def test_a_module_first_imported_during_a_sim_run_is_given_the_machines_after(gpu_host,
                                                                           monkeypatch):
    """Upstream imports some modules lazily, inside the run: they compute their flags and
    bind the platform from the simulator's. After the run they read as the machine's, or
    a CUDA run later in the process would take the simulator's paths."""
    _, gpu_platform = gpu_host
    import sglang.srt.platforms as platforms
    late = types.ModuleType("sglang.specrace_late")
    with as_without_gpu("sim"):
        late._is_cuda, late._is_hip = False, False  # as is_cuda() answers under the sim
        late.current_platform = platforms.current_platform
        monkeypatch.setitem(sys.modules, late.__name__, late)
    assert late.current_platform is gpu_platform
    assert late._is_cuda is True and late._is_hip is False
