"""What a scenario is: a workload generator, a fault plan, variants, expected verdicts.

Scenario files stay short and declarative; ``harness.trials`` runs them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from harness.oracle.workload import Workload
from seams.faults.plan import StallAt
from harness.policies import Eager, SchedulePolicy


AS_INSTALLED, FIXED = "as-installed", "fixed"


def stall_at(point: str, default_ms: Optional[float] = None
             ) -> Callable[[Optional[float]], List[StallAt]]:
    """A scenario's stall plan: one stall at ``point`` for ``--stall-ms`` when given, else
    for ``default_ms`` (None: the backend's own -- until forced on the simulator, the
    default long stall on CUDA)."""
    return lambda ms: [StallAt(point, default_ms if ms is None else ms)]


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    workload: Callable[[int], Workload]  # seed -> workload
    stalls: Callable[[Optional[float]], List[StallAt]]  # stall ms -> plan
    # variant -> ServerArgs overrides; the key "mutation" names a seeded bug
    # (mutations.catalogue), "fix" a candidate fix of upstream
    # (mutations.fixes), applied around each trial
    variants: Dict[str, Dict[str, object]]
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
        # "as-installed": the code under test with no patch at all -- what a released
        # sglang shipped (the sglang target's default); on impl/ the same as "fixed"
        self.variants.setdefault(AS_INSTALLED, dict(self.variants[FIXED]))

    def mutation(self, variant: str, target: str = "impl"):
        """The patch a variant applies on ``target`` around each trial: a seeded bug
        (``"mutation"``) or a candidate fix of upstream (``"fix"``); None: the code as it
        is."""
        fix = self.variants[variant].get("fix")
        if fix is not None:
            from mutations.fixes import get_fix
            return get_fix(target, fix)
        name = self.variants[variant].get("mutation")
        if name is None:
            return None
        from mutations.catalogue import get
        return get(target, name)

    def expected(self, variant: str, war_barrier: str) -> str:
        return self.expect.get((variant, war_barrier), self.expect.get((variant, None), "clean"))
