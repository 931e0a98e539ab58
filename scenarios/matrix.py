"""The mutation kill matrix: the fixed code against every probe (must stay clean), then
each seeded bug against its probes until one catches it. A probe is a scenario run under
one schedule on a few seeds; the oracle that fired is recorded as ``caught_by``.

Every cell ends in a row, whatever happens in it: a mutation row's ``status`` is
``killed``, ``survived``, ``harness-error`` (its patch does not apply to this tree; the
rest still run) or ``timeout`` (an isolated cell that ran past its watchdog)."""
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
from harness.runtime.limits import gpu_watchdog, watchdog_seconds

from .mutations import Mutation, MutationError
from .mutations.catalogue import by_name, mutations_for
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


def probes_for(target: str) -> Dict[str, Probe]:
    """The probes whose scenario runs on ``target``."""
    import targets
    tgt = targets.get(target)
    return {n: p for n, p in PROBES.items() if tgt.supports(p.scenario)}


def oracle_of(result) -> str:
    if result.divergence is not None:
        kind = result.divergence["kind"]
        return {"accept_lens": "stale-value", "accept_tokens": "stale-value",
                "output": "output", "grammar": "grammar", "crash": "crash"}.get(kind, kind)
    return "happens-before"


def run_probe(probe: Probe, backend: str, mutation: Optional[Mutation] = None,
              target: str = "impl") -> Tuple[bool, Optional[str], Optional[str]]:
    """(killed, oracle, one-line detail) -- stops at the first trial that finds something."""
    sc = get(probe.scenario)
    for seed in probe.seeds:
        wl = sc.workload(seed)
        args = server_args(wl, {**sc.variants[probe.variant], "war_barrier": probe.war_barrier})
        # On CUDA only the first trial is trace-captured (one captured engine run per
        # process: a second one crashed torch 2.11 on the H200); later seeds judge values.
        res = run_trial(backend, probe.policy if backend == "sim" else "hardware", wl, args,
                        sc.stalls(None), detect_races=backend == "sim" or seed == probe.seeds[0],
                        mutation=mutation or sc.mutation(probe.variant, target),
                        answers=sc.answers, target=target)
        if res.reproduced:
            detail = (res.divergence["message"] if res.divergence
                      else res.races[0].summary())
            return True, oracle_of(res), f"seed {seed}: {detail}"
    return False, None, None


def fixed_row(probe: Probe, backend: str, target: str = "impl") -> dict:
    killed, oracle, detail = run_probe(probe, backend, target=target)
    return {"probe": probe.name, "finding": detail if killed else None, "oracle": oracle,
            "status": "finding" if killed else "clean"}


def _row(m: Mutation, status: str, **kw) -> dict:
    row = {"name": m.name, "summary": m.summary, "source": m.source,
           "killed": status == "killed", "status": status, "caught_by": None, "probe": None,
           "detail": None, "seconds": 0.0}
    row.update(kw)
    return row


def mutation_row(m: Mutation, backend: str, target: str = "impl") -> dict:
    """The mutation against its probes; a patch that does not apply to this tree is a
    ``harness-error`` row, never a kill (nor an exception)."""
    try:
        m.check()
    except MutationError as exc:
        return _row(m, "harness-error", detail=str(exc))
    t0 = time.perf_counter()
    row = _row(m, "survived")
    for probe_name in m.probes:
        killed, oracle, detail = run_probe(PROBES[probe_name], backend, m, target)
        if killed:
            row.update(killed=True, status="killed", caught_by=oracle, probe=probe_name,
                       detail=detail)
            break
    row["seconds"] = round(time.perf_counter() - t0, 3)
    return row


def cell_trials(kind: str, name: str, target: str = "impl") -> int:
    """The most trials a cell runs (its watchdog's budget)."""
    if kind == "probe":
        return len(PROBES[name].seeds)
    return sum(len(PROBES[p].seeds) for p in by_name(target)[name].probes)


def _cell_command(kind: str, name: str, backend: str, target: str = "impl") -> List[str]:
    return [sys.executable, "-m", "scenarios.matrix", kind, name, backend, target]


