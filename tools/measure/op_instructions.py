"""The simulator's per-op cost against the bare-wrapper floor, in CPU instructions: the
figure ``bench runtime`` times, counted instead (a benchmark, not a test).

On a shared box the timed ratio (``sim_eager_x_floor``) moves by a quarter between runs
of the same code; an instruction count does not. Each side runs ``bench``'s op mix under
valgrind's cachegrind twice, at two lengths, in a fresh process: the difference is the
instructions of the extra ops alone (imports and set-up cancel). One torch thread, a
fixed hash seed and no address randomisation make the count repeat to the instruction.
Needs ``valgrind`` and ``setarch`` on PATH; takes ~5 minutes on 2 cores.

Usage: python tools/measure/op_instructions.py        (prints both figures and the ratio)
       python tools/measure/op_instructions.py sim N  (internal: one run of N iterations)
"""
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

SHORT, LONG = 5, 45  # iterations of the op mix; each run does the mix twice (see _one)


def _one(what: str, n_iter: int) -> None:
    import torch

    from harness.bench import _op_mix
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
        from harness.bench_floor import bare_wrapper
        for _ in range(2):
            with torch.no_grad():
                _op_mix("cpu", n_iter, bare_wrapper)


def _count(what: str, n_iter: int) -> int:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
    cmd = ["setarch", "x86_64", "-R", "valgrind", "--tool=cachegrind", "--cache-sim=no",
           "--cachegrind-out-file=/dev/null", sys.executable, __file__, what, str(n_iter)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stderr
    m = re.search(r"I\s+refs:\s+([\d,]+)", out)
    if m is None:
        raise SystemExit(f"no instruction count in valgrind's output:\n{out[-2000:]}")
    return int(m.group(1).replace(",", ""))


def main() -> None:
    from harness.bench import SIZES
    ops = 2 * len(SIZES) * 7 * (LONG - SHORT)  # ops the long runs issue beyond the short
    jobs = [(w, n) for w in ("sim", "floor") for n in (SHORT, LONG)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        counts = dict(zip(jobs, pool.map(lambda j: _count(*j), jobs)))
    per_op = {w: (counts[(w, LONG)] - counts[(w, SHORT)]) / ops for w in ("sim", "floor")}
    print(f"sim_eager instructions per op     {per_op['sim']:10.0f}")
    print(f"floor_bare_wrapper per op         {per_op['floor']:10.0f}")
    print(f"sim_eager_x_floor (instructions)  {per_op['sim'] / per_op['floor']:10.3f}"
          f"   (goal <= 1.5x)")


if __name__ == "__main__":
    if len(sys.argv) == 3:
        _one(sys.argv[1], int(sys.argv[2]))
    else:
        main()
