"""The Hypothesis state machine against installed sglang: the released relay survives
generated programs; with the pre-#35198 relay patched into the real classes the machine
finds the seed race from scratch and shrinks it to a handful of steps."""
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from specrace.machines import TEST_SETTINGS, EngineMachine, PrefixEngineMachine
from tests.impl.test_state_machine import found_and_shrunk

FAST = TEST_SETTINGS


class SglangMachine(EngineMachine):
    target = "sglang"


class SglangPrefixMachine(PrefixEngineMachine):
    target = "sglang"


def test_released_sglang_survives_generated_programs():
    run_state_machine_as_test(SglangMachine, settings=settings(
        max_examples=6, stateful_step_count=12, **FAST))


@pytest.mark.long
def test_prefix_relay_on_sglang_is_found_and_shrunk():
    program = found_and_shrunk(SglangPrefixMachine, examples=60, steps=10, longest=12)
    print("\n".join(program))