CELL_GRACE_S = 60.0  # past its own watchdog, a cell's process is killed from outside
HARNESS_ERROR = 4  # a child's exit code when the harness itself failed (not the engine);
# not the watchdog's (WATCHDOG_EXIT, 3)


def _isolated(kind: str, name: str, backend: str, target: str = "impl") -> dict:
    """Run one matrix cell in a fresh process. On a GPU a killed mutation often takes a
    device-side assert, which is sticky: the process cannot run anything after it. A
    process that dies that way has been killed by the crash oracle; one that runs past
    its watchdog (or is killed from outside after the grace time) is a ``timeout`` row."""
    from harness.runtime.cuda import WATCHDOG_EXIT
    t0 = time.perf_counter()
    limit = watchdog_seconds(cell_trials(kind, name, target))
    by = by_name(target)
    try:
        proc = subprocess.run(_cell_command(kind, name, backend, target), capture_output=True,
                              text=True, timeout=None if limit is None else limit + CELL_GRACE_S)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = None, "", ""
    seconds = round(time.perf_counter() - t0, 3)
    if rc is None or rc == WATCHDOG_EXIT:
        detail = (f"timed out: ran past its watchdog ({limit:g} s)" if limit is not None
                  else "timed out")
        if kind == "probe":
            return {"probe": name, "finding": detail, "oracle": "timeout", "status": "timeout"}
        return _row(by[name], "timeout", detail=detail, seconds=seconds)
    lines = out.strip().splitlines()
    if rc in (0, HARNESS_ERROR) and lines:
        row = json.loads(lines[-1])
        if rc == HARNESS_ERROR:
            if kind == "probe":
                return {"probe": name, "finding": f"harness error: {row['error']}",
                        "oracle": "harness-error", "status": "harness-error"}
            return _row(by[name], "harness-error", detail=row["error"], seconds=seconds)
        return row
    last = next((ln for ln in err.splitlines()[::-1] if "Error" in ln or "error" in ln),
                (err.strip().splitlines() or ["?"])[-1])
    detail = f"process died (rc {rc}): {last.strip()[:200]}"
    if kind == "probe":
        return {"probe": name, "finding": detail, "oracle": "crash", "status": "finding"}
    return _row(by[name], "killed", caught_by="crash", detail=detail, seconds=seconds)


