"""``repro``: run a scenario for N trials and aggregate a verdict a CI job can gate on.

Trial ``i`` runs the scenario's workload for seed ``seed + i`` (and, for seeded schedule
policies, the policy's seed is offset the same way: ``policy.offset(i)``), so trials
differ but the whole run is a function of its parameters: on the simulator, replaying it
gives the same verdict. On the simulator the result also carries every trial's
*schedule* (a ``Schedule``: the choices its policy made), so ``replay`` can
re-run the trials from the choices alone, without the policies' seeds.
"""
from __future__ import annotations

import contextlib
import dataclasses
import statistics
from typing import TYPE_CHECKING, Callable, Dict, List, Optional

from harness.detect import Race
from harness.target import DoesNotFit
from harness.run import MAX_TRIALS, Run  # noqa: F401  (MAX_TRIALS: read from here too)
from harness.runtime.policy import Schedule
from seams.vocab import Backend

from harness.trials.drive import server_args
from harness.trials.results import ReproResult, TrialSummary
from harness.trials.trial import TrialResult, run_trial

if TYPE_CHECKING:
    from harness.oracle.divergence import Divergence


# Distinct race sites one run records (a site is a pair of code locations: real runs have
# tens; sites past it are not recorded, so a report stays within its schema).
MAX_RACE_SITES = 1_000
MAX_SEED = 2**31 - 1  # a run's --seed (trial i runs workload seed + i)


def run_repro(run: Run, progress: Optional[Callable[[int], None]] = None) -> ReproResult:
    """Run ``run``'s trials and aggregate its verdict (``progress(done)`` after each)."""
    if not isinstance(run, Run):
        raise TypeError(f"run_repro takes a resolved Run (scenarios.resolve), "
                        f"not {type(run).__name__}")
    mutation = run.variant.patch(run.target)
    tally = _Tally()
    for i in range(run.trials):
        # Keep traces until a failing trial is found: its timeline is the one to show
        # (a clean run shows trial 0).
        res = _run_one(run, i, mutation, want_trace=tally.first_trial is None)
        tally.add(i, run.seed + i, res, run.detect)
        if progress is not None:
            progress(i + 1)
    return _result(run, tally)


def _run_one(run: Run, i: int, mutation, want_trace: bool) -> TrialResult:
    """Trial ``i`` of ``run`` (``DoesNotFit`` when the target's code failed its reference
    run: no overlap at all, so no verdict)."""
    target = run.target
    workload = run.scenario.workload(run.seed + i)
    args = server_args(workload, {**run.variant.args, "war_barrier": str(run.war_barrier),
                                  "platform": run.platform}, target)
    detect_now = run.detect  # every trial traced, on CUDA too
    trial_pol = run.policy.offset(i) if run.backend == Backend.SIM else None
    with target.watching() if i == 0 else contextlib.nullcontext():
        res = run_trial(str(run.backend), trial_pol, workload, args, list(run.stalls),
                        target=target, detect_races=detect_now,
                        keep_trace=want_trace and detect_now, mutation=mutation,
                        answers=dict(run.host_order), load=run.load)
    if res.divergence is not None and res.divergence.where == "reference":
        raise DoesNotFit(
            f"{target.label()} does not fit the {target.name} target: "
            f"{res.divergence.message} (no verdict: the code ran without any overlap)",
            problems=["run with SPECRACE_TRACEBACK=1 to see where it raised"])
    if _unfit_crash(res.divergence):
        raise DoesNotFit(
            f"{target.label()} does not fit the {target.name} target: "
            f"{res.divergence.message} (no verdict: an exception that says the code was "
            f"called with what it does not take -- a path only the trial ran, which "
            f"specrace's build of the server does not fit -- not a stale value)",
            problems=["run with SPECRACE_TRACEBACK=1 to see where it raised"])
    return res


# Exceptions that say code was handed what it does not take (an attribute, a signature, a
# module, a stand-in refusing a shape): a trial that raises one took a path specrace's
# build of the server does not fit. A stale value makes wrong values -- an index out of
# range, a device assert, a failed check -- not these; a crash of any other kind in the
# trial, which the reference run did not have, stays a divergence.
UNFIT_EXCEPTIONS = ("AttributeError", "TypeError", "NameError", "ImportError",
                    "ModuleNotFoundError", "NotImplementedError")


def _unfit_crash(d: Optional["Divergence"]) -> bool:
    return (d is not None and d.kind == "crash" and d.where != "reference"
            and str(d.observed).split(":", 1)[0] in UNFIT_EXCEPTIONS)


@dataclasses.dataclass
class _Tally:
    """The trials' results so far, aggregated as each one ends."""
    per_trial: List[TrialSummary] = dataclasses.field(default_factory=list)
    races: Dict[tuple, Race] = dataclasses.field(default_factory=dict)
    first_div: Optional[Divergence] = None
    first_trial: Optional[int] = None
    shown: Optional[TrialResult] = None  # the TrialResult the report shows (its trace, its races)
    schedules: List[Optional[Schedule]] = dataclasses.field(default_factory=list)
    times: List[float] = dataclasses.field(default_factory=list)

    def add(self, i: int, seed: int, res: TrialResult, detected: bool) -> None:
        """Trial ``i`` (workload seed ``seed``; ``detected``: traced for races) ends."""
        self.times.append(res.wall_ms)
        self._add_races(res.races)
        if res.reproduced and self.first_trial is None:
            self.first_trial, self.first_div = i, res.divergence
            self.shown = res
        elif i == 0:
            self.shown = res
        # none when the trial never ran (its reference run crashed)
        self.schedules.append(res.schedule)
        self.per_trial.append(TrialSummary(i, seed, res.reproduced,
                                           res.divergence.kind if res.divergence else None,
                                           len(res.races), detected, round(res.wall_ms, 3),
                                           res.checked))

    def _add_races(self, races: List[Race]) -> None:
        """Count each race into its site; a new site past ``MAX_RACE_SITES`` is dropped."""
        for r in races:
            old = self.races.get(r.key())
            if old is None and len(self.races) < MAX_RACE_SITES:
                self.races[r.key()] = dataclasses.replace(r)
            elif old is None:
                continue
            else:
                old.count += r.count


def _result(run: Run, tally: _Tally) -> ReproResult:
    """The run's verdict from its trials' tally."""
    scenario, target, variant = run.scenario, run.target, run.variant
    sim = run.backend == Backend.SIM
    per_trial, times, shown = tally.per_trial, tally.times, tally.shown
    return ReproResult(
        scenario=scenario.name, target=target.name, target_info=target.describe(),
        variant=variant.name, war_barrier=str(run.war_barrier), backend=str(run.backend),
        policy=str(run.policy) if sim else "hardware", stall_ms=run.stall_ms,
        stall_plan=list(run.stalls), host_order=dict(run.host_order), seed=run.seed,
        trials=run.trials, reproduced=sum(t.reproduced for t in per_trial),
        first_trial=tally.first_trial,
        median_trial_ms=round(statistics.median(times), 3) if times else None,
        expect=None if run.expect is None else str(run.expect),
        expected_by_scenario=scenario.expected(variant.name, str(run.war_barrier)),
        first_divergence=tally.first_div, races=list(tally.races.values()),
        trial_results=per_trial, load=run.load.name, platform=run.platform,
        schedules=tally.schedules if sim else None, trace=shown.trace,
        trace_races=shown.races)
