#!/usr/bin/env bash
# On the H200 (wheels as for tools/gpu/h200_pools.sh): the EAGLE v2 slice on CUDA -- its
# tests (xdist: a worker that dies is named, the others go on), the release under the
# scenarios' stalls in each shape given, and the sglang mutation matrix (the EAGLE
# mutations among them). Everything lands in one archive, OUTDIR/eagle.tgz, beside
# env.txt and a summary: the device tool returns at most 8 files a call.
# SUITE=1: the whole GPU suite runs in the background meanwhile. MATRIX=0: no matrix.
# CASES: scenario:variant:expect triples (default: every shape, the barrier removed racing).
# Usage: [SUITE=1] [MATRIX=0] [CASES="..."] tools/gpu/h200_eagle.sh OUTDIR N
set -u
OUT=$1; N=${2:-50}; R=/tmp/eagle_results; rm -rf "$R" /tmp/eg; mkdir -p "$OUT" "$R" /tmp/eg
. "$(dirname "$0")/h200_lib.sh"; h200_setup "$OUT/env.txt"
if [ "${SUITE:-0}" = 1 ]; then
  ( timeout 420 python3 -m pytest -n 8 -q -rfs -p no:cacheprovider --specrace-backend cuda \
      > "$R/pytest.log" 2>&1; echo "pytest rc $?" >> "$R/pytest.log" ) &
fi
timeout 240 python3 -X faulthandler -m pytest -n 4 -v -rfs -p no:cacheprovider \
  --specrace-backend cuda tests/targets/sglang_target/test_sglang_eagle.py tests/targets/sglang_target/test_eagle_kernels.py \
  tests/targets/sglang_target/test_eagle_graphs.py > "$R/pytest_eagle.log" 2>&1
echo "pytest eagle rc $?"; grep -E "FAILED|crashed|node down|passed|failed" "$R/pytest_eagle.log" | tail -12
CASES=${CASES:-"eagle-v2:as-installed:clean eagle-v2:plan-stream:clean eagle-v2:topk2:clean \
eagle-v2:topk2-plan-stream:clean eagle-v2:eagle3:clean eagle-v2:no-war-barrier:race \
eagle-v2-grammar:as-installed:clean eagle-v2-grammar:plan-stream:clean eagle-v2-grammar:topk2:clean"}
for sv in $CASES; do
  IFS=: read -r s v e <<< "$sv"
  SPECRACE_TRACEBACK=1 timeout 200 python3 -m specrace.cli repro "$s" --target sglang --variant "$v" \
    --backend cuda --trials "$N" --expect "$e" --json --report-dir /tmp/eg/r \
    > "/tmp/eg/${s}_${v}.json" 2> "$R/${s}_${v}.err"
  echo "$s $v (expect $e) rc $?"; tail -2 "$R/${s}_${v}.err"
done
python3 tools/reports/h200_runs_summary.py /tmp/eg > "$R/eagle.json"
python3 -c "import json; d=json.load(open('$R/eagle.json')); [print(k, v.get('outcome'), v.get('reproduced'), '/', v.get('trials'), v.get('median_trial_ms')) for k, v in d.items()]"
if [ "${MATRIX:-1}" = 1 ]; then
  timeout 240 python3 -X faulthandler -u -c "from specrace.console import console_main; console_main()" \
    matrix --target sglang --backend cuda --json > "$R/matrix_cuda_sglang.json" 2> "$R/matrix.err"
  echo "matrix rc $?"; tail -3 "$R/matrix.err"
fi
wait
[ -f "$R/pytest.log" ] && grep -E "^FAILED|crashed|rc |passed|failed" "$R/pytest.log" | tail -15
find "$R" -type f -empty -delete
cp "$R/eagle.json" "$OUT/eagle.json"
tar czf "$OUT/eagle.tgz" -C "$R" .
