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
sync or an event wait that demands it. The device records every answer, in order, in
``trace.schedule``: the schedule that ran, which ``harness.policies.schedule`` replays.

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

from typing import Mapping, Optional, Sequence

from .trace import HOST

__all__ = ["HOST", "Chooser", "Policy", "RunAll", "first_from"]


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
