"""The scheduling protocol between the simulated device and a schedule policy.

The device owns the mechanics (queues, waits, the clock); a policy only *chooses*, over
plain data, the way shuttle's ``Scheduler::next_task(runnable, current, ..)`` does. At a
scheduling point (an enqueue, a host sync, a ``query()`` that answers False) the host
could go on, and so could every stream whose head may execute. While some stream head
may execute, the device asks ``chooser.choose(runnable, last, names)``:

* ``runnable`` -- the ids of the streams whose head may execute now, ascending (never
  empty: with nothing runnable there is no choice, and nothing is asked);
* ``last``     -- the stream the previous answer at this same point ran, None for the
  point's first question;
* ``names``    -- stream id -> label (``runtime.label``), for policies that name streams.

The answer is one of ``runnable`` (its head executes, then the device asks again) or
``HOST``: the host goes on and whatever is left waits for a later point, or for a host
sync or an event wait that demands it. The device records every answer, in order: the
run's ``Schedule`` (``trace.schedule``), the one value a schedule is wherever it goes -- a
trial's result, a report (its text form), the ``Recorded`` policy
(``harness.policies.schedule``) that gives the answers back.

One question is skipped on purpose, for speed: a chooser's fixed rule ``runs_idle`` may
say that an op enqueued on an *idle* stream always executes at once; the device then runs
it without asking (no meta run, no deferred kernel). That rule depends on the stream's
label only, never on the run, so a replayed schedule keeps it and skips the same
questions.

A ``Policy`` is the immutable value (what ``--policy`` spells, what a report records);
``chooser()`` gives a fresh chooser, with its own per-run state, for each run. Concrete
policies live in ``harness.policies`` (a higher layer); the runtime only knows this
contract and its default, ``RunAll``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, Iterator, List, Mapping, Optional, Sequence, Tuple

__all__ = ["HOST", "Chooser", "Policy", "RunAll", "first_from", "Schedule", "decode_schedules",
           "MAX_CHOICES", "MAX_SCHEDULE_CHARS"]

# The host: a chooser's answer "the host goes on", and the host's actor id in the trace's
# vector clocks (``trace.HOST`` is this one).
HOST = -1


class Chooser:
    """One run's decision maker: plain data in, one choice out (see the module docstring).

    Deterministic: its answers are a function of its construction (its seed) and the
    questions it was asked, nothing else."""

    def choose(self, runnable: Sequence[int], last: Optional[int],
               names: Mapping[int, str]) -> int:
        raise NotImplementedError

    def runs_idle(self, stream: int, names: Mapping[int, str]) -> bool:
        """True if an op enqueued on the idle stream ``stream`` always executes at once."""
        return False


class Policy:
    """A schedule policy as a value; ``str()`` is its spelling."""

    def chooser(self) -> Chooser:
        raise NotImplementedError


def first_from(runnable: Sequence[int], last: Optional[int]) -> int:
    """The first of ``runnable`` in cyclic stream order from ``last`` (inclusive; from
    stream 0 at a point's first question): a stream keeps running while it may, then the
    next one takes over, round and round -- the order the synchronous device drains in."""
    if last is not None:
        for sid in runnable:
            if sid >= last:
                return sid
    return runnable[0]


class RunAll(Policy, Chooser):
    """Run everything runnable at once: a synchronous device. The runtime's default."""

    def chooser(self) -> Chooser:
        return self  # no per-run state

    def choose(self, runnable: Sequence[int], last: Optional[int],
               names: Mapping[int, str]) -> int:
        return first_from(runnable, last)

    def runs_idle(self, stream: int, names: Mapping[int, str]) -> bool:
        return True

    def __str__(self) -> str:
        return "eager"

    def __repr__(self) -> str:
        return "RunAll()"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))


# --- the schedule: one value wherever a run's answers go (the trace, a trial's result, a
# report, the policy that replays them) ------------------------------------------------

MAX_CHOICES = 2_000_000  # per report, far above an engine trial's (~10^2..10^4)
MAX_SCHEDULE_CHARS = 8 * 1024 * 1024  # well inside a report's 20 MB
_TOKEN = re.compile(r"(h|0|[1-9][0-9]{0,4})(?:\*([1-9][0-9]{0,6}))?")  # stream ids < 10^5


@dataclass(frozen=True, repr=False)
class Schedule:
    """What the simulator's policy answered at each question, in order: a stream id (its
    head ran) or ``HOST`` (the host went on). Giving the same answers to the same
    questions gives the same run (``harness.policies.Recorded``).

    Text form (``encode``; a report's ``schedules``): tokens separated by one space; a token
    is ``h`` (the host goes on) or a stream id, with ``*N`` for N >= 2 repeats:
    ``"h*3 0 2*2 h"``. A report is untrusted input, so ``decode`` caps the text, the number
    of choices (before expanding a repeat) and the stream ids, and names the first bad
    token."""

    choices: Tuple[int, ...] = ()
    HOST: ClassVar[int] = HOST

    def __post_init__(self) -> None:
        if type(self.choices) is not tuple:  # a value: never a list someone still appends to
            object.__setattr__(self, "choices", tuple(self.choices))

    def __len__(self) -> int:
        return len(self.choices)

    def __iter__(self) -> Iterator[int]:
        return iter(self.choices)

    def __repr__(self) -> str:  # a schedule runs to thousands of choices
        text = self.encode()
        shown = text if len(text) <= 60 else text[:57] + "..."
        return f"Schedule({shown!r}, {len(self.choices)} choices)"

    def encode(self) -> str:
        """The text form (runs of one choice folded into ``*N``)."""
        out: List[str] = []
        prev, n = None, 0
        for c in self.choices:
            if c == prev:
                n += 1
                continue
            if n:
                out.append(_token(prev, n))
            prev, n = c, 1
        if n:
            out.append(_token(prev, n))
        return " ".join(out)

    @classmethod
    def decode(cls, text: str, budget: int = MAX_CHOICES) -> "Schedule":
        """The schedule of a text form; ``ValueError`` (one line) if it is not one or holds
        more than ``budget`` choices (a report's trials share one budget)."""
        if not isinstance(text, str):
            raise ValueError("schedule choices must be a string")
        if len(text) > MAX_SCHEDULE_CHARS:
            raise ValueError(f"schedule choices: longer than {MAX_SCHEDULE_CHARS} characters")
        out: List[int] = []
        if not text:
            return cls()
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
        return cls(tuple(out))


def _token(choice: int, n: int) -> str:
    head = "h" if choice == HOST else str(choice)
    return head if n == 1 else f"{head}*{n}"


def decode_schedules(texts: Sequence[Optional[str]]) -> List[Optional[Schedule]]:
    """A report's schedules, one per trial (None: that trial never ran), decoded under one
    budget of ``MAX_CHOICES``; a ``ValueError`` names the trial (``[i]: ...``)."""
    out: List[Optional[Schedule]] = []
    budget = MAX_CHOICES
    for i, text in enumerate(texts):
        if text is None:
            out.append(None)
            continue
        try:
            schedule = Schedule.decode(text, budget)
        except ValueError as exc:
            raise ValueError(f"[{i}]: {exc}") from None
        budget -= len(schedule)
        out.append(schedule)
    return out
