#!/usr/bin/env bash
# On the H200 (wheels as for tools/gpu/h200_pools.sh): does a missing WAR barrier let a stale
# row reach the attention, and at what stall? kv-row-reuse with the barrier removed at
# longer stalls (the host must reach the next iteration's row write while the forward
# waits before its gather), and the fixed code soaked at the same stall.
# With SUITE=1, the whole GPU suite runs in the background and both mutation matrices
# first (a re-check of the tree after changes to the runtime).
# Usage: [SUITE=1] tools/gpu/h200_pools_sweep.sh OUTDIR N "MS..."
set -u
R=$1; N=$2; SWEEP=${3:-"10 25"}; mkdir -p "$R" /tmp/sw
. "$(dirname "$0")/h200_lib.sh"; h200_setup "$R/env.txt"
if [ "${SUITE:-0}" = 1 ]; then
  ( timeout 480 python3 -m pytest -n 12 -q -rs -p no:cacheprovider --specrace-backend cuda \
      > "$R/pytest.log" 2>&1; echo "pytest rc $?" >> "$R/pytest.log" ) &
  for t in impl sglang; do
    timeout 200 python3 -X faulthandler -u -c "from specrace.console import console_main; console_main()" \
      matrix --target $t --backend cuda --json > "$R/matrix_cuda_$t.json" 2>> "$R/matrix.err"
    echo "matrix $t rc $?"
  done
fi
for t in impl sglang; do
  for ms in $SWEEP; do
    timeout 200 python3 -m specrace.cli repro kv-row-reuse --target $t --variant no-war-barrier \
      --backend cuda --trials "$N" --stall-ms "$ms" --json --report-dir /tmp/sw/r \
      > "/tmp/sw/nobarrier_${t}_${ms}ms.json"; echo "no-war-barrier $t ${ms} ms rc $?"
  done
  ms=${SWEEP%% *}
  timeout 150 python3 -c "import json; from specrace.bench import soak_fixed; print(json.dumps(soak_fixed(1000, $ms, '$t', 'kv-row-reuse')))" > "/tmp/sw/soak_${t}_${ms}ms.json"
  echo "soak $t rc $?"; cat "/tmp/sw/soak_${t}_${ms}ms.json"
done
python3 tools/reports/h200_runs_summary.py /tmp/sw > "$R/sweep.json"
cat "$R/sweep.json"
tar czf "$R/sweep_runs.tgz" -C /tmp sw 2>/dev/null
wait
[ -f "$R/pytest.log" ] && tail -4 "$R/pytest.log"
