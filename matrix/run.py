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
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from seams import children
import targets
from harness.trials.drive import server_args
from harness.trials.trial import run_trial
from harness.policies import parse_policy
from harness.runtime.limits import gpu_watchdog, watchdog_seconds
from scenarios.resolve import RunRequest, resolve

from mutations import Mutation, MutationError
from matrix.probes import PROBES, Probe  # noqa: F401  (re-exported)
from matrix.table import (Cell, assemble, cell_failed, format_matrix,  # noqa: F401
                    matrix_ok, problem_line)


def mutations_for(target: str) -> List[Mutation]:
    """The seeded bugs of the target named ``target`` (cells name targets: they cross
    into child processes)."""
    return targets.get(target).mutations()


def by_name(target: str) -> Dict[str, Mutation]:
    return {m.name: m for m in mutations_for(target)}


def probes_for(target: str) -> Dict[str, Probe]:
    """The probes whose scenario runs on ``target``."""
    tgt = targets.get(target)
    return {n: p for n, p in PROBES.items() if tgt.supports(p.scenario)}


def oracle_of(result) -> str:
    if result.divergence is not None:
        return "stale-value" if result.divergence.stale else result.divergence.kind
    return "happens-before"


def run_probe(probe: Probe, backend: str, mutation: Optional[Mutation] = None,
              target: str = "impl") -> Tuple[bool, Optional[str], Optional[str]]:
    """(killed, oracle, one-line detail) -- stops at the first trial that finds something."""
    run = resolve(RunRequest(probe.scenario, target=target, variant=probe.variant,
                             war_barrier=probe.war_barrier, backend=backend,
                             # the catalogue's text: parsed here, once
                             policy=parse_policy(probe.policy) if backend == "sim" else None,
                             trials=len(probe.seeds)))
    patch = _patch(run.variant, run.target, mutation)
    for seed in probe.seeds:
        wl = run.scenario.workload(seed)
        args = server_args(wl, {**run.variant.args, "war_barrier": str(run.war_barrier),
                                "platform": run.platform}, run.target)
        # On CUDA only the first trial is trace-captured (one captured engine run per
        # process: a second one crashed torch 2.11 on the H200); later seeds judge values.
        res = run_trial(str(run.backend), run.policy, wl, args, list(run.stalls),
                        detect_races=run.backend == "sim" or seed == probe.seeds[0],
                        mutation=patch, answers=dict(run.host_order), target=run.target)
        if res.reproduced:
            detail = (res.divergence.message if res.divergence
                      else res.races[0].summary())
            return True, oracle_of(res), f"seed {seed}: {detail}"
    return False, None, None


class _Together:
    """A seeded bug on top of a variant's candidate fix (both patches for the run)."""

    def __init__(self, *patches) -> None:
        self.patches = patches

    def applied(self):
        from seams.sourcepatch import all_applied
        return all_applied(self.patches)


def _patch(variant, target, mutation: Optional[Mutation]):
    """What a probe run patches: the mutation under test -- on top of the variant's fix
    when the variant is a fixed form of an upstream finding -- or the variant's own
    patch."""
    own = variant.patch(target)
    if mutation is None:
        return own
    if variant.fix is not None:
        return _Together(own, mutation.patch)
    return mutation


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


def _disabled(m: Mutation, target: str) -> str:
    """Why the code under test cannot take this mutation's patch (a release that moved the
    code: the mutation is disabled, named, and not counted), "" when it can."""
    return targets.get(target).patch_problem(m.target, m.edits)


def mutation_row(m: Mutation, backend: str, target: str = "impl") -> dict:
    """The mutation against its probes; a patch that does not apply to this tree is a
    ``harness-error`` row, never a kill (nor an exception)."""
    disabled = _disabled(m, target)
    if disabled:
        return _row(m, "disabled", detail=disabled)
    try:
        m.check()
    except MutationError as exc:
        return _row(m, "harness-error", detail=str(exc))
    runnable = probes_for(target)
    probes = [p for p in m.probes if p in runnable]
    if not probes:  # e.g. a release whose engine the target does not drive: its slices'
        return _row(m, "disabled", detail=f"none of its probes ({', '.join(m.probes)}) runs "
                                          f"on {targets.get(target).label()}")
    t0 = time.perf_counter()
    row = _row(m, "survived")
    for probe_name in probes:
        killed, oracle, detail = run_probe(PROBES[probe_name], backend, m, target)
        if killed:
            row.update(killed=True, status="killed", caught_by=oracle, probe=probe_name,
                       detail=detail)
            break
    row["seconds"] = round(time.perf_counter() - t0, 3)
    if m.equivalent:  # declared harmless: survival shows it, a kill refutes it
        if row["killed"]:
            row.update(killed=False, status="harness-error",
                       detail=f"declared equivalent ({m.equivalent}) but killed by "
                              f"{row['caught_by']} @ {row['probe']}: {row['detail']}")
        else:
            row.update(status="equivalent", detail=m.equivalent)
    return row


