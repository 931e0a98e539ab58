#!/usr/bin/env bash
# The vLLM target on a GPU (issues "A second server 1/2, 2/2"): the seq-lens race of
# 0.16.0-0.18.0 as shipped, stalled / unstalled / under contention, the fix, the dense model,
# MRv2's draft-token race (0.16.0-0.23.0) and its fix, and the other scenarios. Run from the repo root after `source tools/gpu/vllm_gpu_env.sh`:
#   tools/gpu/vllm_gpu.sh OUTDIR [BUDGET_S] [PLAN]   one JSON line per run in OUTDIR/rates.json
# PLAN: "seq" (default: the seq-lens race and the slices), "draft" (only the slice's
# draft-token runs, for a release whose V1 runner is fixed or absent), "mrv2" (0.17.0: Model
# Runner V2 driven whole, its draft-token race and the V1 draft copy near max_model_len),
# "late" (0.27.1: the same scenarios where that release fixed or newly ships them),
# "draftmin" (the draft-token race alone, traced and by rates, for a short call)
set -u
R=$1; budget=${2:-540}; mkdir -p "$R"; export PYTHONUNBUFFERED=1; t0=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch,importlib.metadata as m;print('torch',torch.__version__,'vllm',m.version('vllm'),'transformers',m.version('transformers'))"; } > "$R/env.txt" 2>&1
run() {  # scenario variant trials [repro options...] -> one JSON line
  local s=$1 v=$2 n=$3; shift 3
  if [ $(( $(date +%s) - t0 )) -gt "$budget" ]; then
    echo "{\"scenario\": \"$s\", \"variant\": \"$v\", \"skipped\": \"call budget\", \"opts\": \"$*\"}" >> "$R/rates.json"; return; fi
  local left=$(( budget + 60 - ($(date +%s) - t0) )); [ $left -gt 240 ] && left=240
  timeout $left python3 -m specrace.cli repro "$s" --target vllm --variant "$v" --backend cuda \
    --trials "$n" --json --no-report "$@" > "$R/run.json" 2> "$R/run.err"
  local rc=$?
  python3 - "$s" "$v" "$rc" "$*" "$R" >> "$R/rates.json" <<'PY'
import json, sys
s, v, rc, opts, R = sys.argv[1:]
row = {"scenario": s, "variant": v, "opts": opts, "rc": int(rc)}
try:
    d = json.loads(open(f"{R}/run.json").read().strip().splitlines()[-1])
    tr = d["trial_results"]
    row.update(trials=len(tr), wrong_output=sum(1 for t in tr if t["divergence"]),
               raced=sum(1 for t in tr if t["races"]), outcome=d["outcome"],
               median_trial_ms=d["median_trial_ms"],
               n_sites=len(d.get("races", [])),
               checked=sum(t.get("checked", 0) for t in tr),
               divergences=sorted({str(t["divergence"])[:160] for t in tr if t["divergence"]})[:3],
               sites=sorted({f"{r['first']['file']}:{r['first']['line']} / "
                             f"{r['second']['file']}:{r['second']['line']}"
                             for r in d.get("races", [])})[:12])
except Exception as exc:
    row["error"] = open(f"{R}/run.err").read()[-1500:] or repr(exc)
print(json.dumps(row))
PY
  tail -1 "$R/rates.json"
}
plan=${3:-seq}; O=--outputs-only
smoke() {  # the scenario's traceback when its first run errored
  grep -q '"error"' "$R/rates.json" || return 0
  SPECRACE_TRACEBACK=1 timeout 120 python3 -m specrace.cli repro "$1" --target vllm --variant "$2" \
    --backend cuda --trials 1 --no-report > "$R/smoke.log" 2>&1; tail -40 "$R/smoke.log"; exit 1; }
