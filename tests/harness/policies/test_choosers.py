"""Each policy's chooser on plain data: no simulator, no torch -- questions in, answers out.

A question is (runnable stream ids, the stream the last answer at this point ran, stream
labels); an answer is one of the runnable ids or HOST (the host goes on).
"""
from __future__ import annotations

import dataclasses
import random

import pytest

from harness.policies import (PCT, Eager, Lazy, PctChooser, RandomChooser, RandomPolicy,
                              Recorded, Stall, parse_policy)
from harness.policies.schedule import Replayer
from harness.runtime.policy import HOST, Schedule, first_from

NAMES = {1: "schedule", 2: "forward", 3: "copy"}


# --- eager: the synchronous device's drain order ----------------------------------------------

@pytest.mark.parametrize("runnable,last,want", [
    ([0, 2, 3], None, 0),  # a point's first question: from stream 0
    ([2, 3], None, 2),
    ([0, 2, 3], 2, 2),     # the stream that just ran keeps going while it may
    ([0, 2, 3], 1, 2),     # ... then the next one in stream order
    ([0, 2], 3, 0),        # ... round and round
])
def test_eager_answers_in_cyclic_stream_order(runnable, last, want):
    assert first_from(runnable, last) == want
    assert Eager().chooser().choose(runnable, last, NAMES) == want


def test_eager_never_lets_the_host_go_while_a_head_may_run_and_runs_idle_streams_at_once():
    c = Eager().chooser()
    assert all(c.choose([s], None, {}) == s for s in range(4))
    assert c.runs_idle(0, {}) and c.runs_idle(2, NAMES)


# --- lazy and stall ---------------------------------------------------------------------------

def test_lazy_always_lets_the_host_go_and_never_runs_at_enqueue():
    c = Lazy().chooser()
    assert [c.choose(r, None, NAMES) for r in ([0], [1, 2], [0, 1, 2, 3])] == [HOST] * 3
    assert not c.runs_idle(0, {})


def test_stall_runs_the_free_streams_as_eager_does_and_holds_the_named_ones():
    c = Stall(["forward", "copy"]).chooser()
    assert c.choose([0, 1, 2, 3], None, NAMES) == 0
    assert c.choose([1, 2, 3], 1, NAMES) == 1
    assert c.choose([2, 3], None, NAMES) == HOST  # only stalled streams could run
    assert c.choose([2, 3, 7], None, NAMES) == 7  # an unlabelled stream is free
    assert [c.runs_idle(s, NAMES) for s in (0, 1, 2, 3)] == [True, True, False, False]


def test_stall_reads_labels_at_each_question():
    """A stream labelled after it was made is stalled from then on."""
    c = Stall(["forward"]).chooser()
    names = {}
    assert c.choose([2], None, names) == 2
    names[2] = "forward"
    assert c.choose([2], None, names) == HOST


# --- random -----------------------------------------------------------------------------------

def test_random_draws_stop_then_stream_from_its_own_seeded_generator():
    """The draws, one for one: stop with probability 1/2, else a uniform runnable head --
    the sequence the policy drew before choosers existed, so its schedules are unchanged."""
    c, rng = RandomChooser(11), random.Random(11)
    questions = [[0], [0, 2], [1, 2, 3], [3], [0, 1]] * 20
    for runnable in questions:
        want = HOST if rng.random() < 0.5 else rng.choice(runnable)
        assert c.choose(runnable, None, NAMES) == want


def test_random_is_a_function_of_its_seed_and_the_questions():
    def answers(seed):
        c = RandomPolicy(seed).chooser()
        return [c.choose([0, 1, 2], None, {}) for _ in range(200)]
    a = answers(1)
    assert a == answers(1) != answers(2)
    assert set(a) == {HOST, 0, 1, 2}
    assert 60 < a.count(HOST) < 140  # the host goes on about half the time
    assert all(RandomChooser(3, stop=0.0).choose([1, 2], None, {}) != HOST for _ in range(50))
    assert not RandomPolicy(1).chooser().runs_idle(0, {})


# --- pct --------------------------------------------------------------------------------------

def test_pct_without_change_points_always_runs_the_highest_priority_actor():
    c = PctChooser(seed=5, depth=1)
    assert c.changes == []
    first = c.choose([0, 1, 2], None, {})
    assert all(c.choose([0, 1, 2], None, {}) == first for _ in range(100))
    # priorities are the actors' own: drop the winner and the runner-up is stable too
    rest = [s for s in (0, 1, 2) if s != first] or [0, 1, 2]
    second = c.choose(rest, None, {})
    assert all(c.choose(rest, None, {}) == second for _ in range(20))


@pytest.mark.parametrize("seed", range(6))
def test_pct_demotes_the_actor_about_to_go_at_the_change_point(seed):
    c = PctChooser(seed=seed, depth=2, steps=10)
    (change,) = c.changes
    before = [c.choose([0], None, {}) for _ in range(change - 1)]
    assert c.real_choices == change - 1
    # the actor that wins without a change (drawing stream 0's priority as choose() would)
    winner = max((HOST, 0), key=c._priority)
    assert set(before) <= {winner}
    at_change = c.choose([0], None, {})  # the change-th real choice
    assert at_change != winner  # the would-be winner dropped below the other actor
    assert c.prio[winner] == 1.0 < c.prio[at_change]  # depth - 1: below every initial one
    assert all(c.choose([0], None, {}) == at_change for _ in range(30))
    assert c.real_choices == change + 30 and c.changes == []