def cell_trials(kind: str, name: str, target: str = "impl") -> int:
    """The most trials a cell runs (its watchdog's budget)."""
    if kind == "probe":
        return len(PROBES[name].seeds)
    return sum(len(PROBES[p].seeds) for p in by_name(target)[name].probes)


def _cell_command(cells: List[Tuple[str, str]], backend: str,
                  target: str = "impl") -> List[str]:
    # the working directory kept off the cell's path (seams.children)
    return children.command(sys.executable, "-m", "matrix.run", backend, target,
                            *(f"{kind}:{name}" for kind, name in cells))


CELL_GRACE_S = 60.0  # past its own watchdog, a cell's process is killed from outside
HARNESS_ERROR = 4  # a cell whose patch does not apply (the harness's fault, not the engine's)
POISONED = 5  # the child stopped after a cell left a sticky CUDA error: go on in a fresh one


def _cell_row(kind: str, name: str, by: dict, status: str, detail: str,
              oracle: str, seconds: float = 0.0) -> dict:
    if kind == "probe":
        return {"probe": name, "finding": detail, "oracle": oracle,
                "status": "finding" if status == "killed" else status}
    return _row(by[name], status, detail=detail, seconds=seconds,
                **({"caught_by": oracle} if status == "killed" else {}))


def run_isolated(cells: List[Cell], backend: str, target: str = "impl",
                 batch: bool = True) -> List[dict]:
    """The cells' rows from child processes: all in one (``batch``) or one each. A child
    stops when a cell leaves the GPU with a sticky error (a killed mutation's device-side
    assert makes even freeing memory abort the process); the rest go on in a fresh one."""
    from harness.runtime.cuda import WATCHDOG_EXIT
    by = by_name(target)
    rows: Dict[Tuple[str, str], dict] = {}
    todo = list(cells)
    while todo:
        group = todo if batch else todo[:1]
        limit = sum(watchdog_seconds(cell_trials(k, n, target)) or 0 for k, n in group)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(_cell_command(group, backend, target), capture_output=True,
                                  text=True, timeout=limit + CELL_GRACE_S if limit else None,
                                  env=children.env())
            rc, out, err = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc = None
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = ""
        rows.update(_reported_rows(out, by))
        done_here = sum(1 for c in group if c in rows)
        todo = [c for c in todo if c not in rows]
        if not todo or rc in (0, POISONED):
            continue
        cell = todo.pop(0)  # the cell the child was in when it stopped
        if done_here and rc is not None and rc != WATCHDOG_EXIT:
            # the child died after other cells ran in it: an earlier cell's device error
            # can surface late (a destructor at a garbage collection aborts the process)
            # -- the death is this cell's only if it dies alone in a fresh process too
            rows[cell] = run_isolated([cell], backend, target, batch=False)[0]
            continue
        rows[cell] = _stopped_row(cell, by, target, rc, err, round(time.perf_counter() - t0, 3))
    return [rows[c] for c in cells]


def _reported_rows(out: str, by: dict) -> Iterator[Tuple[Tuple[str, str], dict]]:
    """The (cell, row) a child printed for each cell it finished, one JSON line each."""
    for line in out.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict) and "cell" in msg:
            kind, name = msg["cell"]
            if "error" in msg:
                yield (kind, name), _cell_row(kind, name, by, "harness-error",
                                              f"harness error: {msg['error']}", "harness-error")
            else:
                yield (kind, name), msg["row"]


