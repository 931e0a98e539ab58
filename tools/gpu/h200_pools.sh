#!/usr/bin/env bash
# On the H200, with 0.5.23's bundle carried in .sgbundle/ (make gpu-bundle-sglang) (drop the
# transformers wheel: the image's serves 0.5.23): the memory pools behind the WAR barrier
# (issue 24) on both targets -- the barrier removed (kv-row-reuse, N trials, every trial
# traced), the fixed code stalled for >= 1,000 iterations, both mutation matrices (the
# pool mutations among their cells) -- with the whole GPU suite in the background.
# STALL_MS: the stall of the barrier-removed trials and the fixed soak (default 1; the
# host reaches the next row write within a stall only at ~10 ms: README, Measured).
# RACE / CLEAN: the kv-row-reuse variants run (default no-war-barrier / fixed; e.g.
# retract-no-war-barrier / retract; the soak runs CLEAN); SCENARIO: kv-row-reuse (default)
# or kv-pressure (retraction under memory pressure); MATRIX=0, SOAK=0 and SUITE=0 leave
# those out.
# Usage: [STALL_MS=10] tools/gpu/h200_pools.sh OUTDIR N   (at most 8 files come back)
set -u
R=$1; N=$2; S=${STALL_MS:-1}; mkdir -p "$R" /tmp/kv
RACE=${RACE:-no-war-barrier}; CLEAN=${CLEAN:-fixed}; SC=${SCENARIO:-kv-row-reuse}
. "$(dirname "$0")/h200_lib.sh"; h200_setup "$R/env.txt"
[ "${SUITE:-1}" = 1 ] && ( timeout 480 python3 -m pytest -n 12 -q -rs -p no:cacheprovider \
    --specrace-backend cuda > "$R/pytest.log" 2>&1; echo "pytest rc $?" >> "$R/pytest.log" ) &
if [ "${MATRIX:-1}" = 1 ]; then
timeout 280 python3 -X faulthandler -u -c "from specrace.console import console_main; console_main()" \
  matrix --backend cuda --json > "$R/matrix_cuda.json" 2> /tmp/kv/matrix_impl.err
echo "matrix impl rc $?"
timeout 280 python3 -X faulthandler -u -c "from specrace.console import console_main; console_main()" \
  matrix --target sglang --backend cuda --json > "$R/matrix_cuda_sglang.json" 2> /tmp/kv/matrix_sglang.err
echo "matrix sglang rc $?"
fi
for t in impl sglang; do
  timeout 150 python3 -m specrace.cli repro "$SC" --target $t --variant "$RACE" \
    --backend cuda --trials "$N" --stall-ms "$S" --json --report-dir /tmp/kv/r \
    > "/tmp/kv/nobarrier_$t.json"
  echo "no-war-barrier $t rc $?"
  timeout 100 python3 -m specrace.cli repro "$SC" --target $t --variant "$CLEAN" \
    --backend cuda --trials 50 --stall-ms "$S" --json --report-dir /tmp/kv/r > "/tmp/kv/fixed_$t.json"
  echo "fixed $t rc $?"
  [ "${SOAK:-1}" = 1 ] || continue
  timeout 150 python3 -c "import json; from specrace.bench import soak_fixed; print(json.dumps(soak_fixed(1000, float('$S'), '$t', '$SC', '$CLEAN')))" > "/tmp/kv/soak_$t.json"
  echo "soak $t rc $?"; cat "/tmp/kv/soak_$t.json"
done
python3 tools/reports/h200_runs_summary.py /tmp/kv > "$R/kv.json"
cat "$R/kv.json"
cat /tmp/kv/matrix_impl.err /tmp/kv/matrix_sglang.err > "$R/matrix.err" 2>/dev/null
tar czf "$R/kv_runs.tgz" -C /tmp kv 2>/dev/null
wait
[ -f "$R/pytest.log" ] && tail -4 "$R/pytest.log"
