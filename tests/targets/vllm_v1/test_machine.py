"""The Hypothesis state machine against installed vLLM's own engine loop (run in a vLLM
release's environment: ``pytest --specrace-target vllm`` there; skipped elsewhere): with
the seq-lens fix the release survives generated programs; as shipped (0.16.0-0.18.0) the
machine finds the drafter's in-place write to the pinned seq_lens buffer from scratch."""
import importlib.util

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from specrace.machines import TEST_SETTINGS, EngineMachine

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed in this environment")


class VllmMachine(EngineMachine):
    target = "vllm"


def test_the_shipped_seq_lens_race_is_found_from_scratch():
    # found is what this asserts; shrinking the program is the sglang machine's test
    fast = {**TEST_SETTINGS, "phases": (Phase.explicit, Phase.generate)}
    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(VllmMachine, settings=settings(
            max_examples=6, stateful_step_count=10, derandomize=True, **fast))
    assert "eagle.py" in str(info.value), str(info.value)[:2000]


class FixedVllmMachine(EngineMachine):
    target = "vllm"

    def __init__(self) -> None:
        super().__init__()
        from mutations.vllm import FIXES  # the seq-lens fix, around the engine's own work
        self.mutation = FIXES["drafter-increments-out-of-place"]


def test_with_the_seq_lens_fix_generated_programs_find_nothing():
    run_state_machine_as_test(FixedVllmMachine, settings=settings(
        max_examples=4, stateful_step_count=8, derandomize=True, **TEST_SETTINGS))