def _stopped_row(cell: Tuple[str, str], by: dict, target: str, rc: Optional[int], err: str,
                 seconds: float) -> dict:
    """The row of a cell its child stopped in: one past its watchdog is a ``timeout``, one
    whose child died in it has been killed by the crash oracle."""
    from harness.runtime.cuda import WATCHDOG_EXIT
    kind, name = cell
    if rc is None or rc == WATCHDOG_EXIT:
        cell_limit = watchdog_seconds(cell_trials(kind, name, target))
        return _cell_row(kind, name, by, "timeout", "timed out: ran past its watchdog"
                         + (f" ({cell_limit:g} s)" if cell_limit else ""), "timeout", seconds)
    last = next((ln for ln in err.splitlines()[::-1] if "rror" in ln),
                (err.strip().splitlines() or ["?"])[-1])
    return _cell_row(kind, name, by, "killed", f"process died (rc {rc}): {last.strip()[:200]}",
                     "crash", seconds)


def matrix_cells(target: str = "impl", mutations: Optional[List[Mutation]] = None
                 ) -> List[Cell]:
    """The matrix's cells, in table order: the fixed code against every probe of
    ``target``, then each seeded bug (the target's catalogue unless ``mutations``). The
    CLI and the pytest items (``specrace.pytest_matrix``) both run exactly these."""
    mutations = mutations_for(target) if mutations is None else mutations
    return ([("probe", p) for p in probes_for(target)]
            + [("mutation", m.name) for m in mutations])


def run_cell(cell: Cell, backend: str, target: str = "impl",
             mutations: Optional[List[Mutation]] = None) -> dict:
    """One cell's row, in this process. On CUDA run cells through ``run_isolated``: a
    killed mutation may leave the process's GPU context unusable."""
    kind, name = cell
    if kind == "probe":
        return fixed_row(PROBES[name], backend, target)
    own = {m.name: m for m in (mutations_for(target) if mutations is None else mutations)}
    return mutation_row(own[name], backend, target)


def run_matrix(backend: str = "sim", progress: Optional[Callable[..., None]] = None,
               mutations: Optional[List[Mutation]] = None,
               isolate: Optional[bool] = None, target: str = "impl") -> dict:
    """On the simulator every cell runs in this process. On CUDA they run in one child
    process (every trial traced), continued in a fresh one only after a cell left the GPU
    unusable (``run_isolated``). ``isolate=True``: a process per cell."""
    cells = matrix_cells(target, mutations)
    t_start = time.perf_counter()
    results: List[dict] = []
    if backend == "cuda" or isolate:
        results = run_isolated(cells, backend, target, batch=not isolate)
        if progress:
            progress(len(cells), len(cells))
    else:
        for n, cell in enumerate(cells):
            results.append(run_cell(cell, backend, target, mutations))
            if progress:
                progress(n + 1, len(cells))
    return assemble(backend, target, cells, results, time.perf_counter() - t_start)


def _gpu_healthy() -> bool:
    """Can this process still run CUDA work (no sticky error from an earlier cell)?"""
    import torch
    try:
        torch.cuda.synchronize()
        return True
    except Exception:  # a sticky device error surfaces at the next sync
        return False


def _child(backend: str, target: str, cells: List[Tuple[str, str]]) -> int:
    """A child process's cells, in order, one JSON line each as it finishes."""
    targets.get(target)  # the code under test, loaded before a patch of it is checked
    by = by_name(target)
    for kind, name in cells:
        if kind == "mutation" and _disabled(by[name], target):
            row = mutation_row(by[name], backend, target)
            print(json.dumps({"cell": [kind, name], "row": row}, default=str), flush=True)
            continue
        try:
            if kind == "mutation":
                by[name].check()
        except MutationError as exc:  # the patch does not apply: say so, don't count a kill
            print(json.dumps({"cell": [kind, name], "error": str(exc)}), flush=True)
            continue
        with gpu_watchdog(backend, cell_trials(kind, name, target), None,
                          f"matrix cell {kind} {name}"):
            row = (fixed_row(PROBES[name], backend, target) if kind == "probe"
                   else mutation_row(by[name], backend, target))
        print(json.dumps({"cell": [kind, name], "row": row}, default=str), flush=True)
        if backend == "cuda" and not _gpu_healthy():
            return POISONED
    return 0


if __name__ == "__main__":  # python -m matrix.run BACKEND TARGET KIND:NAME...
    _rc = _child(sys.argv[1], sys.argv[2],
                 [tuple(c.split(":", 1)) for c in sys.argv[3:]])  # type: ignore[misc]
    sys.stdout.flush()
    os._exit(_rc)  # a poisoned CUDA context must not get to run destructors
