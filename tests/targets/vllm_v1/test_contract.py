"""The vLLM target's contract, read from a release's source without importing it: a
release set up here is compatible, and each edit of what the target relies on is one
named problem (a copy of the driven files, edited). Skipped where no vLLM release is set
up (``make upstream TARGET=vllm VLLM=0.17.0``; CI sets it up for its vLLM gate)."""
from __future__ import annotations

import glob
import os

import pytest

from targets import static
from targets.vllm.boundary import contract, handover
from targets.vllm.engine.kernels import KERNEL_SEAMS
from targets.vllm.environments import LINE
from tests.targets.vllm_v1.release_copy import copy_modules, edit

RELEASE = "0.17.0"
ROOT = LINE.release_root(RELEASE)
pytestmark = pytest.mark.skipif(ROOT is None, reason=f"vllm {RELEASE} is not set up here")


def _modules():
    names = set(contract.DRIVEN_MODULES) | set(contract.SLICE_MODULES)
    names |= set(contract.LATER_DRIVEN_MODULES)  # where the release has them
    names |= {t.split(":")[0] for t in (*contract.CALLED, *contract.SLICE_CALLED)}
    for _fn, defined, launchers in KERNEL_SEAMS.values():
        names |= {defined, *launchers}
    # what the runner hands the draft-token handler, read by the slice's contract
    names.add(handover.RUNNER)
    spec = os.path.join(ROOT, *handover.SPEC_DECODE) if ROOT else ""
    for path in glob.glob(os.path.join(spec, "**", "*.py"), recursive=True):
        names.add("vllm." + os.path.relpath(path, ROOT)[:-3].replace(os.sep, "."))
    return sorted(names)


@pytest.fixture
def tree(tmp_path):
    """The driven files of the release, copied (edited per test)."""
    return copy_modules(ROOT, _modules(), tmp_path / "vllm")


def test_the_release_set_up_here_fits():
    verdict = contract.evaluate(RELEASE, ROOT)
    assert verdict.ok and verdict.problems == [] and verdict.tier == "verified"
    assert verdict.digest == contract.VERIFIED[RELEASE]


def test_an_edited_file_makes_a_verified_release_compatible(tree):
    edit(tree, "vllm.v1.engine.core", "    def step_with_batch_queue(",
         "    def step_with_batch_queue(  # edited")
    verdict = contract.evaluate(RELEASE, str(tree))
    assert verdict.ok and verdict.tier == "compatible" and verdict.digest != contract.VERIFIED[RELEASE]


def test_a_copy_of_its_driven_files_fits_too(tree):
    assert contract.check_api(str(tree)) == []


@pytest.mark.parametrize("module, old, new, named", [
    ("vllm.v1.attention.backends.gdn_attn", "        num_accepted_tokens:",
     "        accepted_counts:", "GDNAttentionMetadataBuilder.build"),
    ("vllm.v1.worker.gpu_model_runner", "    def _init_device_properties(self)",
     "    def _init_device_props(self)", "_init_device_properties"),
    ("vllm.v1.engine.core", "    def step_with_batch_queue(", "    def step_batched(",
     "step_with_batch_queue"),
    ("vllm.v1.spec_decode.utils", "def eagle_prepare_inputs_padded_kernel(\n"
     "    cu_num_draft_tokens_ptr,", "def eagle_prepare_inputs_padded_kernel(\n"
     "    cu_draft_ptr,", "eagle_prepare_inputs_padded_kernel"),
])
def test_each_edit_is_one_named_problem(tree, module, old, new, named):
    edit(tree, module, old, new)
    problems = contract.check_api(str(tree))
    assert len(problems) >= 1 and all(named in p for p in problems), problems


def test_a_kernel_the_launcher_no_longer_names_is_a_problem(tree):
    edit(tree, "vllm.v1.spec_decode.eagle", "    copy_and_expand_eagle_inputs_kernel,\n", "")
    problems = contract.check_api(str(tree))
    assert any("no longer names the kernel copy_and_expand_eagle_inputs_kernel" in p
               for p in problems), problems


def test_out_of_range_and_unparsable_versions_are_problems():
    assert "outside the supported range" in contract.check_version("0.12.0")[0]
    assert "not a version number" in contract.check_version("main")[0]
    assert contract.check_version(RELEASE) == []


def test_a_release_without_the_v1_runner_runs_its_slices_only(tree):
    """0.34.0's shape: no V1 runner. Its engine scenarios are not applicable, the target
    is unsupported for the engine -- and loads for the slices, whose code is there."""
    os.remove(static.module_path(str(tree), "vllm.v1.worker.gpu_model_runner"))
    for scenario in contract.SCENARIO_CODE:
        why = contract.not_applicable(str(tree), scenario)
        if scenario in contract.SLICE_SCENARIOS:
            assert why == ""
        else:
            assert "the release has no" in why
    verdict = contract.evaluate(RELEASE, str(tree))
    assert not verdict.ok and "Model Runner V2" in verdict.problems[-1]
    assert verdict.slices_only and verdict.engine == verdict.problems


def test_a_slice_edit_is_a_named_problem_and_stops_the_slices_too(tree):
    edit(tree, "vllm.v1.worker.gpu.spec_decode.utils",
         "    def set_draft_tokens(\n        self, input_batch",
         "    def set_draft_tokens(\n        self, batch")
    verdict = contract.evaluate(RELEASE, str(tree))
    assert verdict.ok and verdict.slices  # the engine still fits; the slice is named
    assert "set_draft_tokens" in verdict.slices[0]
    os.remove(static.module_path(str(tree), "vllm.v1.worker.gpu_model_runner"))
    assert not contract.evaluate(RELEASE, str(tree)).slices_only


def test_every_scenario_applies_to_the_release_set_up_here():
    for scenario in contract.SCENARIO_CODE:
        assert contract.not_applicable(ROOT, scenario) == ""
