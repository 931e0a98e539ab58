"""One judged run: drive the engine under a fault plan, then hand it to the judges.

``run_trial`` = build the engine, install the plan, drive the workload, then apply the
oracles: stale values against the synchronous reference (same workload, same backend,
no overlap, eager device), outputs token for token, the model oracle (each unconstrained
output is the target model's greedy continuation: reference-free), the grammar oracle
for constrained requests, and the happens-before detector over the trace.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from harness.detect import Race, detect
from harness.oracle.divergence import Divergence
from harness.oracle.outputs import judge_outputs
from harness.oracle.stale import Reference, StaleValue, StaleValueOracle
from harness.oracle.workload import Workload
from harness.policies import SchedulePolicy
from seams.faults.plan import FaultPlan, StallAt
from harness.runtime import open_runtime
from harness.runtime.load import NONE, Load
from harness.runtime.policy import Schedule
from harness.target import Target

from harness.trials.drive import drive, grammar_backend
from harness.trials.reference import ReferenceCrash, quiesce, reference
from seams.vocab import Backend

if TYPE_CHECKING:
    from harness.runtime.trace import Trace
    from mutations.base import Mutation


@dataclass
class TrialResult:
    divergence: Optional[Divergence]
    races: List[Race]
    wall_ms: float
    checked: int
    trace: Optional[Trace] = None  # kept when asked (for the timeline of the first failing trial)
    outputs: Dict[int, List[int]] = field(default_factory=dict)
    iterations: int = 0  # scheduler iterations the run took (0: it did not finish)
    schedule: Optional[Schedule] = None  # the simulator's (trace.schedule)

    @property
    def reproduced(self) -> bool:
        return self.divergence is not None or bool(self.races)


def run_trial(backend: str, policy: Optional[SchedulePolicy], workload: Workload, args,
              stalls: List[StallAt], target: Target,
              detect_races: bool = True, keep_trace: bool = False,
              stop_early: bool = True, mutation: Optional[Mutation] = None,
              answers: Optional[Dict[str, Any]] = None, load: Load = NONE) -> TrialResult:
    """One run of ``workload`` on ``target``'s engine; ``policy`` is the simulator's (ignored on CUDA, whose schedule is the
    GPU's). ``mutation`` (a ``mutations.Mutation``) is applied around the run
    only -- never around the reference. A crash of the engine, in the run or in the
    reference, is a finding (divergence kind ``crash``/``deadlock``), never an exception."""
    try:
        ref = reference(workload, args, backend, target)
    except ReferenceCrash as crash:
        oracle = StaleValueOracle(Reference({}, {}))
        oracle.note_crash(crash.exc, where="reference")
        return TrialResult(oracle.first, [], 0.0, 0)
    oracle = StaleValueOracle(ref, stop_early=stop_early)
    plan = FaultPlan(stalls=list(stalls), answers=dict(answers or {}), observer=oracle)
    pol = policy if backend == Backend.SIM else None
    t0 = time.perf_counter()
    outputs: Dict[int, List[int]] = {}
    stats: Dict[str, int] = {}
    patch = mutation.applied() if mutation is not None else contextlib.nullcontext()
    with open_runtime(backend, pol, trace=detect_races, load=load) as rt, patch:
        try:
            outputs = drive(rt, workload, args, plan, target, stats)
            judge_outputs(workload, outputs, oracle, lambda: grammar_backend(target))
        except StaleValue:
            pass
        except Exception as exc:  # a crash of the engine is a finding, not a harness error
            oracle.note_crash(exc, where="trial")
        finally:
            quiesce(rt)
        wall = (time.perf_counter() - t0) * 1000.0
        races = detect(rt.trace) if detect_races and rt.trace is not None else []
        trace = rt.trace if keep_trace else None
        schedule = rt.trace.schedule if rt.backend == Backend.SIM else None
    return TrialResult(oracle.first, races, wall, oracle.checked, trace, outputs,
                       stats.get("iterations", 0), schedule)
