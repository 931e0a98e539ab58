#!/usr/bin/env bash
# On the H200, with 0.5.23's bundle carried in .sgbundle/ (make gpu-bundle-sglang) (the image's
# transformers serves 0.5.23: drop that wheel to stay under the call's 64 MiB): the whole
# GPU suite in the background, and meanwhile the sglang mutation matrix on CUDA (the DSpark
# relay mutations among its cells) and the NGRAM return_hidden_states readback -- stalled,
# unstalled and with its candidate fix, N trials each, every trial traced.
# Usage: tools/gpu/h200_upstream_matrix.sh OUTDIR N      (at most 8 files come back)
set -u
R=$1; N=$2; mkdir -p "$R"
. "$(dirname "$0")/h200_lib.sh"; h200_setup "$R/env.txt"
( timeout 420 python3 -m pytest -n 12 -q -rs -p no:cacheprovider --specrace-backend cuda \
    > "$R/pytest.log" 2>&1; echo "pytest rc $?" >> "$R/pytest.log" ) &
timeout 300 python3 -X faulthandler -u -c "from specrace.console import console_main; console_main()" \
  matrix --target sglang --backend cuda --json > "$R/matrix_cuda_sglang.json" 2> "$R/matrix_cuda_sglang.err"
echo "matrix sglang cuda rc $?"
hidden() { local name=$1; shift; timeout 150 python3 -m specrace.cli repro ngram-hidden-readback \
  "$@" --target sglang --backend cuda --trials "$N" --json --report-dir /tmp/hr > "/tmp/hidden_$name.json"
  echo "hidden $name rc $?"; }
hidden stalled
hidden nostall --stall-ms 0
hidden fixed --variant fixed
python3 - "$R" <<'PY' > "$R/hidden.json"
import glob, json, os, sys
out = {}
for path in sorted(glob.glob("/tmp/hidden_*.json")):
    name = os.path.basename(path)[len("hidden_"):-len(".json")]
    try:
        d = json.load(open(path))
    except Exception as e:
        out[name] = {"error": repr(e)}; continue
    stale = sum(1 for t in d["trial_results"] if t["divergence"] not in (None, "", "none"))
    out[name] = {k: d.get(k) for k in ("variant", "outcome", "reproduced", "trials",
                                       "traced_trials", "median_trial_ms", "stall_ms")}
    out[name].update(stale=stale, sites=len(d["races"]),
                     first=(d.get("first_divergence") or {}).get("message"),
                     report=d.get("report"))
print(json.dumps(out, indent=1))
PY
cat "$R/hidden.json"
tar czf "$R/hidden_runs.tgz" -C /tmp hr $(cd /tmp && ls hidden_*.json) 2>/dev/null
wait
tail -4 "$R/pytest.log"
