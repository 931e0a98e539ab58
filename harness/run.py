"""A run, resolved: the one value every front door hands the engine.

``Variant`` is one way of running a scenario's code -- its server-arg overrides, and at
most one patch around each trial: a seeded bug (``mutation``, from
the target's ``mutations()``) or a candidate fix of upstream (``fix``, from its
``fixes()``). ``Run`` is a whole run with every default already taken: the
scenario and target *objects*, the variant, fence, backend, policy, trials, stalls and
host-order answers. ``scenarios.resolve.resolve`` makes one from what a user asked (the
CLI, ``replay``, the pytest plugin, the matrix, bench); ``harness.trials.run_repro``
accepts nothing else, so no second place can default a field differently.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Dict, Mapping, Optional, Tuple

from harness.policies import SchedulePolicy
from harness.target import Target
from harness.runtime.load import NONE, Load
from harness.trials.results import code_identity, load_identity, platform_identity
from seams.faults.plan import StallAt
from seams.vocab import Backend, Fence, Verdict

# The most trials one run may ask for: the CLI's --trials and a report that replay reads
# are held to it (a slow simulator trial takes ~1 s: this is hours, not days).
MAX_TRIALS = 10_000

# Two variant names every scenario has: "fixed", the code with the fix (on upstream, a
# candidate fix where the scenario has one), and "as-installed", the code under test with
# no patch at all (what a release shipped; on impl/ the same as "fixed")
AS_INSTALLED, FIXED = "as-installed", "fixed"
# How a run refused because its variant cannot be built on this code says so (a patch that
# no longer fits, a configuration the target drives only on other releases): a release
# table reads it as "not driven" -- the code may be there, specrace did not run it
VARIANT_DISABLED = "is disabled here"


def refused_variant(returncode: int, error: str) -> bool:
    """Did a ``specrace repro`` child refuse its variant on this code (usage exit, the
    refusal's words in its error line) rather than fail?"""
    return returncode == 2 and VARIANT_DISABLED in error


@dataclass(frozen=True)
class Variant:
    name: str
    args: Mapping[str, Any] = field(default_factory=dict)  # ServerArgs overrides
    mutation: Optional[str] = None  # a seeded bug, applied around each trial
    fix: Optional[str] = None  # a candidate fix of upstream, applied around each trial

    def __post_init__(self) -> None:
        if self.mutation is not None and self.fix is not None:
            raise ValueError(f"variant {self.name!r}: a mutation or a fix, not both")
        object.__setattr__(self, "args", MappingProxyType(dict(self.args)))

    def named(self, name: str) -> "Variant":
        return Variant(name, self.args, self.mutation, self.fix)

    def patch(self, target: Target):
        """The patch this variant applies around each trial on ``target`` (a
        ``mutations.Mutation`` or a fix's ``SourcePatch``), or None: the code as it is."""
        if self.fix is not None:
            return target.fix(self.fix)
        if self.mutation is not None:
            return target.mutation(self.mutation)
        return None


@dataclass(frozen=True)
class Run:
    scenario: Any  # a scenarios.base.Scenario
    target: Target
    variant: Variant
    war_barrier: Fence
    backend: Backend  # sim or cuda, never auto
    policy: Optional[SchedulePolicy]  # the simulator's; None on CUDA (the GPU schedules)
    trials: int
    seed: int = 0
    stall_ms: Optional[float] = None  # what was asked (the plan below is what it made)
    stalls: Tuple[StallAt, ...] = ()
    host_order: Mapping[str, Any] = field(default_factory=dict)
    detect: bool = True
    expect: Optional[Verdict] = None  # None: report the verdict, expect nothing
    load: Load = NONE  # background work beside every trial (not beside the reference)
    platform: str = "cuda"  # the hardware the target's code reads itself as running on

    def __post_init__(self) -> None:
        if self.backend not in (Backend.SIM, Backend.CUDA):
            raise ValueError(f"a run's backend is sim or cuda, not {self.backend!r}")
        if not 1 <= self.trials <= MAX_TRIALS:
            raise ValueError(f"trials must be in 1..{MAX_TRIALS}, not {self.trials}")
        if (self.policy is None) != (self.backend == Backend.CUDA):
            raise ValueError("a simulator run has a policy, a CUDA run none")
        object.__setattr__(self, "stalls", tuple(self.stalls))
        object.__setattr__(self, "host_order", MappingProxyType(dict(self.host_order)))

    def identity(self) -> Dict[str, Any]:
        """Every setting that changes what the run does (``expect`` does not: it is what
        the user said, not what ran): the report set's name. ``ReproResult.identity``
        gives the same dict after the run."""
        return {"scenario": self.scenario.name, "target": self.target.name,
                "variant": self.variant.name, "war_barrier": str(self.war_barrier),
                "backend": str(self.backend),
                "policy": str(self.policy) if self.policy is not None else "hardware",
                "stall_ms": self.stall_ms, "trials": self.trials, "seed": self.seed,
                "detect": self.detect, "stall_plan": [s.to_json() for s in self.stalls],
                "host_order": dict(self.host_order),
                "code": code_identity(self.target.describe()), **load_identity(self.load.name),
                **platform_identity(self.platform)}
