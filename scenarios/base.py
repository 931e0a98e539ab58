"""What a scenario is: a workload generator, a fault plan, variants, expected verdicts.

Scenario files stay short and declarative; ``harness.trials`` runs them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from harness.oracle.workload import Workload
from harness.policies import Eager, SchedulePolicy
from harness.run import AS_INSTALLED, FIXED, Variant  # noqa: F401  (re-exported)
from seams.faults.plan import StallAt




def stall_at(*points: str, default_ms: Optional[float] = None
             ) -> Callable[[Optional[float]], List[StallAt]]:
    """A scenario's stall plan: a stall at each of ``points``, each for ``--stall-ms`` when
    given, else for ``default_ms`` (None: the backend's own -- until forced on the
    simulator, the default long stall on CUDA)."""
    return lambda ms: [StallAt(point, default_ms if ms is None else ms) for point in points]


def with_bug(mutation: str, **args: Any) -> Variant:
    """A variant that runs a seeded bug (the target's ``mutations()``) with server args ``args``."""
    return Variant("", args, mutation=mutation)


def with_fix(fix: str, **args: Any) -> Variant:
    """A variant that runs a candidate fix of upstream (the target's ``fixes()``)."""
    return Variant("", args, fix=fix)


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    workload: Callable[[int], Workload]  # seed -> workload
    stalls: Callable[[Optional[float]], List[StallAt]]  # stall ms -> plan
    # variant name -> its server-arg overrides (a plain mapping) or a Variant
    # (``with_bug`` / ``with_fix``); read back, every value is a named ``Variant``
    variants: Dict[str, Union[Mapping[str, Any], Variant]]
    default_variant: str
    # (variant, war_barrier) -> "race" | "clean"; war_barrier None = either
    expect: Dict[Tuple[str, Optional[str]], str] = field(default_factory=dict)
    # host-order decisions (fault-point ``ask`` answers), e.g. {"schedule.disable_overlap":
    # {"every": 2}} alternates overlapped and synchronous steps
    answers: Dict[str, object] = field(default_factory=dict)
    default_policy: SchedulePolicy = Eager()  # a value: parsed spellings come in at the CLI
    sim_trials: int = 20
    cuda_trials: int = 200

    def __post_init__(self) -> None:
        for name, v in list(self.variants.items()):
            self.variants[name] = (v.named(name) if isinstance(v, Variant)
                                   else Variant(name, v))
        # "as-installed" (harness.run): the sglang target's default
        if AS_INSTALLED not in self.variants:
            self.variants[AS_INSTALLED] = Variant(AS_INSTALLED, self.variants[FIXED].args)

    def expected(self, variant: str, war_barrier: str) -> str:
        return self.expect.get((variant, war_barrier), self.expect.get((variant, None), "clean"))
