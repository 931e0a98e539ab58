"""Hypothesis state machines over arrivals / steps / stalls / drains (see
specrace/machines/). The fixed engine must survive every generated program; the
pre-fix relay must be caught, and the counterexample shrinks to a handful of steps; with
small request pools the seeded slot-reuse bugs are found."""

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from specrace.machines import (TEST_SETTINGS, EngineMachine, GrammarEngineMachine,
                              PrefixEngineMachine, SmallPoolEngineMachine)
from mutations import BY_NAME

FAST = TEST_SETTINGS


def test_fixed_engine_survives_generated_programs():
    run_state_machine_as_test(EngineMachine, settings=settings(
        max_examples=15, stateful_step_count=20, **FAST))


def test_fixed_engine_with_grammar_survives_generated_programs():
    run_state_machine_as_test(GrammarEngineMachine, settings=settings(
        max_examples=6, stateful_step_count=15, **FAST))


def found_and_shrunk(machine, examples: int, steps: int, longest: int) -> list:
    """Run ``machine`` (the pre-fix relay) until it fails: the shrunk program (its
    ``state.`` lines), checked -- requests came, at most ``longest`` steps, and what fired
    was the stale-value oracle or the happens-before oracle."""
    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(machine, settings=settings(
            max_examples=examples, stateful_step_count=steps, derandomize=True, **FAST))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    program = [ln for ln in notes.splitlines() if ln.strip().startswith("state.")]
    assert any("state.arrive(" in ln or "state.wave(" in ln for ln in program), notes
    assert len(program) <= longest, notes
    msg = str(info.value)
    assert "stale" in msg or "RAW" in msg, msg
    return program


def test_prefix_relay_is_found_and_shrunk():
    found_and_shrunk(PrefixEngineMachine, examples=200, steps=12, longest=15)


# --- slot reuse: small pools wrap around ---------------------------------------

# Find, don't shrink: the shrunk program is not what these tests are about (and shrinking
# a 30-step program through reference runs is the slow part).
FIND = dict(FAST, derandomize=True, phases=[Phase.explicit, Phase.generate])


def test_fixed_engine_survives_small_pool_programs():
    run_state_machine_as_test(SmallPoolEngineMachine, settings=settings(
        max_examples=12, stateful_step_count=25, **FAST))


@pytest.mark.parametrize("name", ["pool-edge-off-by-one", "slot-released-twice",
                                  "finished-kept-on-merge", "retracted-result-committed"])
def test_small_pool_programs_find_slot_reuse_bugs(name):
    """Each seeded slot-reuse bug is harmless until a slot is reused: the machine's small
    pools (the ``wave`` rule's short requests) reach it -- a crash counts, as an
    ``AssertionError`` naming it. The retraction bug needs a request the ``arrive`` rule
    retracts with a step of it in flight."""
    machine = type(f"Mutated_{name.replace('-', '_')}", (EngineMachine,),
                   {"mutation": BY_NAME[name]})
    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(machine, settings=settings(
            max_examples=60, stateful_step_count=30, **FIND))
    assert "stale" in str(info.value) or "engine crashed" in str(info.value), str(info.value)