def run_matrix(backend: str = "sim", progress: Optional[Callable[..., None]] = None,
               mutations: Optional[List[Mutation]] = None,
               isolate: Optional[bool] = None, target: str = "impl") -> dict:
    """Every cell runs in this process (on CUDA too: each trial is traced), until a cell
    leaves the GPU with a sticky error (a killed mutation's device-side assert): from then
    on each remaining cell runs in a fresh process (``_isolated``). ``isolate=True`` runs
    every cell in a process of its own from the start."""
    mutations = mutations_for(target) if mutations is None else mutations
    probes = probes_for(target)
    cells = [("probe", p.name) for p in probes.values()] + [("mutation", m.name)
                                                             for m in mutations]
    own = {m.name: m for m in mutations}
    t_start = time.perf_counter()
    results: List[dict] = []
    for n, (kind, name) in enumerate(cells):
        if isolate or (backend == "cuda" and not _gpu_healthy()):
            isolate = True
            rest = cells[n:]
            workers = max(1, min(8, (os.cpu_count() or 2) // 2))
            # Cells in parallel processes sharing the GPU: each is mostly host work.
            with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                results += list(pool.map(lambda c: _isolated(c[0], c[1], backend, target),
                                         rest))
            break
        # a GPU hang ends the run (stacks, exit 3) instead of hanging it
        trials = (len(probes[name].seeds) if kind == "probe" else
                  sum(len(PROBES[p].seeds) for p in own[name].probes if p in PROBES))
        with gpu_watchdog(backend, trials, None, f"matrix cell {kind} {name}"):
            results.append(fixed_row(probes[name], backend, target) if kind == "probe"
                           else mutation_row(own[name], backend, target))
        if progress:
            progress(n + 1, len(cells))
    fixed = [r for (kind, _), r in zip(cells, results) if kind == "probe"]
    rows = [r for (kind, _), r in zip(cells, results) if kind == "mutation"]
    cells = fixed + rows
    return {"backend": backend, "target": target,
            "fixed_findings": sum(1 for f in fixed if f["finding"]),
            "fixed": fixed,
            "total": len(rows), "killed": sum(r["killed"] for r in rows),
            "harness_errors": sum(c.get("status") == "harness-error" for c in cells),
            "timeouts": sum(c.get("status") == "timeout" for c in cells),
            "seconds": round(time.perf_counter() - t_start, 3),
            "mutations": rows}


def _gpu_healthy() -> bool:
    """Can this process still run CUDA work (no sticky error from an earlier cell)?"""
    import torch
    try:
        torch.cuda.synchronize()
        return True
    except Exception:  # a sticky device error surfaces at the next sync
        return False


def matrix_ok(res: dict) -> bool:
    return (res["fixed_findings"] == 0 and res["killed"] == res["total"]
            and not res["harness_errors"] and not res["timeouts"])


def problem_line(res: dict) -> Optional[str]:
    """One line naming the cells that are neither killed nor clean (None: there are none)."""
    bad = [f"{c.get('name') or c.get('probe')} ({c['status']})"
           for c in res["fixed"] + res["mutations"]
           if c.get("status") in ("harness-error", "timeout")]
    survived = [r["name"] for r in res["mutations"] if r.get("status") == "survived"]
    if not (bad or survived or res["fixed_findings"]):
        return None
    parts = [f"{res['killed']}/{res['total']} killed"]
    if res["fixed_findings"]:
        parts.append(f"{res['fixed_findings']} finding(s) on the fixed code")
    if survived:
        parts.append(f"survived: {', '.join(survived)}")
    if bad:
        parts.append(f"{res['harness_errors']} harness error(s), {res['timeouts']} timeout(s): "
                     + ", ".join(bad))
    return "matrix: " + "; ".join(parts)


_MARK = {"killed": "killed", "survived": "SURVIVED", "harness-error": "ERROR",
         "timeout": "TIMEOUT"}


def format_matrix(res: dict) -> str:
    lines = [f"mutation kill matrix ({res.get('target', 'impl')}) on {res['backend']}: "
             f"{res['killed']}/{res['total']} killed, fixed code findings: {res['fixed_findings']}, {res['seconds']:.1f} s"
             + (f", {res['harness_errors']} harness error(s)" if res.get("harness_errors") else "")
             + (f", {res['timeouts']} timeout(s)" if res.get("timeouts") else "")]
    for f in res["fixed"]:
        lines.append(f"  fixed  {f['probe']:<16} {'FINDING: ' + f['finding'] if f['finding'] else 'clean'}")
    for r in res["mutations"]:
        mark = _MARK.get(r.get("status"), "killed" if r["killed"] else "SURVIVED")
        by = (f"{r['caught_by']} @ {r['probe']}" if r["killed"] else
              (r.get("detail") or "-") if mark in ("ERROR", "TIMEOUT") else "-")
        lines.append(f"  {mark:<8} {r['name']:<36} {by:<34} {r['seconds']:6.2f}s")
    return "\n".join(lines)


if __name__ == "__main__":  # one cell: python -m scenarios.matrix KIND NAME BACKEND TARGET
    _kind, _name, _backend = sys.argv[1:4]
    _target = sys.argv[4] if len(sys.argv) > 4 else "impl"
    _by = by_name(_target)
    try:
        if _kind == "mutation":
            _by[_name].check()
    except MutationError as _exc:  # the patch does not apply: say so, don't count a kill
        print(json.dumps({"error": str(_exc)}), flush=True)
        os._exit(HARNESS_ERROR)
    with gpu_watchdog(_backend, cell_trials(_kind, _name, _target), None,
                      f"matrix cell {_kind} {_name}"):
        _cell = (fixed_row(PROBES[_name], _backend, _target) if _kind == "probe"
                 else mutation_row(_by[_name], _backend, _target))
    print(json.dumps(_cell, default=str), flush=True)
    sys.stdout.flush()
    os._exit(0)  # a poisoned CUDA context must not get to run destructors
