"""``repro``: run a scenario for N trials and aggregate a verdict a CI job can gate on.

Trial ``i`` runs the scenario's workload for seed ``seed + i`` (and, for seeded schedule
policies, the policy's seed is offset the same way: ``policy.offset(i)``), so trials
differ but the whole run is a function of its parameters: on the simulator, replaying it
gives the same verdict. On the simulator the result also carries every trial's
*schedule* (a ``Schedule``: the choices its policy made), so ``replay`` can
re-run the trials from the choices alone, without the policies' seeds.
"""
from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import targets
from harness.detect import Race
from harness.policies import SchedulePolicy
from seams.faults.plan import StallAt
from harness.runtime import resolve_backend
from harness.runtime.policy import Schedule

from harness.trials.drive import server_args
from harness.trials.results import ReproResult, TrialSummary, code_identity
from harness.trials.trial import run_trial

# The most trials one run may ask for: the CLI's --trials and a report that replay reads
# are held to it (a slow simulator trial takes ~1 s: this is hours, not days).
MAX_TRIALS = 10_000
# Distinct race sites one run records (a site is a pair of code locations: real runs have
# tens; sites past it are not recorded, so a report stays within its schema).
MAX_RACE_SITES = 1_000
MAX_SEED = 2**31 - 1  # a run's --seed (trial i runs workload seed + i)


@dataclass
class ReproConfig:
    scenario: str
    variant: Optional[str] = None
    war_barrier: str = "fine"
    backend: str = "auto"
    policy: Optional[SchedulePolicy] = None  # parsed once, where it came in
    stall_ms: Optional[float] = None
    trials: Optional[int] = None
    seed: int = 0
    expect: Optional[str] = None  # clean | race; None: report the verdict, expect nothing
    detect: bool = True
    target: str = "impl"  # the code under test: impl/ or the installed sglang
    # the fault plan (None: the scenario's, for ``stall_ms``) and the host-order answers
    # (None: the scenario's); ``replay`` passes a report's recorded ones
    stall_plan: Optional[List[StallAt]] = None
    host_order: Optional[Dict[str, Any]] = None

    def identity(self, scenario) -> Dict[str, Any]:
        """Every setting that changes what the run does, defaults resolved (``expect``
        does not: it is what the user said, not what ran): the report set's name."""
        backend = resolve_backend(self.backend)
        return {"scenario": scenario.name, "target": self.target,
                "variant": self.variant or scenario.default_variant,
                "war_barrier": self.war_barrier, "backend": backend,
                "policy": str(self.policy or scenario.default_policy) if backend == "sim"
                else "hardware",
                "stall_ms": self.stall_ms, "trials": self._trials(scenario, backend),
                "seed": self.seed, "detect": self.detect,
                "stall_plan": [s.to_json() for s in self._stalls(scenario)],
                "host_order": self._answers(scenario),
                "code": code_identity(targets.get(self.target).describe())}

    def _trials(self, scenario, backend: str) -> int:
        return self.trials or (scenario.cuda_trials if backend == "cuda"
                               else scenario.sim_trials)

    def _stalls(self, scenario) -> List[StallAt]:
        return list(self.stall_plan if self.stall_plan is not None
                    else scenario.stalls(self.stall_ms))

    def _answers(self, scenario) -> Dict[str, Any]:
        return dict(self.host_order if self.host_order is not None else scenario.answers)


def run_repro(cfg: ReproConfig, scenario, progress: Optional[Callable[[int], None]] = None
              ) -> ReproResult:
    backend = resolve_backend(cfg.backend)
    target = targets.get(cfg.target)
    variant = cfg.variant or scenario.default_variant
    policy = cfg.policy or scenario.default_policy
    trials = cfg._trials(scenario, backend)
    if not 1 <= trials <= MAX_TRIALS:
        raise ValueError(f"trials must be in 1..{MAX_TRIALS}, not {trials}")
    stalls, answers = cfg._stalls(scenario), cfg._answers(scenario)
    per_trial: List[TrialSummary] = []
    races: Dict[tuple, Race] = {}
    first_div = None
    first_trial = None
    shown = None  # the TrialResult the report shows (its trace, its races)
    schedules: List[Optional[Schedule]] = []
    times: List[float] = []
    for i in range(trials):
        workload = scenario.workload(cfg.seed + i)
        args = server_args(workload, {**scenario.variants[variant], "war_barrier": cfg.war_barrier})
        # Keep traces until a failing trial is found: its timeline is the one to show
        # (a clean run shows trial 0).
        want_trace = first_trial is None
        detect_now = cfg.detect  # every trial traced, on CUDA too
        trial_pol = policy.offset(i) if backend == "sim" else None
        res = run_trial(backend, trial_pol, workload, args, stalls, detect_races=detect_now,
                        keep_trace=want_trace and detect_now,
                        mutation=scenario.mutation(variant, cfg.target),
                        answers=answers, target=cfg.target)
        times.append(res.wall_ms)
        for r in res.races:
            old = races.get(r.key())
            if old is None and len(races) < MAX_RACE_SITES:
                races[r.key()] = dataclasses.replace(r)
            elif old is None:
                continue
            else:
                old.count += r.count
        if res.reproduced and first_trial is None:
            first_trial, first_div = i, res.divergence
            shown = res
        elif i == 0:
            shown = res
        # none when the trial never ran (its reference run crashed)
        schedules.append(res.schedule)
        per_trial.append(TrialSummary(i, cfg.seed + i, res.reproduced,
                                      res.divergence.kind if res.divergence else None,
                                      len(res.races), detect_now, round(res.wall_ms, 3),
                                      res.checked))
        if progress is not None:
            progress(i + 1)
    sim = backend == "sim"
    return ReproResult(
        scenario=scenario.name, target=cfg.target, target_info=target.describe(),
        variant=variant, war_barrier=cfg.war_barrier, backend=backend,
        policy=str(policy) if sim else "hardware", stall_ms=cfg.stall_ms, stall_plan=stalls,
        host_order=answers, seed=cfg.seed, trials=trials,
        reproduced=sum(t.reproduced for t in per_trial), first_trial=first_trial,
        median_trial_ms=round(statistics.median(times), 3) if times else None,
        expect=cfg.expect, expected_by_scenario=scenario.expected(variant, cfg.war_barrier),
        first_divergence=first_div, races=list(races.values()), trial_results=per_trial,
        schedules=schedules if sim else None, trace=shown.trace, trace_races=shown.races)