if [ "$plan" = mrv2 ]; then
  run vllm-mrv2 as-installed 1; smoke vllm-mrv2 as-installed
  run vllm-mrv2-draft-tokens as-installed 3; run vllm-mrv2-draft-tokens fixed 3
  run vllm-mrv2-draft-tokens as-installed 200 $O; run vllm-mrv2-draft-tokens fixed 100 $O
  run vllm-draft-tokens as-installed 100 $O; run vllm-draft-tokens fixed 100 $O
  run vllm-mrv2-draft-tokens as-installed 100 $O --stall-ms 0
  run vllm-v1-draft-copy seq-lens-fixed-only 3; run vllm-v1-draft-copy fixed-seq-lens 3
  run vllm-v1-draft-copy seq-lens-fixed-only 200 $O; run vllm-v1-draft-copy fixed-seq-lens 100 $O
  run vllm-v1-draft-copy seq-lens-fixed-only 200 $O --stall-ms 0
  run vllm-seq-lens-shadow as-installed 100 $O --stall-ms 100
  echo "vllm_gpu: $(( $(date +%s) - t0 )) s"; exit 0; fi
if [ "$plan" = draftmin ]; then  # the draft-token race alone, for a short call
  run vllm-mrv2-draft-tokens as-installed 3; smoke vllm-mrv2-draft-tokens as-installed
  run vllm-mrv2-draft-tokens fixed 3
  run vllm-draft-tokens as-installed 100 $O; run vllm-draft-tokens fixed 100 $O
  run vllm-mrv2-draft-tokens as-installed 100 $O; run vllm-mrv2-draft-tokens fixed 50 $O
  echo "vllm_gpu: $(( $(date +%s) - t0 )) s"; exit 0; fi
if [ "$plan" = late ]; then
  run vllm-mrv2-uva-pool as-installed 3; smoke vllm-mrv2-uva-pool as-installed
  run vllm-mrv2-draft-tokens as-installed 3; run vllm-mrv2-draft-tokens as-installed 100 $O
  run vllm-v1-draft-copy as-installed 3; run vllm-v1-draft-copy fixed 3
  run vllm-seq-lens-shadow sync 3; run vllm-seq-lens-shadow sync-fixed 3
  run vllm-seq-lens-shadow sync 100 $O; run vllm-seq-lens-shadow sync-fixed 100 $O
  run vllm-seq-lens-shadow sync 100 $O --stall-ms 0
  run vllm-seq-lens-shadow sync-dense 30 $O
  echo "vllm_gpu: $(( $(date +%s) - t0 )) s"; exit 0; fi
if [ "$plan" = draft ]; then
  run vllm-draft-tokens as-installed 3; run vllm-draft-tokens as-installed 200 --outputs-only
  run vllm-draft-tokens fixed 3; echo "vllm_gpu: $(( $(date +%s) - t0 )) s"; exit 0; fi
run vllm-seq-lens-shadow as-installed 3
grep -q '"error"' "$R/rates.json" && { SPECRACE_TRACEBACK=1 timeout 120 python3 -m specrace.cli repro vllm-seq-lens-shadow --target vllm --backend cuda --trials 1 --no-report > "$R/smoke.log" 2>&1; tail -40 "$R/smoke.log"; exit 1; }
# happens-before verdicts (traced: every op logged, the host ~100 us an op slower)
run vllm-seq-lens-shadow fixed 3
# rates as a server sees them: outputs only, the host at its own speed
run vllm-seq-lens-shadow as-installed 200 $O
run vllm-seq-lens-shadow fixed 100 $O
run vllm-seq-lens-shadow as-installed 200 $O --stall-ms 0
run vllm-seq-lens-shadow as-installed 200 $O --stall-ms 0 --load bulk-h2d
run vllm-seq-lens-shadow dense 50 $O
run vllm-seq-lens-shadow dense-fixed 50 $O
run vllm-draft-tokens as-installed 100 $O
run vllm-draft-tokens fixed 100 $O
run vllm-draft-tokens as-installed 3
run vllm-accepted-count as-installed 10
run vllm-accepted-count no-valid-count-wait 10
run vllm-input-prep as-installed 10
run vllm-input-prep no-fence 10
run vllm-seq-lens-shadow as-installed 100 $O --stall-ms 0 --load bulk-d2h
run vllm-seq-lens-shadow as-installed 100 $O --stall-ms 0 --load host-busy
run vllm-seq-lens-shadow as-installed 30 --stall-ms 100
echo "vllm_gpu: $(( $(date +%s) - t0 )) s"
