"""Drive a workload through a fresh scheduler of a target, on a runtime, under a fault plan."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from harness.oracle.workload import Workload
from harness.target import Target
from seams import faults, signals
from seams.faults.plan import FaultPlan

MAX_ITERATIONS = 400  # a run that does not finish by then is a finding, not a hang


def server_args(workload: Workload, overrides: Mapping[str, Any], target: Target):
    """``target``'s server args for a workload (its draft length and pools) and server-arg
    ``overrides`` (a variant's ``args``, and any more)."""
    pools = {name: size for name, size in (("req_pool_size", workload.req_pool_size),
                                           ("kv_pool_size", workload.kv_pool_size))
             if size is not None}
    return target.server_args(**{"draft_token_num": workload.draft_token_num, **pools,
                                 **overrides})


_BACKEND_CACHE: Dict[str, Any] = {}


def grammar_backend(target: Target):
    """One grammar backend per target and process (compiling grammars is the expensive
    part)."""
    gb = _BACKEND_CACHE.get(target.name)
    if gb is None:
        # its first call imports xgrammar: a C extension interrupted half-way cannot be
        # imported again in this process, so a signal waits for the import to finish
        with signals.deferred():
            gb = _BACKEND_CACHE[target.name] = target.grammar_backend()
    return gb


def drive(runtime, workload: Workload, args, plan: FaultPlan, target: Target,
          stats: Optional[Dict[str, int]] = None) -> Dict[int, List[int]]:
    """Run ``workload`` through a fresh scheduler of ``target`` on ``runtime`` with
    ``plan`` installed (``stats``, if given, gets the scheduler iterations it took)."""
    needs_grammar = any(r.schema for r in workload.requests)
    gb = grammar_backend(target) if needs_grammar else None
    plan.runtime = runtime
    with target.variant(args, runtime.device):
        sched = target.scheduler(args, runtime.device, grammar_backend=gb)
        for name, stream in sched.streams.items():
            if stream is not None:
                runtime.label(stream, name)
        pending = sorted(workload.requests, key=lambda r: (r.arrive, r.rid))
        reqs = {}
        with faults.installed(plan):
            try:
                while (pending or sched.has_work()) and sched.iteration < MAX_ITERATIONS:
                    while pending and pending[0].arrive <= sched.iteration:
                        spec = pending.pop(0)
                        grammar = (gb.grammar_for_json_schema(spec.schema) if spec.schema
                                   else None)
                        reqs[spec.rid] = target.request(spec.rid, spec.prompt,
                                                     spec.max_new_tokens, grammar)
                        sched.add_request(reqs[spec.rid])
                    sched.step()
                sched.run_to_completion(MAX_ITERATIONS)
            finally:
                sched.close()
        runtime.synchronize()
        if stats is not None:
            stats["iterations"] = sched.iteration
    if pending or sched.has_work():
        raise RuntimeError(f"engine did not finish within {MAX_ITERATIONS} iterations")
    return {rid: r.output() for rid, r in reqs.items()}
