#!/usr/bin/env bash
# On the H200 (wheels as for tools/h200_pools.sh): the EAGLE v2 slice on CUDA -- its
# tests, the release under the scenarios' stalls in every shape (plan stream, topk 2,
# EAGLE3, grammar), the WAR barrier removed (a race expected), and
# the sglang mutation matrix (the EAGLE mutations among them).
# With SUITE=1, the whole GPU suite runs in the background first; MATRIX=0 leaves the
# matrix out (a call is 10 minutes at most).
# Usage: [SUITE=1] [MATRIX=0] tools/h200_eagle.sh OUTDIR N
set -u
R=$1; N=${2:-50}; mkdir -p "$R" /tmp/eg
. "$(dirname "$0")/h200_lib.sh"; h200_setup "$R/env.txt"
if [ "${SUITE:-0}" = 1 ]; then
  ( timeout 480 python3 -m pytest -n 10 -q -rs -p no:cacheprovider --specrace-backend cuda \
      > "$R/pytest.log" 2>&1; echo "pytest rc $?" >> "$R/pytest.log" ) &
fi
timeout 240 python3 -m pytest -q -rs -p no:cacheprovider --specrace-backend cuda \
  tests/upstream/test_sglang_eagle.py tests/upstream/test_eagle_kernels.py tests/upstream/test_eagle_graphs.py > "$R/pytest_eagle.log" 2>&1
echo "pytest eagle rc $?"; tail -3 "$R/pytest_eagle.log"
# scenario:variant:expect -- the release clean in every shape, the barrier removed a race
for sv in eagle-v2:as-installed:clean eagle-v2:plan-stream:clean eagle-v2:topk2:clean \
          eagle-v2:topk2-plan-stream:clean eagle-v2:eagle3:clean eagle-v2:no-war-barrier:race \
          eagle-v2-grammar:as-installed:clean eagle-v2-grammar:plan-stream:clean \
          eagle-v2-grammar:topk2:clean; do
  IFS=: read -r s v e <<< "$sv"
  SPECRACE_TRACEBACK=1 timeout 200 python3 -m harness.cli repro "$s" --target sglang --variant "$v" \
    --backend cuda --trials "$N" --expect "$e" --json --report-dir /tmp/eg/r \
    > "/tmp/eg/${s}_${v}.json" 2> "$R/${s}_${v}.err"
  echo "$s $v (expect $e) rc $?"; tail -2 "$R/${s}_${v}.err"
done
if [ "${MATRIX:-1}" = 1 ]; then
  timeout 240 python3 -X faulthandler -u -c "from harness.console import console_main; console_main()" \
    matrix --target sglang --backend cuda --json > "$R/matrix_cuda_sglang.json" 2> "$R/matrix.err"
  echo "matrix rc $?"; tail -3 "$R/matrix.err"
fi
python3 tools/h200_runs_summary.py /tmp/eg > "$R/eagle.json"
python3 -c "import json; d=json.load(open('$R/eagle.json')); [print(k, v.get('outcome'), v.get('reproduced'), '/', v.get('trials'), v.get('median_trial_ms')) for k, v in d.items()]"
wait
[ -f "$R/pytest.log" ] && tail -4 "$R/pytest.log"
