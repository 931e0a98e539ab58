"""CSAN cross-check (run on a CUDA machine; regenerates reports/h200/csan_compare.json).

Each litmus program, and one trial of each seed-scenario variant, runs in a fresh process
with ``TORCH_CUDA_SANITIZER=1`` (CSAN must be on from start-up; it raises at the first race
it sees) and without our trace capture; CSAN's verdict is set beside the detector's.
"""
import concurrent.futures
import json
import os
import subprocess
import sys

ONE = r"""
import sys, torch
from harness.runtime import open_runtime
import targets
kind, name = sys.argv[1], sys.argv[2]
try:
    if kind == "litmus":
        from litmus.programs import PROGRAMS
        prog = next(p for p in PROGRAMS if p.name == name)
        with open_runtime("cuda", trace=False) as rt:
            prog.body(rt, True)
            torch.cuda.synchronize()
    else:
        from harness.trials.drive import drive, server_args
        from seams.faults.plan import FaultPlan
        from scenarios.registry import get
        sc = get("ngram-filter-race"); variant, barrier = name.split(":")
        wl = sc.workload(0)
        args = server_args(wl, {**sc.variants[variant].args, "war_barrier": barrier}, targets.get("impl"))
        with open_runtime("cuda", trace=False) as rt:
            drive(rt, wl, args, FaultPlan(stalls=sc.stalls(None)), target=targets.get("impl"))
    print("CSAN-CLEAN")
except Exception as exc:
    print("CSAN-RACE" if "CUDASanitizer" in type(exc).__name__ or "data race" in str(exc)
          else "OTHER-ERROR " + type(exc).__name__ + ": " + str(exc).splitlines()[0][:160])
"""


def run(cell):
    kind, name = cell
    env = dict(os.environ, TORCH_CUDA_SANITIZER="1")
    p = subprocess.run([sys.executable, "-c", ONE, kind, name], env=env, capture_output=True,
                       text=True, timeout=300)
    out = (p.stdout.strip().splitlines() or ["NO-OUTPUT rc %d" % p.returncode])[-1]
    race_line = next((ln for ln in p.stderr.splitlines() if "detected a possible data race" in ln), "")
    return {"kind": kind, "name": name, "csan": out, "csan_message": race_line[:200]}


def main():
    from litmus.programs import PROGRAMS
    cells = [("litmus", p.name) for p in PROGRAMS] + \
            [("scenario", v) for v in ("pre-fix:fine", "pre-fix:coarse", "fixed:fine")]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        rows = list(pool.map(run, cells))
    ours = {p.name: p.race for p in PROGRAMS}
    ours.update({"pre-fix:fine": True, "pre-fix:coarse": False, "fixed:fine": False})
    for r in rows:
        r["specrace_race"] = ours[r["name"]]
        r["csan_race"] = r["csan"] == "CSAN-RACE"
        r["agree"] = r["csan_race"] == r["specrace_race"]
    print(json.dumps({"rows": rows, "agree": sum(r["agree"] for r in rows), "total": len(rows)}))


if __name__ == "__main__":
    main()
