"""A recorded schedule, and the policy that replays it.

The simulated device records every answer its chooser gave (``trace.schedule``). Giving
the same answers to the same questions gives the same run -- the trace byte for byte, the
same verdict -- without the seed that drew them: ``Recorded(base, choices)`` answers from
``choices`` and keeps ``base``'s fixed rule for idle streams (``runs_idle``), so it skips
exactly the questions the recorded run skipped. Shuttle's ``ReplayScheduler`` is the model.
``Schedules(base, per_trial)`` is a whole repro run's: trial i replays ``per_trial[i]``
under ``base.offset(i)``'s idle rule.

Text form (a report's ``schedule.choices``): tokens separated by one space; a token is
``h`` (the host goes on) or a stream id, with ``*N`` for N >= 2 repeats:
``"h*3 0 2*2 h"``. A report is untrusted input, so ``decode`` caps the text, the number
of choices (before expanding a repeat) and the stream ids, and names the first bad token.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, List, Mapping, Optional, Sequence, Tuple

from ..runtime.policy import HOST, Chooser
from .choosers import SchedulePolicy

__all__ = ["Recorded", "Schedules", "Replayer", "encode_choices", "decode_choices",
           "MAX_CHOICES", "MAX_SCHEDULE_CHARS"]

MAX_CHOICES = 2_000_000  # per report, far above an engine trial's (~10^2..10^4)
MAX_SCHEDULE_CHARS = 8 * 1024 * 1024  # well inside a report's 20 MB
MAX_STREAM_ID = 99_999

_TOKEN = re.compile(r"(h|0|[1-9][0-9]{0,4})(?:\*([1-9][0-9]{0,6}))?")


def encode_choices(choices: Iterable[int]) -> str:
    """The text form of a sequence of choices (runs of one choice folded into ``*N``)."""
    out: List[str] = []
    prev, n = None, 0
    for c in choices:
        if c == prev:
            n += 1
            continue
        if n:
            out.append(_token(prev, n))
        prev, n = c, 1
    if n:
        out.append(_token(prev, n))
    return " ".join(out)


def _token(choice: int, n: int) -> str:
    head = "h" if choice == HOST else str(choice)
    return head if n == 1 else f"{head}*{n}"


def decode_choices(text: str, budget: int = MAX_CHOICES) -> Tuple[int, ...]:
    """The choices of a text form; ``ValueError`` (one line) if it is not one or holds more
    than ``budget`` choices (a report's trials share one budget)."""
    if not isinstance(text, str):
        raise ValueError("schedule choices must be a string")
    if len(text) > MAX_SCHEDULE_CHARS:
        raise ValueError(f"schedule choices: longer than {MAX_SCHEDULE_CHARS} characters")
    out: List[int] = []
    if not text:
        return ()
    for i, tok in enumerate(text.split(" ")):
        m = _TOKEN.fullmatch(tok)
        if m is None:
            raise ValueError(f"schedule choices: bad token {tok[:20]!r} (number {i + 1}); "
                             f"expected h or a stream id, optionally *N")
        n = int(m.group(2) or 1)
        if len(out) + n > budget:
            raise ValueError(f"schedule choices: more than {MAX_CHOICES} choices in all")
        if m.group(2) and n < 2:
            raise ValueError(f"schedule choices: bad repeat in {tok!r}")
        out.extend([HOST if m.group(1) == "h" else int(m.group(1))] * n)
    return tuple(out)


@dataclass(frozen=True, repr=False)
class Recorded(SchedulePolicy):
    """Replay ``choices`` (a recorded ``trace.schedule``) under ``base``'s idle rule."""

    base: SchedulePolicy
    choices: Tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "choices", tuple(self.choices))

    def chooser(self) -> "Replayer":
        return Replayer(self.base.chooser(), self.choices)

    def __str__(self) -> str:
        return f"schedule({self.base}, {len(self.choices)} choices)"

    def __repr__(self) -> str:
        return f"Recorded({self.base!r}, <{len(self.choices)} choices>)"


@dataclass(frozen=True, repr=False)
class Schedules(SchedulePolicy):
    """A repro run's recorded schedules, one per trial: ``offset(i)`` replays trial i's.
    A trial with none (None: it never ran, its reference run crashed) gets ``base``'s own
    policy of trial i, as a replay by seed would."""

    base: SchedulePolicy
    per_trial: Tuple[Optional[Tuple[int, ...]], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "per_trial", tuple(None if c is None else tuple(c)
                                                    for c in self.per_trial))

    def offset(self, i: int) -> SchedulePolicy:
        if not 0 <= i < len(self.per_trial):
            raise ValueError(f"no recorded schedule for trial {i} "
                             f"({len(self.per_trial)} recorded)")
        choices = self.per_trial[i]
        return self.base.offset(i) if choices is None else Recorded(self.base.offset(i),
                                                                     choices)

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
