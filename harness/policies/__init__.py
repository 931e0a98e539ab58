"""Layer 3: schedule policies -- *when* runnable stream ops execute on the simulator.

* ``eager``            every op runs at enqueue: a synchronous device.
* ``lazy``             nothing runs until a host sync or an event wait demands it.
* ``stall(a,b,...)``   the named streams run only on demand; the others are eager.
* ``random(seed)``     at each scheduling point, runnable heads run in a seeded random
                       order, and each point stops with probability 1/2.
* ``pct(seed,depth)``  probabilistic concurrency testing (Burckhardt et al., ASPLOS'10):
                       random priorities over the streams *and the host*; the highest
                       actor that could go next goes; ``depth-1`` priority-change points
                       are drawn among the first ``PCT_STEPS`` real choices of the run.

A policy is a value (``choosers.py``): ``parse_policy`` turns a spelling into one, once,
where the spelling comes in (the command line, a report); the value travels from there
into every trial (``offset(i)`` gives trial i's seed) and makes each run's chooser. Every
policy is a deterministic function of its seed and the program: same seed, same choices,
same trace. ``schedule.py`` replays a recorded run's choices without the seed.
"""
from __future__ import annotations

import re
from typing import List, Optional, Sequence

from harness.policies.choosers import (MAX_POLICY_SEED, PCT, PCT_STEPS, Eager, Lazy, PctChooser,
                       RandomChooser, RandomPolicy, SchedulePolicy, Stall)
from harness.policies.schedule import Recorded, Schedules

__all__ = ["Eager", "Lazy", "Stall", "RandomPolicy", "PCT", "Recorded", "Schedules", "SchedulePolicy",
           "RandomChooser", "PctChooser", "parse_policy", "POLICY_HELP", "standard_policies",
           "MAX_POLICY_CHARS", "MAX_POLICY_SEED", "PCT_STEPS"]

MAX_POLICY_CHARS = 200  # the longest spelling accepted (the CLI and the report schema)

POLICY_HELP = "eager | lazy | stall(STREAM[,STREAM..]) | random(SEED) | pct(SEED[,DEPTH])"

_CALL = re.compile(r"^\s*([a-z]+)\s*(?:\((.*)\))?\s*$")


def parse_policy(spec: str) -> SchedulePolicy:
    """The policy a spelling names; ValueError with a one-line reason otherwise. The one
    parser: a spelling is parsed where it comes in, and the value travels."""
    if isinstance(spec, str) and len(spec) > MAX_POLICY_CHARS:
        raise ValueError(f"bad policy {spec[:40]!r}...: longer than {MAX_POLICY_CHARS} "
                         f"characters")
    m = _CALL.match(spec or "")
    if not m:
        raise ValueError(f"bad policy {spec!r}; expected {POLICY_HELP}")
    name, argstr = m.group(1), m.group(2)
    args = [a.strip() for a in argstr.split(",")] if argstr and argstr.strip() else []
    try:
        if name == "eager" and not args:
            return Eager()
        if name == "lazy" and not args:
            return Lazy()
        if name == "stall" and args and all(re.fullmatch(r"[A-Za-z_][\w-]*", a) for a in args):
            return Stall(args)
        if name == "random" and len(args) == 1:
            return RandomPolicy(_nonneg(args[0]))
        if name == "pct" and len(args) in (1, 2):
            depth = _nonneg(args[1]) if len(args) == 2 else 3
            if not 1 <= depth <= 16:
                raise ValueError("pct depth must be in 1..16")
            return PCT(_nonneg(args[0]), depth)
    except ValueError as exc:
        raise ValueError(f"bad policy {spec!r}: {exc}") from None
    raise ValueError(f"bad policy {spec!r}; expected {POLICY_HELP}")


def _nonneg(text: str) -> int:
    v = int(text)
    if v < 0 or v > MAX_POLICY_SEED:
        raise ValueError(f"{text} is out of range")
    return v


def standard_policies(stall: Optional[str] = "forward", seeds: Sequence[int] = (1, 2)) -> List[str]:
    """The policy set the litmus suite and the matrix sweep."""
    pols = ["eager", "lazy"]
    if stall:
        pols.append(f"stall({stall})")
    pols += [f"random({s})" for s in seeds] + [f"pct({s},3)" for s in seeds]
    return pols
