"""Model Runner V2 driven whole across releases (``targets/vllm/mrv2/``), in a vLLM
release's environment (skipped elsewhere): the contract's MRv2 check read from source
(each kernel the driven modules launch has a stand-in taking exactly its parameters, or
is named), the per-release binding, the loud failure of a kernel no stand-in covers, the
refusal of an engine the release does not drive, and the audit's S1 settled on the
installed release (``vllm-mrv2-uva-pool``)."""
from __future__ import annotations

import importlib.util

import pytest

from tests.targets.vllm_v1.release_copy import copy_modules, edit

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed in this environment")

_GPU = "vllm.v1.worker.gpu"


def _installed():
    from targets import static
    from targets.vllm.boundary import contract
    return contract.installed_version(), static.package_root("vllm")


def _driven_on(version: str) -> bool:
    from packaging.version import Version
    return Version(version) >= Version("0.17.0")


@pytest.fixture(scope="module")
def target():
    import targets
    return targets.get("vllm")  # the platform answers and toy models, as a run loads them


@pytest.fixture
def tree(tmp_path):
    """The release's MRv2-driven files, copied (edited per test)."""
    from targets.vllm.boundary import contract
    from targets.vllm.mrv2 import table
    _version, root = _installed()
    modules = set(contract.MRV2_MODULES) | {t.split(":")[0] for t in contract.MRV2_CALLED}
    modules |= {m for m, _n, _f in table.KERNELS} | set(table.DRIVEN_MODULES)
    modules |= set(contract.DRIVEN_MODULES) | set(contract.SLICE_MODULES)
    return copy_modules(root, modules, tmp_path / "vllm")


def test_mrv2_is_driven_on_the_release_set_up_here():
    from targets.vllm.boundary import contract
    version, root = _installed()
    verdict = contract.evaluate(version, root)
    if _driven_on(version):
        assert verdict.mrv2 == [] and verdict.ok, verdict.mrv2[:2]
    else:  # 0.16.0: its kernels' parameters differ, the first one named
        assert verdict.mrv2 and "the kernel vllm.v1.worker.gpu" in verdict.mrv2[0]


def test_a_copy_of_the_driven_files_fits_too(tree):
    from targets.vllm.boundary import contract
    version, root = _installed()
    assert contract.check_mrv2(str(tree)) == contract.check_mrv2(root)


def test_a_kernel_whose_parameters_drift_is_named(tree):
    from targets.vllm.boundary import contract
    if not _driven_on(_installed()[0]):
        pytest.skip("MRv2 is not driven on this release")
    edit(tree, f"{_GPU}.input_batch", "def _expand_idx_mapping_kernel(\n    idx_mapping_ptr,",
         "def _expand_idx_mapping_kernel(\n    batch_to_state_ptr,")
    problems = contract.check_mrv2(str(tree))
    assert len(problems) == 1 and "_expand_idx_mapping_kernel" in problems[0], problems
    assert "is not what any of specrace's stand-ins for it takes" in problems[0]


def test_a_kernel_no_stand_in_covers_is_named(tree):
    from targets.vllm.boundary import contract
    if not _driven_on(_installed()[0]):
        pytest.skip("MRv2 is not driven on this release")
    module = f"{_GPU}.input_batch"
    from targets import static
    text = open(static.module_path(str(tree), module)).read()
    edit(tree, module, "_expand_idx_mapping_kernel", "_expand_idx_mapping_v2_kernel",
         text.count("_expand_idx_mapping_kernel"))
    problems = contract.check_mrv2(str(tree))
    assert any(f"launches the kernel {module}._expand_idx_mapping_v2_kernel, for which "
               f"specrace has no stand-in" in p for p in problems), problems


def test_each_kernel_the_release_defines_gets_the_stand_in_taking_its_parameters(target):
    from targets.vllm.mrv2 import seams, table
    if not _driven_on(_installed()[0]):
        pytest.skip("MRv2 is not driven on this release")
    binds = seams.bindings()
    assert binds, "no kernel of the table is defined in this release"
    import sys
    for module, name, fn in binds:
        params = table.kernel_params(getattr(sys.modules[module], name))
        assert table.stand_in_params(fn) == params, (module, name)


def test_a_kernel_the_path_has_no_stand_in_for_fails_loudly(target):
    from targets.vllm.mrv2 import seams
    if not _driven_on(_installed()[0]):
        pytest.skip("MRv2 is not driven on this release")
    import vllm.v1.worker.gpu.sample.gumbel as gumbel  # _temperature_kernel: NOT_LAUNCHED
    with seams.installed():
        with pytest.raises(NotImplementedError, match="_temperature_kernel was launched"):
            gumbel._temperature_kernel[(1, 1)]


def test_an_engine_the_release_does_not_drive_is_refused_by_name(monkeypatch):
    from harness.target import TargetError
    from targets.vllm.boundary import contract
    monkeypatch.setattr(contract, "path_problem", lambda v2: "the kernel X drifted" if v2
                        else "")
    contract.refuse_undriven(False)
    with pytest.raises(TargetError, match="Model Runner V2 is not driven: the kernel X"):
        contract.refuse_undriven(True)


def test_s1_on_the_release_set_up_here(target):
    """The audit's S1: one output event re-recorded each step (0.17.x) orders the host's
    restaging of the sampling states' pool slot after the drafter's copy (clean); a fresh
    event per output (0.23.0 on) does not (the detector's race). Either way the drafter
    read what the host staged in the synchronous reference, and under overlap only a
    temperature equal to the staged one (0: greedy) -- no token can differ."""
    from packaging.version import Version
    from specrace import cli
    from targets.vllm.mrv2 import probe
    version = Version(_installed()[0])
    if version < Version("0.17.0") or Version("0.18.0") <= version < Version("0.23.0"):
        pytest.skip("not driven (0.16.0), or the window opens on empty steps only "
                    "(0.18.0/0.19.0: the scenario's seed-dependent)")
    expect = "clean" if version < Version("0.18.0") else "race"
    before = len(probe.drafter_input_mismatches)
    assert cli.main(["repro", "vllm-mrv2-uva-pool", "--target", "vllm", "--trials", "1",
                     "--no-report", "--expect", expect]) == 0
    seen = probe.drafter_input_mismatches[before:]
    assert not [m for m in seen if m["run"] == "reference"]
    assert all(m["staged"][0] == m["read"][0] == 0.0 for m in seen), seen
