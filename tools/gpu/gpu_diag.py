"""Diagnose a crash across repeated CUDA trials (kept in tools/ for GPU bring-up)."""
import faulthandler
import gc
import sys

faulthandler.enable(all_threads=True)
from harness.trials.drive import server_args  # noqa: E402
from harness.trials.reference import reference
from harness.trials.trial import run_trial
from scenarios.registry import get  # noqa: E402
import targets

sc = get("ngram-filter-race")
for mode in sys.argv[1:] or ["notrace", "trace"]:
    for i in range(3):
        wl = sc.workload(i)
        args = server_args(wl, {"relay": "spec_info", "war_barrier": "fine"}, targets.get("impl"))
        print(mode, i, "ref", flush=True)
        reference(wl, args, "cuda", targets.get("impl"))
        print(mode, i, "trial", flush=True)
        r = run_trial("cuda", None, wl, args, sc.stalls(None),
                      detect_races=(mode == "trace"), target=targets.get("impl"))
        print(mode, i, "done", r.divergence and r.divergence.message[:100], len(r.races),
              flush=True)
        del r
        gc.collect()
        print("gc ok", flush=True)
