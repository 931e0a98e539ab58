"""The mutation kill matrix: the fixed code against every probe (must stay clean), then
each seeded bug against its probes until one catches it. A probe is a scenario run under
one schedule on a few seeds; the oracle that fired is recorded as ``caught_by``."""
from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from harness.oracle.runner import run_trial, server_args

from .mutations import BY_NAME, MUTATIONS, Mutation
from .registry import get


@dataclass(frozen=True)
class Probe:
    name: str
    scenario: str
    variant: str
    policy: str
    seeds: Tuple[int, ...] = (0, 1, 2)
    war_barrier: str = "fine"


PROBES: Dict[str, Probe] = {p.name: p for p in (
    Probe("seed-eager", "ngram-filter-race", "fixed", "eager"),
    Probe("seed-lazy", "ngram-filter-race", "fixed", "lazy"),
    Probe("seed-stall", "ngram-filter-race", "fixed", "stall(forward)"),
    Probe("grammar-ngram", "grammar-ngram", "fixed", "eager", seeds=(0, 1)),
    Probe("grammar-eagle", "grammar-tree-staging", "fixed", "eager", seeds=(0, 1)),
    Probe("grammar-lazy", "grammar-ngram", "fixed", "lazy", seeds=(0, 1)),
    Probe("mixed-overlap", "mixed-overlap", "fixed", "stall(forward)", seeds=(0, 1)),
    Probe("dp-idle", "dp-idle", "fixed", "lazy", seeds=(0, 1)),
)}


def oracle_of(result) -> str:
    if result.divergence is not None:
        kind = result.divergence["kind"]
        return {"accept_lens": "stale-value", "accept_tokens": "stale-value",
                "output": "output", "grammar": "grammar", "crash": "crash"}.get(kind, kind)
    return "happens-before"


def run_probe(probe: Probe, backend: str, mutation: Optional[Mutation] = None
              ) -> Tuple[bool, Optional[str], Optional[str]]:
    """(killed, oracle, one-line detail) -- stops at the first trial that finds something."""
    sc = get(probe.scenario)
    for seed in probe.seeds:
        wl = sc.workload(seed)
        args = server_args(wl, {**sc.variants[probe.variant], "war_barrier": probe.war_barrier})
        # On CUDA only the first trial is trace-captured (one captured engine run per
        # process: a second one crashed torch 2.11 on the H200); later seeds judge values.
        res = run_trial(backend, probe.policy if backend == "sim" else "hardware", wl, args,
                        sc.stalls(None), detect_races=backend == "sim" or seed == probe.seeds[0],
                        mutation=mutation or sc.variants[probe.variant].get("mutation"),
                        answers=sc.answers)
        if res.reproduced:
            detail = (res.divergence["message"] if res.divergence
                      else res.races[0].summary())
            return True, oracle_of(res), f"seed {seed}: {detail}"
    return False, None, None


def fixed_row(probe: Probe, backend: str) -> dict:
    killed, oracle, detail = run_probe(probe, backend)
    return {"probe": probe.name, "finding": detail if killed else None, "oracle": oracle}


def mutation_row(m: Mutation, backend: str) -> dict:
    m.check()  # a patch that no longer applies is a harness error, never a kill
    t0 = time.perf_counter()
    row = {"name": m.name, "summary": m.summary, "source": m.source, "killed": False,
           "caught_by": None, "probe": None, "detail": None}
    for probe_name in m.probes:
        killed, oracle, detail = run_probe(PROBES[probe_name], backend, m)
        if killed:
            row.update(killed=True, caught_by=oracle, probe=probe_name, detail=detail)
            break
    row["seconds"] = round(time.perf_counter() - t0, 3)
    return row


HARNESS_ERROR = 3  # a child's exit code when the harness itself failed (not the engine)


