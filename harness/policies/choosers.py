"""The five schedule policies: each an immutable value (its spelling, its seed) and the
chooser it makes for a run (``harness/runtime/policy.py`` has the protocol).

Choosers see plain data only -- runnable stream ids, the stream that ran last at this
point, stream labels -- so each is tested without a simulator
(``tests/harness/policies/test_choosers.py``).
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from harness.runtime.policy import HOST, Chooser, Policy, RunAll, first_from

MAX_POLICY_SEED = 2**63 - 1  # seeds are 0..MAX_POLICY_SEED

# PCT's k: the d-1 priority change points are drawn among the first PCT_STEPS real choices
# of a run (Burckhardt et al. draw them in [1, k] for a run of k steps).
PCT_STEPS = 400


class SchedulePolicy(Policy):
    """What every policy value offers besides its chooser. Values are frozen: a policy
    parsed once travels from the command line (or a report) into every trial."""

    def offset(self, i: int) -> "SchedulePolicy":
        """The policy of trial ``i`` of a run: seeded policies move their seed on by ``i``
        (wrapping within 0..MAX_POLICY_SEED); the others are the same every trial."""
        return self

    def __repr__(self) -> str:
        return f"parse_policy({str(self)!r})"


class SeededPolicy(SchedulePolicy):
    """A policy drawn from its dataclass field ``seed``: trial ``i`` runs seed + i."""

    def offset(self, i: int) -> "SeededPolicy":
        return dataclasses.replace(self, seed=(self.seed + i) % (MAX_POLICY_SEED + 1))


class Eager(RunAll, SchedulePolicy):
    """``eager``: every op runs at enqueue -- a synchronous device."""

    __repr__ = SchedulePolicy.__repr__


@dataclass(frozen=True, repr=False)
class Lazy(SchedulePolicy, Chooser):
    """``lazy``: nothing runs until a host sync or an event wait demands it."""

    def chooser(self) -> Chooser:
        return self

    def choose(self, runnable: Sequence[int], last: Optional[int],
               names: Mapping[int, str]) -> int:
        return HOST

    def __str__(self) -> str:
        return "lazy"


@dataclass(frozen=True, repr=False)
class Stall(SchedulePolicy, Chooser):
    """``stall(a,b,..)``: the named streams execute only when something waits for them;
    the others as under eager."""

    stalled: Tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "stalled", tuple(self.stalled))  # a list is accepted

    def chooser(self) -> Chooser:
        return self

    def choose(self, runnable: Sequence[int], last: Optional[int],
               names: Mapping[int, str]) -> int:
        free = [sid for sid in runnable if names.get(sid) not in self.stalled]
        return first_from(free, last) if free else HOST

    def runs_idle(self, stream: int, names: Mapping[int, str]) -> bool:
        return names.get(stream) not in self.stalled

    def __str__(self) -> str:
        return f"stall({','.join(self.stalled)})"


@dataclass(frozen=True, repr=False)
class RandomPolicy(SeededPolicy):
    """``random(seed)``: at each question, the host goes on with probability ``stop``, else
    a uniformly drawn runnable head runs."""

    seed: int
    stop: float = 0.5

    def chooser(self) -> Chooser:
        return RandomChooser(self.seed, self.stop)

    def __str__(self) -> str:
        return f"random({self.seed})"


class RandomChooser(Chooser):
    def __init__(self, seed: int, stop: float = 0.5) -> None:
        self.rng = random.Random(seed)
        self.stop = stop

    def choose(self, runnable: Sequence[int], last: Optional[int],
               names: Mapping[int, str]) -> int:
        if self.rng.random() < self.stop:
            return HOST
        return self.rng.choice(runnable)


@dataclass(frozen=True, repr=False)
class PCT(SeededPolicy):
    """``pct(seed,depth)``: probabilistic concurrency testing (Burckhardt et al.,
    ASPLOS'10) over the streams *and the host* (see ``PctChooser``)."""

    seed: int
    depth: int = 3

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError("pct depth must be >= 1")

    def chooser(self) -> Chooser:
        return PctChooser(self.seed, self.depth)

    def __str__(self) -> str:
        return f"pct({self.seed},{self.depth})"


class PctChooser(Chooser):
    """Random initial priorities (above ``depth``) for the host and each stream, drawn when
    the actor first takes part; the highest-priority actor that could go next goes.

    ``depth - 1`` change points are drawn among the first ``steps`` *real choices* --
    questions where more than one actor could go next. The device asks only when some
    stream head may run, and the host could always go on instead, so every question is
    one; points where nothing could run are never asked, and do not count. At the n-th
    real choice, n a change point, the actor that would have gone gets a priority below
    every other (the i-th change: ``depth - i``), as in the paper: the actor about to take
    the step is the one demoted, and the choice is made again.
    """

    def __init__(self, seed: int, depth: int, steps: int = PCT_STEPS) -> None:
        self.rng = random.Random(seed)
        self.changes: List[int] = sorted(self.rng.sample(range(1, steps + 1),
                                                         min(depth - 1, steps)))
        self.depth = depth
        self.low = float(depth)  # changed priorities go below every initial one
        self.prio: Dict[int, float] = {}
        self.real_choices = 0
        self._priority(HOST)

    def _priority(self, actor: int) -> float:
        p = self.prio.get(actor)
        if p is None:  # initial priorities live above ``depth``; ties broken by the draw
            p = self.prio[actor] = self.depth + 1 + self.rng.random() * 100
        return p

    def _best(self, runnable: Sequence[int]) -> int:
        best, best_p = HOST, self.prio[HOST]
        for sid in runnable:
            p = self._priority(sid)
            if p > best_p:
                best, best_p = sid, p
        return best

    def choose(self, runnable: Sequence[int], last: Optional[int],
               names: Mapping[int, str]) -> int:
        self.real_choices += 1  # the host and >= 1 stream could go: a real choice
        best = self._best(runnable)
        if self.changes and self.changes[0] == self.real_choices:
            self.changes.pop(0)
            self.low -= 1
            self.prio[best] = self.low
            best = self._best(runnable)
        return best
