"""Write reports/h200/README.md from the JSON files tools/gpu/h200.sh and tools/gpu/csan_compare.py
left in reports/h200/ (run anywhere: it only reads JSON)."""
import json
import os
import re
import sys
from collections import defaultdict

D = sys.argv[1] if len(sys.argv) > 1 else os.path.join("reports", "h200")


def load(name):
    with open(os.path.join(D, name)) as f:
        return json.load(f)


def main():
    out = []
    env = open(os.path.join(D, "env.txt")).read().strip().splitlines()
    out += ["# specrace on an NVIDIA H200: fidelity, CSAN cross-check, benchmarks", "",
            "Environment (`env.txt`): " + "; ".join(env[1:]), "",
            "Regenerate (on a CUDA machine, the carried wheels on `PYTHONPATH`): "
            "`tools/gpu/h200.sh phase1 DIR`, `tools/gpu/h200.sh phase2 DIR`, "
            "`specrace litmus --json > DIR/litmus_sim.json`, then "
            "`python3 tools/reports/h200_summary.py DIR`. `bench_cuda.json` (stall sweep, 10k soak), "
            "`bench_grammar.json` and `csan_compare.json` are from the previous session's run "
            "(`tools/gpu/h200.sh bench|grammar`, `tools/gpu/csan_compare.py`), not re-run here.", ""]
    # --- litmus fidelity
    sim, cuda = load("litmus_sim.json"), load("litmus_cuda.json")
    rows = defaultdict(dict)
    for p in sim["programs"] + cuda["programs"]:
        rows[p["name"]][p["policy"]] = p
    out += ["## Litmus programs: simulator vs GPU", "",
            f"Simulator: {sim['agree']}/{sim['total']} runs agree with the expected verdict; "
            f"H200: {cuda['agree']}/{cuda['total']} "
            f"({100.0 * cuda['agree'] / cuda['total']:.0f}%).", "",
            "| program | sim stall | sim lazy | sim eager | H200 + stall | H200 no stall | agree |",
            "|---|---|---|---|---|---|---|"]
    for name, pols in rows.items():
        stall = next((v for k, v in pols.items() if k.startswith("stall(")), None)
        cells = [stall, pols.get("lazy"), pols.get("eager"), pols.get("cuda+stall"), pols.get("cuda")]
        ok = all(c["agree"] for c in pols.values())
        out.append(f"| {name} | " + " | ".join(c["observed"] if c else "-" for c in cells)
                   + f" | {'yes' if ok else 'NO'} |")
    # --- scenarios
    out += ["", "## Scenarios on the H200", "",
            "| scenario | variant | fence | trials | reproduced | median trial | race sites | expected |",
            "|---|---|---|---|---|---|---|---|"]
    out[-2] = ("| target | scenario | variant | fence | trials | traced | reproduced | median "
               "trial | race sites | expected |")
    out[-1] = "|---|---|---|---|---|---|---|---|---|---|"
    for f in ("repro_prefix_fine", "repro_prefix_coarse", "repro_fixed_fine",
              "grammar_fixed", "grammar_no-event", "grammar_stale-mask",
              "upstream_prefix_fine", "upstream_fixed_fine", "upstream_grammar_fixed",
              "upstream_grammar_no-event"):
        try:
            r = load(f + ".json")
        except FileNotFoundError:
            continue
        out.append(f"| {r.get('target', 'impl')} | {r['scenario']} | {r['variant']} | "
                   f"{r['war_barrier']} | {r['trials']} | {r.get('traced_trials', '-')} | "
                   f"{r['reproduced']} ({100 * r['rate']:.0f}%) | {r['median_trial_ms']:.1f} ms | "
                   f"{len(r['races'])} | {r['expected_by_scenario']} |")
    out += ["", "Every trial is trace-captured (`traced`): the second-capture crash is gone "
            "(`second_capture_crash_bisect.txt`, `second_capture_crash_gdb.txt`). The seed "
            "race's report (pre-fix, fine fence): `seed/` (JSON, Markdown, Perfetto trace, "
            "timeline PNG); the fixed code's: `fixed/`; on installed sglang: `upstream_seed/`.",
            ""]
    try:
        so = load("upstream_soak.json")
        out += [f"Released sglang on CUDA, stalled {so['stall_ms']} ms after every "
                f"shared-read-done record: {so['stale_trials']} stale trials in "
                f"{so['iterations']} iterations ({so['trials']} trials). Goal: 0 in >= 1,000.", ""]
    except FileNotFoundError:
        pass
    # --- matrix
    for f, what in (("matrix_cuda.json", "impl"), ("matrix_cuda_sglang.json", "sglang")):
        m = load(f)
        out += [f"## Mutation matrix on the H200 (target {what})", "",
                f"{m['killed']}/{m['total']} killed, fixed-code findings {m['fixed_findings']}, "
                f"harness errors {m.get('harness_errors', 0)}, timeouts {m.get('timeouts', 0)}, "
                f"{m['seconds']:.0f} s: every cell in one child process, every trial traced; "
                "a cell whose device-side assert aborted the process was killed by the crash "
                "oracle and the rest went on in a fresh child.", "",
                "| mutation | killed | caught by | probe |", "|---|---|---|---|"]
        for r in m["mutations"]:
            out.append(f"| {r['name']} | {r.get('status', 'killed' if r['killed'] else 'NO')} | "
                       f"{r['caught_by']} | {r['probe']} |")
        out.append("")
    # --- CSAN
    c = load("csan_compare.json")
    out += ["", "## CSAN cross-check (`TORCH_CUDA_SANITIZER=1`)", "",
            f"Verdicts agree on {c['agree']}/{c['total']} programs. Every disagreement is a race "
            "CSAN cannot see (host accesses to pinned memory); neither tool reported a race "
            "where the program is ordered.", "",
            "| program | specrace race | CSAN | agree |", "|---|---|---|---|"]
    for r in c["rows"]:
        out.append(f"| {r['name']} | {r['specrace_race']} | {r['csan']} | {'yes' if r['agree'] else 'no'} |")
    # --- bench
    b = load("bench_cuda.json")["cuda"]
    out += ["", "## Benchmarks (`specrace bench cuda`)", "",
            "Seed race (pre-fix, fine fence) across a stall sweep, 50 trials each:", "",
            "| stall | reproduced | median trial |", "|---|---|---|"]
    for s in b["stall_sweep"]:
        out.append(f"| {s['stall_ms']} ms | {s['reproduced']}/{s['trials']} | {s['median_trial_ms']:.1f} ms |")
    so = b["fixed_soak"]
    cv = b["capture_vs_csan"]
    out += ["", f"Fixed code, stalled {so['stall_ms']} ms after every shared-read-done record: "
            f"{so['stale_trials']} stale trials in {so['iterations']} iterations ({so['trials']} trials, "
            f"{so['wall_s']:.0f} s). Goal: 0 in >= 10,000.", "",
            f"Trace capture vs CSAN, 3000 in-place adds: plain {cv['plain_us_per_op']:.1f} us/op, "
            f"our capture {cv['capture_us_per_op']:.1f} us/op ({cv['capture_x_plain']:.1f}x), CSAN "
            f"{cv['csan_us_per_op']:.1f} us/op ({cv['csan_x_plain']:.1f}x): ours costs "
            f"{cv['capture_x_plain'] / cv['csan_x_plain']:.2f} of CSAN's (goal <= 0.33).", ""]
    try:
        g = load("bench_grammar.json")["grammar_overlap"]
        out += ["Grammar staging (seed 000): per verify step of the device-drafted path, the host "
                f"mask build (launch + resolve + traversal) took {g['host_mask_build_median_us']:.0f} us "
                f"median (p90 {g['host_mask_build_p90_us']:.0f} us) over {g['verify_steps']} steps; the toy "
                f"model's verify forward takes {g['verify_forward_us']:.0f} us, so here the host work "
                f"does {'' if g['hidden'] else 'not '}hide under the forward. A real target "
                "model's verify forward is milliseconds: hundreds of microseconds of host "
                "traversal would hide there, which is the seed's intent.", ""]
    except FileNotFoundError:
        pass
    # --- memory lifetime and graphs
    try:
        a, g = load("alloc_rates.json"), load("graph_rates.json")
        out += ["## Memory lifetime and CUDA graphs: stalled-trial rates", "",
                f"A tensor read on schedule, freed without `record_stream`, its block reused on "
                f"its home stream: stale in {a['reuse_stale_read']}/50 stalled trials; with "
                f"`record_stream`: {a['reuse_record_stream']}/50.", "",
                "| graph program | expected | stale | race reported | agree |",
                "|---|---|---|---|---|"]
        for p in g["programs"]:
            out.append(f"| {p['name']} | {p['expected']} | {p['stale']}/{g['trials']} | "
                       f"{p['race_reported']}/{g['trials']} | {p['agree']}/{g['trials']} |")
        cv = load("capture_vs_csan.json")
        out += ["", f"Trace capture vs CSAN, re-measured with the allocator tracking and graph "
                f"capture in place: plain {cv['plain_us_per_op']:.1f} us/op, capture "
                f"{cv['capture_us_per_op']:.1f} ({cv['capture_x_plain']:.2f}x), CSAN "
                f"{cv['csan_us_per_op']:.1f} ({cv['csan_x_plain']:.2f}x): "
                f"{cv['capture_x_plain'] / cv['csan_x_plain']:.3f} of CSAN's cost "
                "(goal <= 0.333).", ""]
    except FileNotFoundError:
        pass
    # --- pytest
    log = open(os.path.join(D, "pytest.log")).read().strip().splitlines()
    out += ["## `pytest --specrace-backend cuda` on the H200", "",
            "`pytest.log`: " + log[-1], ""]
    failed = [m.group(1) for m in map(re.compile(r"^_{3,} (test\S*) _{3,}$").match, log) if m]
    out += [f"Failed: `{name}`" for name in failed]
    note = os.path.join(D, "pytest_note.md")
    if os.path.exists(note):  # what became of a failure (fixed, re-run), written by hand
        out += ["", open(note).read().strip()]
    if os.path.exists(os.path.join(D, "matrix_items_cuda.log")):
        items = open(os.path.join(D, "matrix_items_cuda.log")).read().strip().splitlines()
        table = [line for line in items if line.startswith("mutation kill matrix")]
        out += ["", "## `pytest --specrace-matrix --specrace-backend cuda -n 4` on the H200 (not re-run every session)", "",
                "`matrix_items_cuda.log`: " + (table[0] if table else "?") + "; " + items[-1], ""]
    with open(os.path.join(D, "README.md"), "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
