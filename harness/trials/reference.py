"""The synchronous reference a trial is judged against: the target's own engine, fixed
code, no overlap, no CUDA graphs, on an eager device -- cached, since workloads recur."""
from __future__ import annotations

import collections
import dataclasses
import json

from harness.oracle.stale import Recorder, Reference
from harness.oracle.workload import Workload
from harness.policies import Eager
from seams.faults.plan import FaultPlan
from harness.runtime import open_runtime
from harness.target import Target

from harness.trials.drive import drive

# Workloads recur across a matrix's cells (each probe's few seeds) but not across a
# repro's trials: a few recent entries serve the one, and the other's memory stays bounded.
REFERENCE_CACHE_SIZE = 16
_REFERENCE_CACHE: "collections.OrderedDict[str, Reference]" = collections.OrderedDict()


class ReferenceCrash(Exception):
    """The synchronous reference run itself crashed: the bug is in both runs."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.exc = exc


def reference(workload: Workload, args, backend: str, target: Target) -> Reference:
    """The synchronous reference: the target's own engine, fixed code, no overlap, no CUDA
    graphs, on an eager device (an LRU cache holds the last ``REFERENCE_CACHE_SIZE``). ``ReferenceCrash``
    if the engine fails in it."""
    ref_args = dataclasses.replace(args, overlap=False, relay="future_map",
                                   war_barrier="coarse", cuda_graph=False)
    # keyed by everything the reference run is made of: every server arg it runs with
    # (a variant's patches are applied around the trial only, never around it)
    key = json.dumps([target.name, backend, workload.to_json(), dataclasses.asdict(ref_args)],
                     sort_keys=True)
    ref = _REFERENCE_CACHE.get(key)
    if ref is not None:
        _REFERENCE_CACHE.move_to_end(key)
        return ref
    rec = Recorder()
    with open_runtime(backend, Eager(), trace=False) as rt:  # a backend error propagates
        try:
            outputs = drive(rt, workload, ref_args, FaultPlan(observer=rec), target)
        except Exception as exc:
            quiesce(rt)
            raise ReferenceCrash(exc) from exc
    ref = _REFERENCE_CACHE[key] = Reference(rec.results, outputs, rec.confidence, rec.hidden,
                                             rec.seq_lens, rec.retractions)
    while len(_REFERENCE_CACHE) > REFERENCE_CACHE_SIZE:
        _REFERENCE_CACHE.popitem(last=False)
    return ref


def quiesce(rt) -> None:
    """Let pending device work finish (errors included) before the runtime closes."""
    try:
        rt.synchronize()
    except Exception:
        pass
