#!/usr/bin/env bash
# The contention measurements (issue "Findings an upstream maintainer accepts"), on a CUDA
# machine with the sglang wheels on PYTHONPATH (make gpu-bundle-sglang: .sgbundle/):
#   tools/gpu/h200_load.sh OUTDIR [SECTION...]   (default: every section; each fits a call)
# * probe    -- load_probe.json: copy-engine bandwidth, a small D2H behind bulk traffic of
#               each direction, FIFO order across streams (tools/gpu/load_probe.py);
#               litmus_load.json: the load litmus programs on this GPU, 50 runs each
# * rates    -- rates.json: the readback findings with NO injected stall, 200 trials under
#               each load: trials with a stale value (and HB-race trials)
# * ring     -- ring.json: the confidence-ring finding, the same way
# * overlap  -- overlap_cost.json: the fixes' iteration cost under no load and bulk D2H
# * script   -- repro_script.json: the standalone repro (torch + sglang only), 200 steps
set -u
R=$1; shift; mkdir -p "$R"; export PYTHONUNBUFFERED=1
sections=${*:-probe rates ring overlap script}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch,importlib.metadata as m;print('torch',torch.__version__,'sglang',m.version('sglang'))"; } > "$R/env.txt" 2>&1
# Rates with --outputs-only by default: the host at its own speed, as a server's (a traced
# op costs ~100 us, which delays the next forward's write and so hides staleness); set
# RATES_TRACE=1 for traced runs (then the race trials are counted too).
RATES_OPTS=--outputs-only
[ -n "${RATES_TRACE:-}" ] && RATES_OPTS=
rates() {  # scenario variant load -> one JSON line: trials, stale trials, race trials
  timeout 120 python3 -m specrace.cli repro "$1" --target sglang --variant "$2" --backend cuda \
    --stall-ms 0 --trials 200 --load "$3" $RATES_OPTS --json --no-report 2>/dev/null | tail -1 | python3 -c "
import json,sys; d=json.loads(sys.stdin.read())
print(json.dumps({'scenario': '$1', 'variant': '$2', 'load': '$3', 'traced': d['traced_trials'] > 0, 'trials': d['trials'],
  'stale': sum(1 for t in d['trial_results'] if t['divergence']),
  'raced': sum(1 for t in d['trial_results'] if t['races']),
  'median_trial_ms': d['median_trial_ms']}))"; }
for s in $sections; do case $s in
probe)
  timeout 150 python3 tools/gpu/load_probe.py > "$R/load_probe.json"; echo "probe rc $?"
  timeout 150 python3 - > "$R/litmus_load.json" <<'PY'
import json
from litmus.programs import get
from litmus.run import run_one_cuda
out = {}
for name in ("load_copy_behind_bulk", "load_other_direction", "load_fifo_two_streams"):
    rows = [run_one_cuda(get(name), "cuda")["observed"] for _ in range(50)]
    out[name] = {"stale": sum(r.startswith("stale") for r in rows), "runs": len(rows)}
print(json.dumps(out))
PY
  echo "litmus rc $?";;
rates)
  : > "$R/rates.json"
  for l in none bulk-d2h bulk-h2d host-busy; do
    rates dspark-result-readback no-cpu-seq-lens $l >> "$R/rates.json"
    rates ngram-hidden-readback as-installed $l >> "$R/rates.json"
  done;;
ring)
  : > "$R/ring.json"
  for l in none bulk-d2h bulk-h2d host-busy; do
    rates dspark-confidence-ring as-installed $l >> "$R/ring.json"
  done;;
overlap)
  timeout 200 python3 tools/measure/overlap_cost.py cuda 5 > "$R/overlap_cost.json" 2>/dev/null
  echo "overlap rc $?";;
script)
  timeout 120 python3 reports/upstream/findings/repro_graph_result_readback.py --trials 200 \
    > "$R/repro_script.json" 2> "$R/repro_script.err"; echo "script rc $?";;
esac; done
