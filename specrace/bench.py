"""``specrace bench``: figures, measured in one run, printed as ratios where possible.

Benchmarks, never tests: the machines are noisy and shared, so nothing here asserts a
speed; each figure is printed next to the goal it is held against (the goals:
reports/measurements.md). A time is the best of its interleaved rounds; a ratio is the
median of the rounds' side-by-side ratios (``bench_rounds.paired_ratio``), not a ratio of two bests.

* runtime -- µs per op of a realistic op mix (gather, index_put_, cat, small int
  arithmetic on 64..4096 elements) on plain CPU torch and on the simulator under each
  policy, the detector's cost per traced op, and the floors of Python dispatch itself
  on the same mix (``bench_floor.py``: a no-op dispatch mode, a bare wrapper subclass);
* engine  -- one NGRAM engine iteration on plain CPU torch vs on the simulator;
* matrix  -- wall time of the mutation matrix on the simulator;
* cuda    -- on a GPU: seed-race repro rate and median trial time across a stall sweep,
  stale values over >= 10,000 stalled iterations of the fixed code, and trace-capture
  cost per op against CSAN's on the same workload.
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, Optional

import torch

from seams import children
from seams.process import changed_for_the_block
import targets
from specrace.bench_rounds import best_of, interleaved, paired_ratio
from specrace.soak import soak_fixed  # noqa: F401  (tools/h200*.sh import it from here)

SIZES = (64, 512, 4096)
OPS_PER_ITERATION = 7  # what ``_op_mix`` counts per iteration of its loop


def _op_mix(device, n_iter: int, wrap: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
            ) -> int:
    """The op mix; returns the number of ops issued. ``wrap``: how its three starting
    tensors become the measured kind (the floors' wrapper subclass)."""
    ops = 0
    for size in SIZES:
        a = wrap(torch.arange(size, dtype=torch.int64, device=device))
        idx = wrap(torch.arange(0, size, 2, dtype=torch.int64, device=device))
        buf = wrap(torch.zeros(size, dtype=torch.int64, device=device))
        ops += 3
        for _ in range(n_iter):
            g = a[idx]  # gather
            buf[idx] = g + 1  # arithmetic + index_put_
            c = torch.cat((g, g))
            a = a * 3 + c[:size] % 7  # small arithmetic
            ops += OPS_PER_ITERATION
    return ops


def bench_runtime(n_iter: int = 100) -> Dict[str, float]:
    """The runtime figures (the module's docstring), ``n_iter`` iterations a run."""
    runs = _runtime_runs(n_iter)
    runs["plain_cpu"]()  # warm-up
    # nine rounds, not five: the box this runs on is shared, and more, shorter samples
    # more often hold a quiet moment for each figure
    samples = interleaved(runs, rounds=9)
    return _runtime_figures(runs, samples)


def _runtime_runs(n_iter: int) -> Dict[str, Callable[[], float]]:
    """The timed runs of the op mix, in the order the rounds interleave them: plain CPU,
    the simulator under each policy, the detector, the two floors (each µs per op)."""
    from harness.detect import detect
    from harness.policies import Eager, parse_policy
    from harness.runtime.sim.runtime import sim_runtime

    def plain() -> float:
        t = time.perf_counter()
        with torch.no_grad():
            n = _op_mix("cpu", n_iter)
        return (time.perf_counter() - t) / n * 1e6
    runs: Dict[str, Callable[[], float]] = {"plain_cpu": plain}
    for pol in map(parse_policy, ("eager", "lazy", "stall(forward)", "random(1)", "pct(1,3)")):
        def run(pol=pol) -> float:
            with sim_runtime(pol) as rt:
                fwd = rt.module.Stream()
                rt.label(fwd, "forward")
                t = time.perf_counter()
                with rt.module.stream(fwd):
                    n = _op_mix(rt.device, n_iter)
                rt.synchronize()
                return (time.perf_counter() - t) / n * 1e6
        runs[f"sim_{pol}"] = run

    def detector() -> float:
        with sim_runtime(Eager()) as rt:
            n = _op_mix(rt.device, n_iter)
            t = time.perf_counter()
            detect(rt.trace)
            return (time.perf_counter() - t) / n * 1e6
    runs["detector"] = detector

    def floor(mode: bool) -> float:
        from specrace.bench_floor import bare_wrapper, no_op_mode
        with torch.no_grad():
            if mode:
                with no_op_mode():
                    t = time.perf_counter()
                    n = _op_mix("cpu", n_iter)
            else:
                t = time.perf_counter()
                n = _op_mix("cpu", n_iter, bare_wrapper)
        return (time.perf_counter() - t) / n * 1e6
    runs["floor_dispatch_mode"] = lambda: floor(True)
    runs["floor_bare_wrapper"] = lambda: floor(False)
    return runs


def _runtime_figures(runs: Dict[str, Callable[[], float]], samples) -> Dict[str, float]:
    """The runtime figures from the interleaved samples: each run's best, and its ratios."""
    out: Dict[str, float] = {}
    out.update({f"{k}_us_per_op": v for k, v in best_of(samples).items()})
    for k in runs:
        if k != "plain_cpu":
            out[f"{k}_x_plain"] = paired_ratio(samples, k, "plain_cpu")
    # the simulator against what any wrapper-subclass interposer pays on the same op mix:
    # its own cost, as a ratio measured in this run
    out["sim_eager_x_floor"] = paired_ratio(samples, "sim_eager", "floor_bare_wrapper")
    # beside it, the ratio of the two bests (the estimator before the paired one): a goal
    # is met when both are under it
    out["sim_eager_x_floor_of_bests"] = (out["sim_eager_us_per_op"]
                                         / out["floor_bare_wrapper_us_per_op"])
    return out


class _PlainCPU:
    """The engine on plain CPU torch: torch.cpu's no-op streams, no dispatch mode."""
    backend = "cpu"
    device = torch.device("cpu")

    def label(self, stream, name) -> None:
        pass

    def synchronize(self) -> None:
        pass


def bench_engine(seeds=(0, 1, 2), target: Optional[str] = None) -> Dict[str, float]:
    """Per engine iteration: the simulator against plain CPU torch (impl), and -- when
    ``target`` is sglang, or is None and sglang is installed -- the upstream target's
    engine on the simulator next to impl's (plain CPU cannot run upstream's code: it
    pins host memory, which CPU-only torch cannot)."""
    from harness.trials.drive import drive, server_args
    from harness.policies import Eager, parse_policy
    from seams.faults.plan import FaultPlan
    from harness.runtime.sim.runtime import sim_runtime
    from scenarios.registry import get
    sc = get("ngram-filter-race")
    out: Dict[str, float] = {}

    def per_iteration(make_rt, target: str = "impl") -> float:
        total_t, total_it = 0.0, 0
        for seed in seeds:
            wl = sc.workload(seed)
            args = server_args(wl, {"relay": "future_map"}, targets.get(target))
            stats: Dict[str, int] = {}
            with make_rt() as rt:
                t = time.perf_counter()
                drive(rt, wl, args, FaultPlan(), targets.get(target), stats)
                total_t += time.perf_counter() - t
            total_it += stats["iterations"]
        return total_t / max(total_it, 1) * 1e3

    @contextlib.contextmanager
    def plain():
        with torch.no_grad():
            yield _PlainCPU()
    per_iteration(plain)  # warm-up: weights, caches
    sims = [(pol, lambda pol=pol: sim_runtime(pol))
            for pol in map(parse_policy, ("eager", "lazy", "stall(forward)"))]
    per_iteration(sims[0][1])  # and the simulator's (its first run is ~4x a later one)
    samples = interleaved({"plain_cpu": lambda: per_iteration(plain),
                            **{f"sim_{p}": (lambda m=m: per_iteration(m)) for p, m in sims}})
    best = best_of(samples)
    out["plain_cpu_ms_per_iteration"] = best["plain_cpu"]
    for pol, _ in sims:
        out[f"sim_{pol}_ms_per_iteration"] = best[f"sim_{pol}"]
        out[f"sim_{pol}_x_plain"] = paired_ratio(samples, f"sim_{pol}", "plain_cpu")
    out["sim_eager_x_plain_of_bests"] = best["sim_eager"] / best["plain_cpu"]
    if target in (None, "sglang") and _sglang_loadable(required=target == "sglang"):
        def eager():
            return sim_runtime(Eager())
        per_iteration(eager, "sglang")  # warm-up (imports, the platform, compiled patches)
        out["sglang_sim_eager_ms_per_iteration"] = min(per_iteration(eager, "sglang")
                                                       for _ in range(2))
        out["sglang_x_impl"] = (out["sglang_sim_eager_ms_per_iteration"]
                                / out["sim_eager_ms_per_iteration"])
    return out


def _sglang_loadable(required: bool) -> bool:
    try:
        targets.get("sglang")
        return True
    except targets.TargetError:
        if required:
            raise
        return False


def bench_matrix(target: Optional[str] = None) -> Dict[str, float]:
    from matrix.run import run_matrix
    t = time.perf_counter()
    res = run_matrix("sim", target=target or "impl")
    wall = time.perf_counter() - t
    secs = [m["seconds"] for m in res["mutations"]]
    return {"matrix_wall_s": wall, "mutations": res["total"], "killed": res["killed"],
            "fixed_findings": res["fixed_findings"],
            "median_kill_s": statistics.median(secs) if secs else 0.0,
            "max_kill_s": max(secs) if secs else 0.0}


# --- CUDA ---------------------------------------------------------------------------------

STALL_SWEEP_MS = (0.0, 0.05, 0.1, 0.5, 1.0)


def bench_cuda(trials: int = 50, soak_iterations: int = 10_000) -> Dict[str, object]:
    from scenarios.resolve import run_scenario_result
    out: Dict[str, object] = {"gpu": torch.cuda.get_device_name(0)}
    sweep = []
    for ms in STALL_SWEEP_MS:
        res = run_scenario_result("ngram-filter-race", variant="pre-fix", war_barrier="fine",
                                  backend="cuda", stall_ms=ms, trials=trials, detect=False)
        sweep.append({"stall_ms": ms, "reproduced": res.reproduced, "trials": trials,
                      "rate": res.rate, "median_trial_ms": res.median_trial_ms})
        print(f"bench: stall {ms} ms: reproduced {res.reproduced}/{trials}, "
              f"median trial {res.median_trial_ms:.1f} ms", file=sys.stderr, flush=True)
    out["stall_sweep"] = sweep
    out["fixed_soak"] = soak_fixed(soak_iterations)
    out["capture_vs_csan"] = capture_vs_csan()
    out["grammar_overlap"] = bench_grammar_overlap()
    return out


_CAPTURE_SNIPPET = r"""
import sys, time, torch
mode = sys.argv[1]
x = torch.zeros(1024, device="cuda")
def run(n):
    for _ in range(n):
        x.add_(1)
    torch.cuda.synchronize()
run(300)
if mode == "capture":
    from harness.runtime import open_runtime
    ctx = open_runtime("cuda", trace=True)
    ctx.__enter__()
    run(300)
t = time.perf_counter(); run(3000); dt = time.perf_counter() - t
print(dt / 3000 * 1e6)
"""


def capture_vs_csan() -> Dict[str, float]:
    """µs/op of 3000 in-place adds: plain, our capture, CSAN (each in a fresh process,
    as CSAN must be enabled at start-up)."""
    res: Dict[str, float] = {}
    for mode in ("plain", "capture", "csan"):
        env = dict(os.environ)
        if mode == "csan":
            env["TORCH_CUDA_SANITIZER"] = "1"
        p = subprocess.run(children.command(sys.executable, "-c", _CAPTURE_SNIPPET, mode),
                           env=children.env(base=env), capture_output=True, text=True,
                           timeout=300)
        try:
            res[f"{mode}_us_per_op"] = float(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            res[f"{mode}_error"] = (p.stderr or p.stdout).strip().splitlines()[-1:]
    if "plain_us_per_op" in res:
        for mode in ("capture", "csan"):
            if f"{mode}_us_per_op" in res:
                res[f"{mode}_x_plain"] = res[f"{mode}_us_per_op"] / res["plain_us_per_op"]
    return res


def bench_grammar_overlap(trials: int = 4) -> Dict[str, object]:
    """Does the host grammar work hide under the verify forward (PR #32393's intent)?

    Host side: from just before the verify launch (``forward.after_read_done``) to the end
    of the traversal (``grammar.before_mask_upload``): launch + ``resolve()`` + traversal,
    per verify step of the device-drafted path. Device side: the verify forward for the
    same batch shape, timed with events."""
    from harness.trials.drive import drive, server_args
    from seams.faults.plan import FaultPlan
    from harness.runtime import open_runtime
    from toys.model import ToyTargetModel
    from scenarios.registry import get
    sc = get("grammar-tree-staging")
    host_us: list = []
    shapes: list = []

    class Timer(FaultPlan):
        def hit(self, name, ctx):
            if name == "forward.after_read_done":
                self.t0 = time.perf_counter()
            elif name == "grammar.before_mask_upload" and getattr(self, "t0", None):
                host_us.append((time.perf_counter() - self.t0) * 1e6)
                self.t0 = None

        def ask(self, name, default, ctx):
            return default
    for seed in range(trials):
        wl = sc.workload(seed)
        args = server_args(wl, sc.variants["fixed"].args, targets.get("impl"))
        with open_runtime("cuda", trace=False) as rt:
            drive(rt, wl, args, Timer(), targets.get("impl"))
        shapes.append(len(wl.requests) * wl.draft_token_num)
    dev = torch.device("cuda")
    model = ToyTargetModel(dev)
    ids = torch.zeros(max(shapes), dtype=torch.int64, device=dev)
    for _ in range(20):
        model.forward(ids)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(200):
        model.forward(ids)
    end.record()
    end.synchronize()
    fwd_us = start.elapsed_time(end) / 200 * 1e3
    med = statistics.median(host_us) if host_us else float("nan")
    return {"verify_steps": len(host_us), "host_mask_build_median_us": med,
            "host_mask_build_p90_us": sorted(host_us)[int(0.9 * (len(host_us) - 1))] if host_us else None,
            "verify_forward_us": fwd_us, "hidden": med <= fwd_us,
            "note": "toy target model: a real model's verify forward is ms, not us"}


def run_bench(what: str = "all", quiet: bool = False,
              target: Optional[str] = None) -> Dict[str, object]:
    """Run the benchmarks; a human-readable table on stdout unless ``quiet`` (--json)."""
    out: Dict[str, object] = {}
    _print = (lambda *a: None) if quiet else _print_table
    with changed_for_the_block(torch.get_num_threads, torch.set_num_threads, BENCH_THREADS):
        _run_sections(what, out, _print, target)
    return out


# Every CPU figure is measured with one intra-op thread: the simulator is single-threaded
# Python, and a plain-torch baseline on a varying number of threads (a loaded 2-core CI
# box, a 16-core GPU host) would make the same ratio mean different things; one setting
# for the whole run also keeps ``bench`` and ``bench engine`` alone in agreement.
BENCH_THREADS = 1


def _run_sections(what: str, out: Dict[str, object], _print, target: Optional[str]) -> None:
    if what in ("all", "runtime"):
        out["runtime"] = bench_runtime()
        _print("runtime", out["runtime"], {"sim_eager_x_plain": "<= 6x",
                                           "sim_eager_x_floor": "<= 1.5x",
                                           "sim_eager_x_floor_of_bests": "<= 1.5x"})
    if what in ("all", "engine"):
        out["engine"] = bench_engine(target=target)
        _print("engine", out["engine"], {"sim_eager_x_plain": "<= 4x",
                                         "sim_eager_x_plain_of_bests": "<= 4x"})
    if what in ("all", "matrix"):
        out["matrix"] = bench_matrix(target)
        _print("matrix", out["matrix"], {"matrix_wall_s": "<= 60 s on 2 cores",
                                         "median_kill_s": "<= 1 s"})
    if what == "grammar" and torch.cuda.is_available():
        out["grammar_overlap"] = bench_grammar_overlap()
        _print("grammar_overlap", out["grammar_overlap"], {})
    if what in ("all", "cuda") and torch.cuda.is_available():
        out["cuda"] = bench_cuda()
        _print("cuda", out["cuda"], {})
    elif what == "cuda":
        print("bench cuda: no GPU on this machine", file=sys.stderr)


def _print_table(section: str, figures: Dict[str, object], goals: Dict[str, str]) -> None:
    print(f"[{section}]")
    for k, v in figures.items():
        goal = f"   (goal {goals[k]})" if k in goals else ""
        val = f"{v:.3f}" if isinstance(v, float) else str(v)
        print(f"  {k:<34} {val}{goal}")
