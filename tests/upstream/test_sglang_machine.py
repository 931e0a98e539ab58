"""The Hypothesis state machine against installed sglang: the released relay survives
generated programs; with the pre-#35198 relay patched into the real classes the machine
finds the seed race from scratch and shrinks it to a handful of steps."""
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from specrace.machines import TEST_SETTINGS, EngineMachine, PrefixEngineMachine

FAST = TEST_SETTINGS


class SglangMachine(EngineMachine):
    target = "sglang"


class SglangPrefixMachine(PrefixEngineMachine):
    target = "sglang"


def test_released_sglang_survives_generated_programs():
    run_state_machine_as_test(SglangMachine, settings=settings(
        max_examples=6, stateful_step_count=12, **FAST))


def test_prefix_relay_on_sglang_is_found_and_shrunk():
    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(SglangPrefixMachine, settings=settings(
            max_examples=60, stateful_step_count=10, derandomize=True, **FAST))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    program = [ln for ln in notes.splitlines() if ln.strip().startswith("state.")]
    assert any("state.arrive(" in ln or "state.wave(" in ln for ln in program), notes
    assert len(program) <= 12, notes
    msg = str(info.value)
    assert "stale" in msg or "RAW" in msg, msg
    print("\n".join(program))
    print(msg.splitlines()[0])