def _isolated(kind: str, name: str, backend: str) -> dict:
    """Run one matrix cell in a fresh process. On a GPU a killed mutation often takes a
    device-side assert, which is sticky: the process cannot run anything after it. A
    process that dies that way has been killed by the crash oracle."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "scenarios.matrix", kind, name, backend],
                          capture_output=True, text=True, timeout=600)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode in (0, HARNESS_ERROR) and lines:
        row = json.loads(lines[-1])
        if proc.returncode == HARNESS_ERROR:
            raise RuntimeError(f"matrix cell {kind} {name}: {row['error']}")
        return row
    err = next((ln for ln in proc.stderr.splitlines()[::-1] if "Error" in ln or "error" in ln),
               (proc.stderr.strip().splitlines() or ["?"])[-1])
    detail = f"process died (rc {proc.returncode}): {err.strip()[:200]}"
    if kind == "probe":
        return {"probe": name, "finding": detail, "oracle": "crash"}
    m = BY_NAME[name]
    return {"name": m.name, "summary": m.summary, "source": m.source, "killed": True,
            "caught_by": "crash", "probe": None, "detail": detail,
            "seconds": round(time.perf_counter() - t0, 3)}


def run_matrix(backend: str = "sim", progress: Optional[Callable[..., None]] = None,
               mutations: Optional[List[Mutation]] = None) -> dict:
    """On the simulator everything runs in this process; on CUDA each cell runs in a
    process of its own (see ``_isolated``)."""
    mutations = MUTATIONS if mutations is None else mutations
    total_steps = len(PROBES) + len(mutations)
    done = 0
    t_start = time.perf_counter()
    fixed, rows = [], []
    if backend == "sim":
        for probe in PROBES.values():
            fixed.append(fixed_row(probe, backend))
            done += 1
            if progress:
                progress(done, total_steps)
        for m in mutations:
            rows.append(mutation_row(m, backend))
            done += 1
            if progress:
                progress(done, total_steps)
    else:
        # Cells in parallel processes sharing the GPU: each is mostly host work.
        cells = [("probe", p.name) for p in PROBES.values()] + \
                [("mutation", m.name) for m in mutations]
        workers = max(1, min(8, (os.cpu_count() or 2) // 2))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(lambda c: _isolated(c[0], c[1], backend), cells))
        fixed = [r for (kind, _), r in zip(cells, results) if kind == "probe"]
        rows = [r for (kind, _), r in zip(cells, results) if kind == "mutation"]
    return {"backend": backend,
            "fixed_findings": sum(1 for f in fixed if f["finding"]),
            "fixed": fixed,
            "total": len(rows), "killed": sum(r["killed"] for r in rows),
            "seconds": round(time.perf_counter() - t_start, 3),
            "mutations": rows}


def format_matrix(res: dict) -> str:
    lines = [f"mutation kill matrix on {res['backend']}: {res['killed']}/{res['total']} killed, "
             f"fixed code findings: {res['fixed_findings']}, {res['seconds']:.1f} s"]
    for f in res["fixed"]:
        lines.append(f"  fixed  {f['probe']:<16} {'FINDING: ' + f['finding'] if f['finding'] else 'clean'}")
    for r in res["mutations"]:
        mark = "killed" if r["killed"] else "SURVIVED"
        by = f"{r['caught_by']} @ {r['probe']}" if r["killed"] else "-"
        lines.append(f"  {mark:<8} {r['name']:<36} {by:<34} {r['seconds']:6.2f}s")
    return "\n".join(lines)


if __name__ == "__main__":  # one isolated cell: python -m scenarios.matrix KIND NAME BACKEND
    _kind, _name, _backend = sys.argv[1:4]
    try:
        if _kind == "mutation":
            BY_NAME[_name].check()
    except Exception as _exc:  # the patch does not apply: say so, don't count a kill
        print(json.dumps({"error": f"{type(_exc).__name__}: {_exc}"}), flush=True)
        os._exit(HARNESS_ERROR)
    _row = (fixed_row(PROBES[_name], _backend) if _kind == "probe"
            else mutation_row(BY_NAME[_name], _backend))
    print(json.dumps(_row, default=str), flush=True)
    sys.stdout.flush()
    os._exit(0)  # a poisoned CUDA context must not get to run destructors