def test_pct_change_points_count_questions_only():
    """Change points count real choices: the device asks only when a stream head may run
    (and the host could go on instead), so the count is the number of questions, however
    many scheduling points had nothing to choose. Drawn within the first ``steps``."""
    for seed in range(20):
        c = PctChooser(seed=seed, depth=4, steps=12)
        assert len(c.changes) == 3 and all(1 <= x <= 12 for x in c.changes)
        assert c.changes == sorted(set(c.changes))
        demotions = 0
        for n in range(1, 13):
            low_before = c.low
            c.choose([0, 1], None, {})
            demotions += c.low < low_before
            assert c.real_choices == n
        assert demotions == 3 and c.changes == []


def test_pct_is_a_function_of_its_seed_and_the_questions():
    def answers(seed):
        c = PCT(seed, 3).chooser()
        qs = [[0], [0, 1], [1, 2], [0, 1, 2], [2]] * 100
        return [c.choose(q, None, {}) for q in qs]
    assert answers(3) == answers(3)
    assert len({tuple(answers(s)) for s in range(10)}) > 1
    assert not PCT(1, 3).chooser().runs_idle(0, {})


# --- a recorded schedule ----------------------------------------------------------------------

def test_replayer_gives_the_recorded_answers_and_the_base_idle_rule():
    c = Recorded(Stall(["forward"]), Schedule((HOST, 1, 3))).chooser()
    assert isinstance(c, Replayer)
    assert [c.choose([1, 3], None, NAMES), c.choose([1, 3], None, NAMES),
            c.choose([3], 1, NAMES)] == [HOST, 1, 3]
    assert c.diverged_at is None
    assert c.runs_idle(1, NAMES) and not c.runs_idle(2, NAMES)  # stall(forward)'s rule


def test_replayer_that_leaves_the_record_lets_the_host_go_and_says_where():
    c = Recorded(Eager(), Schedule((0, 2, 0))).chooser()
    assert c.choose([0, 1], None, {}) == 0
    assert c.choose([0, 1], 0, {}) == HOST  # 2 cannot run: the run left the record here
    assert c.diverged_at == 1
    assert c.choose([0], None, {}) == HOST  # and stays off it
    c = Recorded(Eager(), Schedule((0,))).chooser()
    assert [c.choose([0], None, {}), c.choose([0], None, {})] == [0, HOST]
    assert c.diverged_at == 1  # asked more often than recorded


def test_a_schedule_is_a_value_with_one_text_form():
    s = Schedule((HOST, HOST, HOST, 0, 2, 2, HOST))
    assert s.encode() == "h*3 0 2*2 h" and Schedule.decode("h*3 0 2*2 h") == s
    assert Schedule.HOST == HOST and len(s) == 7 and list(s) == list(s.choices)
    assert Schedule([0, 1]).choices == (0, 1)  # a list is taken as the tuple it holds
    assert Schedule().encode() == "" and Schedule.decode("") == Schedule()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.choices = ()
    assert len(repr(Schedule((0, 1) * 500))) < 100  # thousands of choices, one short line
    for bad in ("0 x", "0  1", "h*1", "100000", 3):
        with pytest.raises(ValueError, match="schedule choices"):
            Schedule.decode(bad)


def test_the_committed_reports_schedules_read_back_as_written():
    """Report files already committed keep loading: every recorded text decodes, and
    encodes back to the very same text."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parents[3] / "reports"
    texts = [t for p in sorted(root.rglob("*.json")) if "specrace_report" in p.read_text()
             for t in (json.loads(p.read_text()).get("schedules") or []) if t is not None]
    assert texts
    assert all(Schedule.decode(t).encode() == t for t in texts)


# --- policies are values ----------------------------------------------------------------------

@pytest.mark.parametrize("pol", [Eager(), Lazy(), Stall(["forward", "copy"]), RandomPolicy(7),
                                 PCT(7, 2)])
def test_policies_are_frozen_values_named_by_their_spelling(pol):
    again = parse_policy(str(pol))
    assert again == pol and hash(again) == hash(pol)
    assert repr(pol) == f"parse_policy({str(pol)!r})"
    for field in dataclasses.fields(pol) if dataclasses.is_dataclass(pol) else ():
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(pol, field.name, 1)


def test_each_run_gets_a_fresh_chooser_from_one_value():
    pol = PCT(4, 3)
    a, b = pol.chooser(), pol.chooser()
    assert a is not b
    assert [a.choose([0, 1], None, {}) for _ in range(50)] == \
        [b.choose([0, 1], None, {}) for _ in range(50)]


def test_offset_moves_only_a_seed_and_wraps_within_its_range():
    from harness.policies import MAX_POLICY_SEED
    assert str(RandomPolicy(7).offset(2)) == "random(9)"
    assert str(PCT(MAX_POLICY_SEED, 5).offset(2)) == "pct(1,5)"
    for pol in (Eager(), Lazy(), Stall(["forward"])):
        assert pol.offset(3) == pol
    rec = Recorded(RandomPolicy(1), Schedule((HOST,)))
    assert rec.offset(4) is rec  # the recorded choices are the schedule, whatever the trial
