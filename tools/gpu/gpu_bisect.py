"""Bisect the second-capture segfault: run two traced trials per variant, each variant in
a fresh process with one piece of the CUDA capture switched off (GPU bring-up only)."""
import os
import subprocess
import sys

VARIANTS = {
    "baseline": "",
    "no-api-wrappers": "C.runtime.ensure_api_wrapped = lambda *a, **k: None",
    "no-dispatch-mode": "import contextlib as _c; C.runtime.CaptureMode = lambda cap: _c.nullcontext()",
    "no-pinned-subclass": "hostmem.register = lambda t, name='': t",
    "no-storage-hold": "C.Capture.storage_id = lambda self, t: (hostmem.new_sid(), t.untyped_storage().data_ptr())",
    "gc-off": "import gc; gc.disable()",
    "no-lift-flag": "torch._C._set_only_lift_cpu_tensors = lambda v: None",
}

BODY = r'''
import faulthandler, sys, torch
faulthandler.enable(all_threads=True)
sys.path.insert(0, ".")
import harness.runtime.cuda as C
from harness.runtime import hostmem
{patch}
from harness.trials.drive import server_args
from harness.trials.trial import run_trial
from scenarios.registry import get
import targets
sc = get("ngram-filter-race")
for i in range(3):
    wl = sc.workload(i)
    args = server_args(wl, {{"relay": "spec_info", "war_barrier": "fine"}}, targets.get("impl"))
    r = run_trial("cuda", None, wl, args, sc.stalls(None), detect_races=True, target=targets.get("impl"))
    print("trial", i, "ok", len(r.races), flush=True)
'''

if __name__ == "__main__":
    names = sys.argv[1:] or list(VARIANTS)
    for name in names:
        code = BODY.format(patch=VARIANTS[name])
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        trials = [ln for ln in p.stdout.splitlines() if ln.startswith("trial")]
        tail = (p.stderr.strip().splitlines() or [""])
        where = [ln.strip() for ln in tail if 'File "' in ln][:4]
        print(f"{name:<20} rc {p.returncode:>4}  {len(trials)} trials ok  {where}", flush=True)
