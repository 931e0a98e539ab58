#!/usr/bin/env bash
# On the H200, with 0.5.23's bundle carried in .sgbundle/ (make gpu-bundle-sglang): the DSpark
# findings on real CUDA streams and real graph replays -- each suspected race stalled
# (N trials), unstalled (N trials, --stall-ms 0) and with its candidate fix (N trials).
# Usage: tools/gpu/h200_dspark.sh OUTDIR N     writes OUTDIR/dspark_<scenario>_<case>.json
set -u
R=$1; N=$2; mkdir -p "$R"
. "$(dirname "$0")/h200_lib.sh"; h200_setup "$R/env.txt"
run() { local name=$1; shift; timeout 170 python3 -m specrace.cli repro "$@" --target sglang \
  --backend cuda --trials "$N" --json --report-dir "$R/r" > "$R/dspark_$name.json"; echo "$name rc $?"; }
for sc in dspark-confidence-ring dspark-result-readback; do
  run "${sc}_stalled" "$sc"
  run "${sc}_nostall" "$sc" --stall-ms 0
  run "${sc}_fixed" "$sc" --variant fixed
done
# the ring copy is value-visible only when it lands after the next scatter but before
# the resolve two publishes later: a sweep of the D2H stall (RING_SWEEP="4 8", N/4 each)
for ms in ${RING_SWEEP:-}; do
  N=$(( N / 4 )) run "ring_${ms}ms" dspark-confidence-ring --stall-ms "$ms"
done
python3 - "$R" <<'PY'
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "dspark_*.json"))):
    try:
        d = json.load(open(path))
    except Exception as e:
        print(os.path.basename(path), "no result", e); continue
    stale = sum(1 for t in d["trial_results"] if t["divergence"] in ("accept_lens", "accept_tokens", "confidence", "output")) if "trial_results" in d else None
    print(os.path.basename(path), d["variant"], d["outcome"], f"{d['reproduced']}/{d['trials']}",
          "stale", stale, "traced", d["traced_trials"], "sites", len(d["races"]),
          "median ms", d["median_trial_ms"], (d.get("first_divergence") or {}).get("message", "")[:140])
PY
