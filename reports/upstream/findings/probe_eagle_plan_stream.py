"""The GPU probe for the draft extend's plan-stream entry (releases.md, "The plan stream's
two unordered entries", (B)): does ``prepare_for_draft_extend`` on the draft worker's plan
stream read the sequence lengths before the schedule stream's ``resolve_seq_lens_cpu``
gather writes them? (sglang 0.5.14-0.5.21 with ``SGLANG_ENABLE_OVERLAP_PLAN_STREAM=1``;
0.5.22 added the wait.)

It runs the ``eagle-v2`` scenario on the installed release (outputs only: no trace, so the
host runs at its own speed) and tags each draft extend's forward batch with the
ScheduleBatch's lengths; the draft extend's forward (the slice's runner or graph, on the
forward stream -- which has waited for the plan stream, and at ``run_batch`` for the
schedule stream) copies what the plan stream computed (``seq_lens + D``) beside the
lengths ``+ D`` into pinned host memory, non-blocking. No host sync is added, so the
overlap is the server's. They are compared once the run is over: a pair that differs is
a draft extend that planned with lengths read before they were written. ``fix``: with
0.5.22's ``plan_stream.wait_stream(current_stream())`` patched in at run time.

    PYTHONPATH=<sglang 0.5.21 site>:. \
        python3 reports/upstream/findings/probe_eagle_plan_stream.py \
        no-cpu-seq-lens-plan-stream STALL_MS TRIALS [fix]

Prints one JSON line. ``PROBE_BACKEND=sim`` runs it on the simulator (0 of 34 wrong on
0.5.21 under the eager policy: the gather always ran first). Not yet run on a GPU.
"""
import json
import os
import sys
import time

import torch
import targets
targets.get("sglang")
from sglang.srt.speculative import eagle_worker_v2 as V2
from targets.sglang.slices import eagle_graphs, eagle_runners
variant, stall, trials = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
fix = len(sys.argv) > 4 and sys.argv[4] == "fix"
pairs = []


orig_prep = V2.prepare_for_draft_extend
def prep(inp, batch, predict, D, *a, **k):
    fb = orig_prep(inp, batch, predict, D, *a, **k)
    fb._probe = (batch.seq_lens, D)
    return fb
V2.prepare_for_draft_extend = prep


if fix:
    orig_dx = V2.EagleDraftWorker._draft_extend_for_decode
    def dx(self, batch, result):
        if self.plan_stream is not None:
            self.plan_stream.wait_stream(torch.cuda.current_stream())
        return orig_dx(self, batch, result)
    V2.EagleDraftWorker._draft_extend_for_decode = dx


def snap(fb):
    p = getattr(fb, "_probe", None)
    if p is None:
        return
    ref, D = p
    both = torch.stack([fb.seq_lens.to(torch.int64), ref.to(torch.int64) + D])
    host = torch.empty(both.shape, dtype=torch.int64, pin_memory=True)
    host.copy_(both, non_blocking=True)
    pairs.append(host)


orig_fwd = eagle_runners.ToyModelRunner.forward
def fwd(self, forward_batch, **kw):
    snap(forward_batch)
    return orig_fwd(self, forward_batch, **kw)
eagle_runners.ToyModelRunner.forward = fwd


orig_ex = eagle_graphs.ToyDraftExtendGraphs.execute
def ex(self, forward_batch, select_index=None):
    snap(forward_batch)
    return orig_ex(self, forward_batch, select_index)
eagle_graphs.ToyDraftExtendGraphs.execute = ex


from scenarios.resolve import run_scenario_result
t = time.time()
r = run_scenario_result("eagle-v2", target="sglang", variant=variant,
                        backend=os.environ.get("PROBE_BACKEND", "cuda"), trials=trials,
                        stall_ms=stall, detect=False)
if torch.cuda.is_available():
    torch.cuda.synchronize()
wrong = [p.tolist() for p in pairs if p[0].tolist() != p[1].tolist()]
print(json.dumps({"variant": variant, "fix": fix, "stall_ms": stall, "trials": trials,
                  "outcome": r.outcome, "draft_extends": len(pairs), "wrong": len(wrong),
                  "examples": wrong[:3], "s": round(time.time() - t, 1),
                  "sglang": __import__("sglang").__version__}))
