"""The CUDA soak: the fixed code, stalled, for at least N engine iterations (a benchmark,
``specrace bench cuda``'s ``fixed_soak``; ``tools/h200*.sh`` call it directly)."""
from __future__ import annotations

import time
from typing import Dict

import targets


def soak_fixed(min_iterations: int, stall_ms: float = 0.5,
               target: str = "impl", scenario: str = "",
               variant: str = "") -> Dict[str, object]:
    """The fixed code stalled for >= N iterations: after every shared-read-done record on
    long random workloads, or -- ``scenario`` -- that scenario's workloads and stalls
    (``variant``, by default its released one), seed after seed."""
    from harness.trials.drive import server_args
    from harness.trials.trial import run_trial
    from scenarios.workloads import random_workload
    from seams.faults.plan import StallAt
    if scenario:
        from scenarios.registry import get
        sc = get(scenario)
        chosen = sc.variants[variant or sc.default_variant]
        overrides = {**chosen.args, "war_barrier": "fine"}
        if chosen.mutation is not None:
            raise ValueError(f"variant {variant} seeds a bug: not the fixed code")

        def setup(seed: int):
            wl = sc.workload(seed)
            return wl, sc.stalls(stall_ms), server_args(wl, overrides, targets.get(target))
    else:
        def setup(seed: int):
            wl = random_workload(seed, n_requests=24, max_arrive=60, min_tokens=20,
                                 max_tokens=60)
            return (wl, [StallAt("forward.after_read_done", stall_ms)],
                    server_args(wl, {"relay": "future_map", "war_barrier": "fine"},
                                targets.get(target)))
    iterations, stale, trials, seed = 0, 0, 0, 1000
    kinds: Dict[str, int] = {}
    t0 = time.perf_counter()
    while iterations < min_iterations:
        wl, stalls, args = setup(seed)
        res = run_trial("cuda", None, wl, args, stalls, detect_races=False,
                        target=targets.get(target))
        if res.divergence is not None:
            stale += 1
            kinds[res.divergence.kind] = kinds.get(res.divergence.kind, 0) + 1
        iterations += res.iterations
        trials += 1
        seed += 1
    return {"target": target, "scenario": scenario or "random", "iterations": iterations,
            "trials": trials, "stale_trials": stale, "divergence_kinds": kinds,
            "stall_ms": stall_ms, "wall_s": time.perf_counter() - t0}
