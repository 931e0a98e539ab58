"""Run the engine on a runtime under a fault plan, and judge it.

``run_trial`` = build the engine, install the plan, drive the workload, then apply the
oracles: stale values against the synchronous reference (same workload, same backend,
no overlap, eager device), outputs token for token, the grammar oracle for constrained
requests, and the happens-before detector over the trace.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

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

    @property
    def reproduced(self) -> bool:
        return self.divergence is not None or bool(self.races)


def server_args(workload: Workload, overrides: Dict[str, Any]):
    """ServerArgs for a workload; a variant's ``mutation`` key is not a server arg."""
    from impl.scheduler import ServerArgs
    args = ServerArgs(draft_token_num=workload.draft_token_num)
    return dataclasses.replace(args, **{k: v for k, v in overrides.items() if k != "mutation"})


_BACKEND_CACHE: Dict[str, Any] = {}


def grammar_backend():
    """One xgrammar backend per process (compiling grammars is the expensive part)."""
    gb = _BACKEND_CACHE.get("grammar")
    if gb is None:
        from impl.grammar import GrammarBackend
        from impl.vocab import EOS_ID, VOCAB
        gb = _BACKEND_CACHE["grammar"] = GrammarBackend(VOCAB, EOS_ID)
    return gb


def drive(runtime, workload: Workload, args, plan: FaultPlan) -> Dict[int, List[int]]:
    """Run ``workload`` through a fresh scheduler on ``runtime`` with ``plan`` installed."""
    from impl.scheduler import Req, Scheduler
    needs_grammar = any(r.schema for r in workload.requests)
    gb = grammar_backend() if needs_grammar else None
    sched = Scheduler(args, runtime.device, grammar_backend=gb)
    for name, stream in sched.streams.items():
        runtime.label(stream, name)
    pending = sorted(workload.requests, key=lambda r: (r.arrive, r.rid))
    reqs = {}
    plan.runtime = runtime
    with faults.installed(plan):
        while (pending or sched.has_work()) and sched.iteration < MAX_ITERATIONS:
            while pending and pending[0].arrive <= sched.iteration:
                spec = pending.pop(0)
                grammar = gb.grammar_for_json_schema(spec.schema) if spec.schema else None
                reqs[spec.rid] = Req(spec.rid, list(spec.prompt), spec.max_new_tokens, grammar)
                sched.add_request(reqs[spec.rid])
            sched.step()
        sched.run_to_completion(MAX_ITERATIONS)
    runtime.synchronize()
    if pending or sched.has_work():
        raise RuntimeError(f"engine did not finish within {MAX_ITERATIONS} iterations")
    return {rid: r.output_ids for rid, r in reqs.items()}


_REFERENCE_CACHE: Dict[str, Reference] = {}


def reference(workload: Workload, args, backend: str) -> Reference:
    """The synchronous reference: no overlap, no CUDA graphs, on an eager device (cached
    per workload)."""
    key = json.dumps([backend, workload.to_json(), args.spec_algorithm])
    ref = _REFERENCE_CACHE.get(key)
    if ref is None:
        rec = Recorder()
        ref_args = dataclasses.replace(args, overlap=False, relay="future_map",
                                       war_barrier="coarse", cuda_graph=False)
        with open_runtime(backend, Eager(), trace=False) as rt:
            outputs = drive(rt, workload, ref_args, FaultPlan(observer=rec))
        ref = _REFERENCE_CACHE[key] = Reference(rec.results, outputs)
    return ref


def run_trial(backend: str, policy: str, workload: Workload, args, stalls: List[StallAt],
              detect_races: bool = True, keep_trace: bool = False,
              stop_early: bool = True, mutation: Any = None,
              answers: Optional[Dict[str, Any]] = None) -> TrialResult:
    """One run. ``mutation`` (a ``scenarios.mutations.Mutation``) is applied around the run
    only -- never around the reference."""
    ref = reference(workload, args, backend)
    oracle = StaleValueOracle(ref, stop_early=stop_early)
    plan = FaultPlan(stalls=list(stalls), answers=dict(answers or {}), observer=oracle)
    pol = parse_policy(policy) if backend == "sim" else None
    t0 = time.perf_counter()
    outputs: Dict[int, List[int]] = {}
    patch = mutation.applied() if mutation is not None else contextlib.nullcontext()
    with open_runtime(backend, pol, trace=detect_races) as rt, patch:
        try:
            outputs = drive(rt, workload, args, plan)
            oracle.check_outputs(outputs)
            check_constrained_outputs(workload, outputs, oracle)
        except StaleValue:
            pass
        except Exception as exc:  # a crash of the engine is a finding, not a harness error
            oracle.note_crash(exc)
        finally:
            _quiesce(rt)
        wall = (time.perf_counter() - t0) * 1000.0
        races = detect(rt.trace) if detect_races and rt.trace is not None else []
        trace = rt.trace if keep_trace else None
    return TrialResult(oracle.first, races, wall, oracle.checked, trace, outputs)


def _quiesce(rt) -> None:
    """Let pending device work finish (errors included) before the runtime closes."""
    try:
        rt.synchronize()
    except Exception:
        pass
