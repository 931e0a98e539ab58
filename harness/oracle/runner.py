"""Run the engine on a runtime under a fault plan, and judge it.

``run_trial`` = build the engine, install the plan, drive the workload, then apply the
oracles: stale values against the synchronous reference (same workload, same backend,
no overlap, eager device), outputs token for token, the grammar oracle for constrained
requests, and the happens-before detector over the trace.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import targets
from harness import faults
from harness.detect import Race, detect
from harness.policies import Eager, parse_policy
from harness.policies.faultplan import FaultPlan, StallAt
from harness.runtime import open_runtime

from .grammar import check_constrained_outputs
from .stale import Recorder, Reference, StaleValue, StaleValueOracle
from .workload import Workload

MAX_ITERATIONS = 400  # a run that does not finish by then is a finding, not a hang


@dataclass
class TrialResult:
    divergence: Optional[dict]
    races: List[Race]
    wall_ms: float
    checked: int
    trace: Any = None  # kept when asked (for the timeline of the first failing trial)
    outputs: Dict[int, List[int]] = field(default_factory=dict)
    iterations: int = 0  # scheduler iterations the run took (0: it did not finish)

    @property
    def reproduced(self) -> bool:
        return self.divergence is not None or bool(self.races)


def server_args(workload: Workload, overrides: Dict[str, Any]):
    """ServerArgs for a workload (its draft length and request pool) and a variant's
    overrides; a variant's ``mutation`` key is not a server arg."""
    from impl.scheduler import ServerArgs
    args = ServerArgs(draft_token_num=workload.draft_token_num)
    if workload.req_pool_size is not None:
        args = dataclasses.replace(args, req_pool_size=workload.req_pool_size)
    return dataclasses.replace(args, **{k: v for k, v in overrides.items() if k != "mutation"})


_BACKEND_CACHE: Dict[str, Any] = {}


def grammar_backend(target: str = "impl"):
    """One grammar backend per target and process (compiling grammars is the expensive
    part)."""
    gb = _BACKEND_CACHE.get(target)
    if gb is None:
        gb = _BACKEND_CACHE[target] = targets.get(target).grammar_backend()
    return gb


def drive(runtime, workload: Workload, args, plan: FaultPlan,
          target: str = "impl", stats: Optional[Dict[str, int]] = None) -> Dict[int, List[int]]:
    """Run ``workload`` through a fresh scheduler of ``target`` on ``runtime`` with
    ``plan`` installed (``stats``, if given, gets the scheduler iterations it took)."""
    tgt = targets.get(target)
    needs_grammar = any(r.schema for r in workload.requests)
    gb = grammar_backend(target) if needs_grammar else None
    plan.runtime = runtime
    with tgt.variant(args):
        sched = tgt.scheduler(args, runtime.device, grammar_backend=gb)
        for name, stream in sched.streams.items():
            if stream is not None:
                runtime.label(stream, name)
        pending = sorted(workload.requests, key=lambda r: (r.arrive, r.rid))
        reqs = {}
        with faults.installed(plan):
            while (pending or sched.has_work()) and sched.iteration < MAX_ITERATIONS:
                while pending and pending[0].arrive <= sched.iteration:
                    spec = pending.pop(0)
                    grammar = gb.grammar_for_json_schema(spec.schema) if spec.schema else None
                    reqs[spec.rid] = tgt.request(spec.rid, spec.prompt, spec.max_new_tokens,
                                                 grammar)
                    sched.add_request(reqs[spec.rid])
                sched.step()
            sched.run_to_completion(MAX_ITERATIONS)
        runtime.synchronize()
        if stats is not None:
            stats["iterations"] = sched.iteration
    if pending or sched.has_work():
        raise RuntimeError(f"engine did not finish within {MAX_ITERATIONS} iterations")
    return {rid: r.output_ids for rid, r in reqs.items()}


# Workloads recur across a matrix's cells (each probe's few seeds) but not across a
# repro's trials: a few recent entries serve the one, and the other's memory stays bounded.
REFERENCE_CACHE_SIZE = 16
_REFERENCE_CACHE: "collections.OrderedDict[str, Reference]" = collections.OrderedDict()


class ReferenceCrash(Exception):
    """The synchronous reference run itself crashed: the bug is in both runs."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.exc = exc


def reference(workload: Workload, args, backend: str, target: str = "impl") -> Reference:
    """The synchronous reference: the target's own engine, fixed code, no overlap, no CUDA
    graphs, on an eager device (an LRU cache holds the last ``REFERENCE_CACHE_SIZE``). ``ReferenceCrash``
    if the engine fails in it."""
    key = json.dumps([target, backend, workload.to_json(), args.spec_algorithm])
    ref = _REFERENCE_CACHE.get(key)
    if ref is not None:
        _REFERENCE_CACHE.move_to_end(key)
        return ref
    rec = Recorder()
    ref_args = dataclasses.replace(args, overlap=False, relay="future_map",
                                   war_barrier="coarse", cuda_graph=False)
    with open_runtime(backend, Eager(), trace=False) as rt:  # a backend error propagates
        try:
            outputs = drive(rt, workload, ref_args, FaultPlan(observer=rec), target)
        except Exception as exc:
            _quiesce(rt)
            raise ReferenceCrash(exc) from exc
    ref = _REFERENCE_CACHE[key] = Reference(rec.results, outputs)
    while len(_REFERENCE_CACHE) > REFERENCE_CACHE_SIZE:
        _REFERENCE_CACHE.popitem(last=False)
    return ref


def run_trial(backend: str, policy: str, workload: Workload, args, stalls: List[StallAt],
              detect_races: bool = True, keep_trace: bool = False,
              stop_early: bool = True, mutation: Any = None,
              answers: Optional[Dict[str, Any]] = None,
              target: str = "impl") -> TrialResult:
    """One run. ``mutation`` (a ``scenarios.mutations.Mutation``) is applied around the run
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
    pol = parse_policy(policy) if backend == "sim" else None
    t0 = time.perf_counter()
    outputs: Dict[int, List[int]] = {}
    stats: Dict[str, int] = {}
    patch = mutation.applied() if mutation is not None else contextlib.nullcontext()
    with open_runtime(backend, pol, trace=detect_races) as rt, patch:
        try:
            outputs = drive(rt, workload, args, plan, target, stats)
            oracle.check_outputs(outputs)
            if any(r.schema for r in workload.requests):
                check_constrained_outputs(workload, outputs, oracle, grammar_backend(target))
        except StaleValue:
            pass
        except Exception as exc:  # a crash of the engine is a finding, not a harness error
            oracle.note_crash(exc, where="trial")
        finally:
            _quiesce(rt)
        wall = (time.perf_counter() - t0) * 1000.0
        races = detect(rt.trace) if detect_races and rt.trace is not None else []
        trace = rt.trace if keep_trace else None
    return TrialResult(oracle.first, races, wall, oracle.checked, trace, outputs,
                       stats.get("iterations", 0))


def _quiesce(rt) -> None:
    """Let pending device work finish (errors included) before the runtime closes."""
    try:
        rt.synchronize()
    except Exception:
        pass
