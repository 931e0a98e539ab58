"""One JSON object summarising the repro and soak results in a folder (the GPU scripts'
runs): per file, the verdict, trials, stale values by divergence kind, race sites and the
first divergence; a soak's result as it is. Usage: python3 tools/reports/h200_runs_summary.py DIR"""
import glob
import json
import os
import sys


def summary(d: dict) -> dict:
    if "trial_results" not in d:
        return d  # a soak's figures
    kinds: dict = {}
    for t in d["trial_results"]:
        if t["divergence"]:
            kinds[t["divergence"]] = kinds.get(t["divergence"], 0) + 1
    return {**{k: d.get(k) for k in ("target", "variant", "outcome", "reproduced", "trials",
                                     "traced_trials", "stall_ms", "median_trial_ms")},
            "stale_by_kind": kinds, "sites": len(d["races"]),
            "first": (d.get("first_divergence") or {}).get("message"),
            "race": d["races"][0]["summary"] if d["races"] else None}


out = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    name = os.path.basename(path)[:-len(".json")]
    try:
        out[name] = summary(json.load(open(path)))
    except Exception as e:  # a run that died: say so, keep the others
        out[name] = {"error": repr(e)}
print(json.dumps(out, indent=1))
