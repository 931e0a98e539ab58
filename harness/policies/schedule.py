"""The policy that replays a recorded schedule.

The simulated device records every answer its chooser gave (``trace.schedule``, a
``runtime.policy.Schedule``). Giving the same answers to the same questions gives the same
run -- the trace byte for byte, the same verdict -- without the seed that drew them:
``Recorded(base, schedule)`` answers from ``schedule`` and keeps ``base``'s fixed rule for
idle streams (``runs_idle``), so it skips exactly the questions the recorded run skipped.
Shuttle's ``ReplayScheduler`` is the model. ``Schedules(base, per_trial)`` is a whole repro
run's: trial i replays ``per_trial[i]`` under ``base.offset(i)``'s idle rule. (The text
form a report keeps, and its caps, are ``Schedule.encode`` / ``Schedule.decode``.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Tuple

from harness.runtime.policy import HOST, Chooser, Schedule
from harness.policies.choosers import SchedulePolicy

__all__ = ["Recorded", "Schedules", "Replayer"]


@dataclass(frozen=True, repr=False)
class Recorded(SchedulePolicy):
    """Replay ``schedule`` (a recorded ``trace.schedule``) under ``base``'s idle rule."""

    base: SchedulePolicy
    schedule: Schedule

    def chooser(self) -> "Replayer":
        return Replayer(self.base.chooser(), self.schedule.choices)

    def __str__(self) -> str:
        return f"schedule({self.base}, {len(self.schedule)} choices)"

    def __repr__(self) -> str:
        return f"Recorded({self.base!r}, <{len(self.schedule)} choices>)"


@dataclass(frozen=True, repr=False)
class Schedules(SchedulePolicy):
    """A repro run's recorded schedules, one per trial: ``offset(i)`` replays trial i's.
    A trial with none (None: it never ran, its reference run crashed) gets ``base``'s own
    policy of trial i, as a replay by seed would."""

    base: SchedulePolicy
    per_trial: Tuple[Optional[Schedule], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "per_trial", tuple(self.per_trial))

    def offset(self, i: int) -> SchedulePolicy:
        if not 0 <= i < len(self.per_trial):
            raise ValueError(f"no recorded schedule for trial {i} "
                             f"({len(self.per_trial)} recorded)")
        schedule = self.per_trial[i]
        return self.base.offset(i) if schedule is None else Recorded(self.base.offset(i),
                                                                      schedule)

    def chooser(self) -> Chooser:
        return self.offset(0).chooser()

    def __str__(self) -> str:
        return f"{self.base}, replayed from {len(self.per_trial)} recorded schedule(s)"

    def __repr__(self) -> str:
        return f"Schedules({self.base!r}, <{len(self.per_trial)} trials>)"


class Replayer(Chooser):
    """Answers from the recorded choices, in order. A recorded answer that does not fit the
    question (that stream cannot run now; the record is used up) means the run left the
    recorded schedule: from there on the host goes on -- always a legal answer -- and the
    run's own ``trace.schedule`` differs from the record, which is how a replay tells
    (``diverged_at``: the first such question). Never an exception inside the engine."""

    def __init__(self, base: Chooser, choices: Sequence[int]) -> None:
        self.base = base
        self.choices = choices
        self.asked = 0
        self.diverged_at: Optional[int] = None

    def choose(self, runnable: Sequence[int], last: Optional[int],
               names: Mapping[int, str]) -> int:
        i = self.asked
        self.asked = i + 1
        if self.diverged_at is None and i < len(self.choices):
            c = self.choices[i]
            if c == HOST or c in runnable:
                return c
        if self.diverged_at is None:
            self.diverged_at = i
        return HOST

    def runs_idle(self, stream: int, names: Mapping[int, str]) -> bool:
        return self.base.runs_idle(stream, names)
