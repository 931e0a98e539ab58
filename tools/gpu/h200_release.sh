#!/usr/bin/env bash
# On the H200, with VERSION's bundle carried in .sgbundle/ (make gpu-bundle-sglang SGLANG=VERSION): the sglang
# release as shipped on real CUDA streams with a stalled forward. Usage:
#   tools/gpu/h200_release.sh OUTDIR RACE_TRIALS CLEAN_TRIALS
# writes OUTDIR/release_<v>_{as-installed,fine}.json and the reports of the fine run.
set -u
R=$1; NR=$2; NC=$3; mkdir -p "$R"
rm -rf /tmp/site  # a warm machine keeps the last release's
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
v=$(python3 -c "import importlib.metadata as m; print(m.version('sglang'))")
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch,importlib.metadata as m;print('torch',torch.__version__,'transformers',m.version('transformers'),'xgrammar',m.version('xgrammar'),'sglang',m.version('sglang'))"; } > "$R/env_$v.txt" 2>&1
cat "$R/env_$v.txt"
# the import on its own first, so a missing package shows its traceback
python3 -c "import targets; targets.get('sglang'); print('sglang target loads')" 2>&1 | tail -4
run() { timeout 280 python3 -m specrace.cli repro ngram-filter-race --target sglang --backend cuda "$@"; }
run --trials "$NC" --json --report-dir "$R/r_$v" > "$R/release_${v}_as-installed.json"; echo "$v as-installed rc $?"
run --war-barrier fine --trials "$NR" --json --report-dir "$R/r_$v" > "$R/release_${v}_fine.json"; echo "$v fine rc $?"
python3 - "$R" "$v" <<'PY'
import json, sys
R, v = sys.argv[1:]
for k in ("as-installed", "fine"):
    try:
        d = json.load(open(f"{R}/release_{v}_{k}.json"))
    except Exception as e:
        print(k, "no result", e); continue
    print(v, k, d["war_barrier"], d["outcome"], f"{d['reproduced']}/{d['trials']}",
          "traced", d["traced_trials"], "sites", len(d["races"]), "median ms", d["median_trial_ms"],
          (d.get("first_divergence") or {}).get("message", "")[:160])
PY
