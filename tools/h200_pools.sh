#!/usr/bin/env bash
# On the H200, with tools/gpu_wheels.sh 0.5.23's wheels carried in .whl/ (drop the
# transformers wheel: the image's serves 0.5.23): the memory pools behind the WAR barrier
# (issue 24) on both targets -- the barrier removed (kv-row-reuse, N trials, every trial
# traced), the fixed code stalled for >= 1,000 iterations, both mutation matrices (the
# pool mutations among their cells) -- with the whole GPU suite in the background.
# Usage: tools/h200_pools.sh OUTDIR N        (at most 8 files come back)
set -u
R=$1; N=$2; mkdir -p "$R" /tmp/kv
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch,importlib.metadata as m;print('torch',torch.__version__,'sglang',m.version('sglang'),'xgrammar',m.version('xgrammar'))"; } > "$R/env.txt" 2>&1
cat "$R/env.txt"
( timeout 480 python3 -m pytest -n 12 -q -rs -p no:cacheprovider --specrace-backend cuda \
    > "$R/pytest.log" 2>&1; echo "pytest rc $?" >> "$R/pytest.log" ) &
timeout 200 python3 -X faulthandler -u -c "from harness.console import console_main; console_main()" \
  matrix --backend cuda --json > "$R/matrix_cuda.json" 2> /tmp/kv/matrix_impl.err
echo "matrix impl rc $?"
timeout 200 python3 -X faulthandler -u -c "from harness.console import console_main; console_main()" \
  matrix --target sglang --backend cuda --json > "$R/matrix_cuda_sglang.json" 2> /tmp/kv/matrix_sglang.err
echo "matrix sglang rc $?"
for t in impl sglang; do
  timeout 150 python3 -m harness.cli repro kv-row-reuse --target $t --variant no-war-barrier \
    --backend cuda --trials "$N" --json --report-dir /tmp/kv/r > "/tmp/kv/nobarrier_$t.json"
  echo "no-war-barrier $t rc $?"
  timeout 100 python3 -m harness.cli repro kv-row-reuse --target $t --backend cuda \
    --trials 50 --json --report-dir /tmp/kv/r > "/tmp/kv/fixed_$t.json"
  echo "fixed $t rc $?"
  timeout 150 python3 -c "import json; from harness.bench import soak_fixed; print(json.dumps(soak_fixed(1000, 1.0, '$t', 'kv-row-reuse')))" > "/tmp/kv/soak_$t.json"
  echo "soak $t rc $?"; cat "/tmp/kv/soak_$t.json"
done
python3 - <<'PY' > "$R/kv.json"
import glob, json, os
out = {}
for path in sorted(glob.glob("/tmp/kv/*.json")):
    name = os.path.basename(path)[:-5]
    try:
        d = json.load(open(path))
    except Exception as e:
        out[name] = {"error": repr(e)}; continue
    if "trial_results" in d:
        kinds = {}
        for t in d["trial_results"]:
            k = t["divergence"]
            if k:
                kinds[k] = kinds.get(k, 0) + 1
        d = {**{k: d.get(k) for k in ("target", "variant", "outcome", "reproduced", "trials",
                                         "traced_trials", "median_trial_ms")},
             "stale_by_kind": kinds, "sites": len(d["races"]),
             "first": (d.get("first_divergence") or {}).get("message"),
             "race": d["races"][0]["summary"] if d["races"] else None}
    out[name] = d
print(json.dumps(out, indent=1))
PY
cat "$R/kv.json"
cat /tmp/kv/matrix_impl.err /tmp/kv/matrix_sglang.err > "$R/matrix.err" 2>/dev/null
tar czf "$R/kv_runs.tgz" -C /tmp kv 2>/dev/null
wait
tail -4 "$R/pytest.log"
