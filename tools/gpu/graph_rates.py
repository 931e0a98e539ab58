"""CUDA-graph litmus programs, many stalled trials each, on this GPU (issue 16's figure:
a replay on forward read on schedule without a wait is stale in every stalled trial, and in
none with ``schedule.wait_stream(forward)``). Prints one JSON object: per program, how many
trials were stale and how many traces the detector flagged, against the expectation.

    python3 tools/gpu/graph_rates.py [TRIALS] > reports/h200/graph_rates.json
"""
import json
import sys

sys.path.insert(0, ".")

from litmus.programs import GRAPH_PROGRAMS  # noqa: E402
from litmus.run import run_one_cuda  # noqa: E402


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    out = {"trials": trials, "programs": []}
    for prog in GRAPH_PROGRAMS:
        rows = [run_one_cuda(prog, "cuda+stall") for _ in range(trials)]
        out["programs"].append({
            "name": prog.name,
            "expected": rows[0]["expected"],
            "stale": sum(r["observed"].startswith("stale") for r in rows),
            "race_reported": sum(r["observed"].endswith("+race") for r in rows),
            "errors": sorted({r["observed"] for r in rows if r["observed"].startswith("error")}),
            "agree": sum(r["agree"] for r in rows),
        })
        print(f"{prog.name}: {out['programs'][-1]}", file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
