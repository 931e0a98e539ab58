"""What each fix of the graph-output readback costs the overlap, side by side in one run.

    python tools/measure/overlap_cost.py [sim|cuda] [TRIALS]  > overlap_cost.json

For the sglang target, with no injected stall, under no load and under bulk D2H traffic
(``--load bulk-d2h``: what makes the readback late in a server), each of: the code as
installed (racy), the blanket fix (``forward-waits-result-copy``: every forward waits for
the previous readback), the conditional wait (``forward-waits-graph-result-copy``: only
after a result that holds graph views) and the clone (``clone-graph-outputs``: graph
outputs cloned on the forward stream, the copy stays a leaf). Measured on two workloads:
a step whose result holds graph views (DSpark's folded accept) and one whose result does
not (NGRAM without hidden states) -- where a fix should cost nothing at all.

Figures per cell: iteration time (simulator: virtual microseconds from the trace; CUDA:
wall milliseconds per engine iteration, the trial's own clock) and the forward stream's
idle fraction (simulator: 1 - its ops' busy time over the span from its first op to its
last, from the trace). Ratios to the as-installed cell of the same workload and load.
"""
from __future__ import annotations

import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

FIXES = ("forward-waits-result-copy", "forward-waits-graph-result-copy",
         "clone-graph-outputs")
WORKLOADS = (("graph views (dspark folded)", "dspark-result-readback", "as-installed"),
             ("no graph views (ngram)", "ngram-filter-race", "fixed"))


def _forward_idle(trace) -> float:
    ops = [op for op in trace.executed if trace.stream_name(op.stream) == "forward"
           and getattr(op, "start", None) is not None]
    if not ops:
        return 0.0
    span = max(op.end for op in ops) - min(op.start for op in ops)
    busy = sum(op.end - op.start for op in ops if op.kind != "wait")
    return max(0.0, 1.0 - busy / span) if span else 0.0


def cell(backend: str, scenario: str, base_variant: str, fix, load: str, trials: int):
    import dataclasses

    import targets
    from harness.run import Variant
    from harness.trials.drive import server_args
    from harness.trials.trial import run_trial
    from scenarios.resolve import RunRequest, resolve
    run = resolve(RunRequest(scenario, target="sglang", variant=base_variant,
                             backend=backend, trials=trials, stall_ms=0, load=load))
    variant = dataclasses.replace(run.variant, fix=fix) if fix else run.variant
    target = targets.get("sglang")
    per_it, idle = [], []
    for i in range(trials):
        wl = run.scenario.workload(i)
        args = server_args(wl, {**variant.args, "war_barrier": str(run.war_barrier)}, target)
        res = run_trial(backend, run.policy, wl, args, list(run.stalls), target=target,
                        detect_races=False, keep_trace=backend == "sim",
                        mutation=Variant.patch(variant, target),
                        answers=dict(run.host_order), load=run.load)
        if backend == "sim":
            ops = [op for op in res.trace.executed if getattr(op, "end", None) is not None]
            per_it.append(max(op.end for op in ops) / max(res.iterations, 1))
            idle.append(_forward_idle(res.trace))
        else:
            per_it.append(res.wall_ms / max(res.iterations, 1))
    out = {"iteration": statistics.median(per_it),
           "unit": "virtual us" if backend == "sim" else "wall ms"}
    if idle:
        out["forward_idle"] = round(statistics.median(idle), 4)
    return out


def main() -> int:
    backend = sys.argv[1] if len(sys.argv) > 1 else "sim"
    trials = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    rows = []
    for label, scenario, base in WORKLOADS:
        for load in ("none", "bulk-d2h"):
            base_cell = cell(backend, scenario, base, None, load, trials)
            rows.append({"workload": label, "load": load, "fix": "as-installed",
                         **base_cell, "x_installed": 1.0})
            for fix in FIXES:
                c = cell(backend, scenario, base, fix, load, trials)
                rows.append({"workload": label, "load": load, "fix": fix, **c,
                             "x_installed": round(c["iteration"] / base_cell["iteration"], 3)})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    json.dump({"backend": backend, "trials": trials, "rows": rows}, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
