"""Fault plans: data that says where to stall which stream, and how to answer the
engine's host-order questions. A plan is installed through ``seams.faults`` and the
engine reaches it only through named fault points.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from seams.faults import check_point, check_question


@dataclass(frozen=True)
class StallAt:
    point: str  # fault point name, e.g. "forward.after_read_done" (seams.faults.FAULT_POINTS)
    ms: Optional[float]  # None: until forced (simulator) / the default long stall (CUDA)
    every: int = 1  # stall at every n-th hit (1 = each time)

    def __post_init__(self) -> None:
        check_point(self.point)

    def to_json(self) -> dict:
        return {"point": self.point, "ms": self.ms, "every": self.every}


@dataclass
class FaultPlan:
    stalls: List[StallAt] = field(default_factory=list)
    answers: Dict[str, Any] = field(default_factory=dict)
    runtime: Any = None  # set when installed for a run
    observer: Optional[Callable[[str, dict], None]] = None
    hits: Dict[str, int] = field(default_factory=dict)
    once: List[StallAt] = field(default_factory=list)  # one-shot stalls, consumed at a hit

    once_answers: Dict[str, Any] = field(default_factory=dict)  # consumed at the next ask

    def __post_init__(self) -> None:
        for name in self.answers:  # a misspelt question would never be answered
            check_question(name)

    def answer_next(self, name: str, value: Any) -> None:
        """Answer the next ``ask(name)`` with ``value`` (state machines' reorder rule)."""
        self.once_answers[check_question(name)] = value

    def stall_next(self, point: str, ms: Optional[float] = None) -> None:
        """Stall the current stream the next time ``point`` is hit (state machines)."""
        self.once.append(StallAt(point, ms))

    def observe(self, name: str, values: dict) -> None:
        if self.observer is not None:
            self.observer(name, values)

    def hit(self, name: str, ctx: dict) -> None:
        n = self.hits[name] = self.hits.get(name, 0) + 1
        for st in self.stalls:
            if st.point == name and n % st.every == 0 and self.runtime is not None:
                self.runtime.stall(st.ms)
        for st in [s for s in self.once if s.point == name]:
            self.once.remove(st)
            if self.runtime is not None:
                self.runtime.stall(st.ms)

    def ask(self, name: str, default: Any, ctx: dict) -> Any:
        """The plan's answer: a constant, or ``{"every": n}`` -- True at every n-th ask
        (e.g. alternate overlapped and synchronous steps)."""
        if name in self.once_answers:
            return self.once_answers.pop(name)
        if name not in self.answers:
            return default
        answer = self.answers[name]
        if isinstance(answer, dict) and "every" in answer:
            n = self.hits[name] = self.hits.get(name, 0) + 1
            return n % int(answer["every"]) == 0
        return answer

    def to_json(self) -> dict:
        return {"stalls": [s.to_json() for s in self.stalls], "answers": dict(self.answers)}
