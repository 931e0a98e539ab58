"""Layer 3: schedule policies -- *when* runnable stream ops execute on the simulator.

* ``eager``            every op runs at enqueue: a synchronous device.
* ``lazy``             nothing runs until a host sync or an event wait demands it.
* ``stall(a,b,...)``   the named streams run only on demand; the others are eager.
* ``random(seed)``     at each scheduling point, runnable heads run in a seeded random
                       order, and each point stops with probability 1/2.
* ``pct(seed,depth)``  probabilistic concurrency testing (Burckhardt et al., ASPLOS'10):
                       random priorities over the streams *and the host*; the highest
                       runnable actor above the host runs; ``depth-1`` priority-change
                       points are drawn in the first ``steps`` scheduling steps.

Every policy is a deterministic function of its seed and the program: same seed, same
execution order, same trace.
"""
from __future__ import annotations

import random
import re
from typing import Dict, List, Optional, Sequence

from ..runtime.policy import Policy, RunAll
from ..runtime.trace import HOST

__all__ = ["Eager", "Lazy", "Stall", "RandomPolicy", "PCT", "parse_policy", "POLICY_HELP",
           "standard_policies", "offset_seed", "MAX_POLICY_CHARS", "MAX_POLICY_SEED"]

MAX_POLICY_CHARS = 200  # the longest spelling accepted (the CLI and the report schema)
MAX_POLICY_SEED = 2**63 - 1  # seeds are 0..MAX_POLICY_SEED

Eager = RunAll


class Lazy(Policy):
    name = "lazy"

    def on_point(self, device, stream) -> None:
        return None


class Stall(Policy):
    """The named streams execute only when something waits for them."""

    def __init__(self, streams: Sequence[str]) -> None:
        self.stalled = tuple(streams)
        self.name = f"stall({','.join(self.stalled)})"

    def _free(self, device) -> List:
        names = device.trace.stream_names
        return [s for s in device.streams if names.get(s.sid) not in self.stalled]

    def on_point(self, device, stream) -> None:
        device.run_runnable(self._free(device))

    def runs_at_enqueue(self, device, stream) -> bool:
        return device.trace.stream_names.get(stream.sid) not in self.stalled


class RandomPolicy(Policy):
    def __init__(self, seed: int, stop: float = 0.5) -> None:
        self.seed = seed
        self.stop = stop
        self.name = f"random({seed})"
        self.rng = random.Random(seed)

    def bind(self, device) -> None:
        self.rng = random.Random(self.seed)

    def on_point(self, device, stream) -> None:
        while True:
            ready = [s for s in device.streams if device.runnable(s)]
            if not ready or self.rng.random() < self.stop:
                return
            device.run_head(self.rng.choice(ready))


class PCT(Policy):
    def __init__(self, seed: int, depth: int = 3, steps: int = 400) -> None:
        if depth < 1:
            raise ValueError("pct depth must be >= 1")
        self.seed, self.depth, self.steps = seed, depth, steps
        self.name = f"pct({seed},{depth})"
        self.bind(None)

    def bind(self, device) -> None:
        self.rng = random.Random(self.seed)
        self.prio: Dict[int, float] = {}
        self.step = 0
        self.changes = sorted(self.rng.sample(range(1, self.steps + 1),
                                              min(self.depth - 1, self.steps)))
        self.low = float(self.depth)  # changed priorities go below every initial one
        self._priority(HOST)

    def _priority(self, actor: int) -> float:
        p = self.prio.get(actor)
        if p is None:  # initial priorities live above ``depth``; ties broken by the draw
            p = self.prio[actor] = self.depth + 1 + self.rng.random() * 100
        return p

    def _tick(self, actor: int) -> None:
        self.step += 1
        while self.changes and self.changes[0] <= self.step:
            self.changes.pop(0)
            self.low -= 1
            self.prio[actor] = self.low

    def on_point(self, device, stream) -> None:
        self._tick(HOST)
        while True:
            host = self._priority(HOST)
            best, best_p = None, host
            for s in device.streams:
                p = self._priority(s.sid)
                if p > best_p and device.runnable(s):
                    best, best_p = s, p
            if best is None:
                return
            device.run_head(best)
            self._tick(best.sid)


POLICY_HELP = "eager | lazy | stall(STREAM[,STREAM..]) | random(SEED) | pct(SEED[,DEPTH])"

_CALL = re.compile(r"^\s*([a-z]+)\s*(?:\((.*)\))?\s*$")


def parse_policy(spec: str) -> Policy:
    """Build a policy from its spelling; ValueError with a one-line reason otherwise."""
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


def offset_seed(spec: str, i: int) -> str:
    """The spelling of ``spec`` with its seed moved on by ``i`` (``random(7)`` ->
    ``random(7+i)``), wrapping around within 0..MAX_POLICY_SEED so every trial's policy
    stays valid; unseeded policies are returned as they are. ValueError for a bad spec."""
    pol = parse_policy(spec)
    if isinstance(pol, RandomPolicy):
        return f"random({(pol.seed + i) % (MAX_POLICY_SEED + 1)})"
    if isinstance(pol, PCT):
        return f"pct({(pol.seed + i) % (MAX_POLICY_SEED + 1)},{pol.depth})"
    return spec


def standard_policies(stall: Optional[str] = "forward", seeds: Sequence[int] = (1, 2)) -> List[str]:
    """The policy set the litmus suite and the matrix sweep."""
    pols = ["eager", "lazy"]
    if stall:
        pols.append(f"stall({stall})")
    pols += [f"random({s})" for s in seeds] + [f"pct({s},3)" for s in seeds]
    return pols
