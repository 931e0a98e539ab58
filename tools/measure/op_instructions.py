"""The simulator's per-op cost against the bare-wrapper floor, in CPU instructions: the
figure ``bench runtime`` times, counted instead (a benchmark, not a test).

On a shared box the timed ratio (``sim_eager_x_floor``) moves by a quarter between runs
of the same code; an instruction count does not. Each side runs ``bench``'s op mix under
valgrind's cachegrind twice, at two lengths, in a fresh process: the difference is the
instructions of the extra ops alone (imports and set-up cancel). One torch thread, a
fixed hash seed and no address randomisation make the count repeat to the instruction.
Needs ``valgrind`` and ``setarch`` on PATH; takes ~5 minutes on 2 cores.

``--detail`` also simulates the caches and branch predictors (cachegrind's
``--cache-sim=yes --branch-sim=yes``; ~3x slower): the per-op mispredicted branches and
first-level data-cache misses, whose ratios are above the instruction ratio -- why the
timed ratio sits above the counted one.

Usage: python tools/measure/op_instructions.py [--detail]  (prints the figures and ratios)
       python tools/measure/op_instructions.py sim N       (internal: one run of N iterations)
"""
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Dict

SHORT, LONG = 5, 45  # iterations of the op mix; each run does the mix twice (see _one)


def _one(what: str, n_iter: int) -> None:
    import torch

    from specrace.bench import _op_mix
    if what == "sim":
        from harness.policies import Eager
        from harness.runtime.sim.runtime import sim_runtime
        for _ in range(2):
            with sim_runtime(Eager()) as rt:
                fwd = rt.module.Stream()
                rt.label(fwd, "forward")
                with rt.module.stream(fwd):
                    _op_mix(rt.device, n_iter)
                rt.synchronize()
    else:
        from specrace.bench_floor import bare_wrapper
        for _ in range(2):
            with torch.no_grad():
                _op_mix("cpu", n_iter, bare_wrapper)


# cachegrind's summary lines: the figure each event is read from
_EVENTS = {"instructions": r"I\s+refs:\s+([\d,]+)",
           "mispredicted branches": r"Mispredicts:\s+([\d,]+)",
           "D1 data-cache misses": r"D1\s+misses:\s+([\d,]+)"}


def _count(what: str, n_iter: int, detail: bool) -> Dict[str, int]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
    sim = "yes" if detail else "no"
    cmd = ["setarch", "x86_64", "-R", "valgrind", "--tool=cachegrind", f"--cache-sim={sim}",
           f"--branch-sim={sim}", "--cachegrind-out-file=/dev/null", sys.executable, __file__,
           what, str(n_iter)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stderr
    counts = {}
    for event, pattern in _EVENTS.items():
        m = re.search(pattern, out)
        if m is None:
            if event == "instructions" or detail:
                raise SystemExit(f"no {event} count in valgrind's output:\n{out[-2000:]}")
            continue
        counts[event] = int(m.group(1).replace(",", ""))
    return counts


def main(detail: bool) -> None:
    from specrace.bench import OPS_PER_ITERATION, SIZES
    # ops the long runs issue beyond the short (two mixes each, ``_one``)
    ops = 2 * len(SIZES) * OPS_PER_ITERATION * (LONG - SHORT)
    jobs = [(w, n) for w in ("sim", "floor") for n in (SHORT, LONG)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        counts = dict(zip(jobs, pool.map(lambda j: _count(*j, detail), jobs)))
    for event in counts[("sim", LONG)]:
        per_op = {w: (counts[(w, LONG)][event] - counts[(w, SHORT)][event]) / ops
                  for w in ("sim", "floor")}
        goal = "   (goal <= 1.5x)" if event == "instructions" else ""
        print(f"{event} per op: sim_eager {per_op['sim']:10.0f}   floor_bare_wrapper "
              f"{per_op['floor']:10.0f}   sim_eager_x_floor {per_op['sim'] / per_op['floor']:6.3f}"
              f"{goal}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and not sys.argv[1].startswith("-"):
        _one(sys.argv[1], int(sys.argv[2]))
    elif sys.argv[1:] in ([], ["--detail"]):
        main(detail=sys.argv[1:] == ["--detail"])
    else:
        print("usage: op_instructions.py [--detail]", file=sys.stderr)
        raise SystemExit(2)
