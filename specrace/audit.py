"""``specrace audit``: does my install race? Every scenario of an upstream target, in every
configuration the server ships (``scenarios.configurations``: the variants that patch
nothing), on the installed release -- or on each release named, in its own environment --
one row per racing pair, each matched against the known races (``scenarios.findings``).

One process per release: the target is loaded once (seconds: the server's imports, its
contract) and every scenario runs in it, trials of tens to hundreds of milliseconds each.
The release this interpreter imports runs here; any other runs in a child ``specrace
audit --jsonl`` in that release's environment, which streams its plan and then each
configuration's rows as one JSON object a line, so the parent's progress moves as the
child's does and a child that dies leaves rows saying why, not a hole.

A row: the release, the scenario, the configuration (the variant and the flags that
reach it), the verdict (clean | race | crash | deadlock | not applicable | not driven |
error), the racing pair at upstream's lines (``harness.report.pairs``), the effect the
oracles saw, the known race it is (with its write-up) or ``new``, the report set, and for
an ``error`` its cause. The view (table, Markdown, JSON) is ``specrace.audit_view``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from harness.report.pairs import frames, group
from specrace.audit_fork import order

DEFAULT_TRIALS = 3
CHILD_TIMEOUT_S = 3600  # a release's whole audit that has not finished by then is an error

# a divergence kind -> what it means for a user, most severe first (a row shows the worst
# its trials saw; the trial stops at the first stale value, so a stale kind is the effect
# that reached the host first, not the only one)
EFFECTS = (("output", "wrong tokens"), ("model", "wrong tokens"),
           ("grammar", "wrong tokens (grammar broken)"),
           ("accept_tokens", "wrong tokens (stale accept state committed)"),
           ("accept_lens", "wrong tokens (stale accept state committed)"),
           ("hidden_states", "wrong hidden states returned"),
           ("kv_context", "attention read the wrong KV"),
           ("crash", "engine crash"), ("deadlock", "hang"),
           ("seq_lens", "stale seq lens read"), ("draft_rows", "stale draft rows read"),
           ("confidence", "acceptance only (a stale confidence steers the draft budget)"))
NONE_SEEN = "none seen"
RACING = ("race", "crash", "deadlock")  # the verdicts that are a finding


@dataclass
class Options:
    target: str
    trials: int = DEFAULT_TRIALS
    seed: int = 0
    backend: str = "auto"
    scenarios: Sequence[str] = ()  # () : every scenario of the target
    report_dir: str = os.path.join("reports", "audit")
    reports: bool = True  # write a report set for each row that is not clean
    jobs: Optional[int] = None  # configurations side by side (None: one per core)


@dataclass
class Release:
    """One release's audit: where it ran and its rows."""
    version: Optional[str]
    where: str  # "here" or the release environment's interpreter
    target_info: Dict[str, Any] = field(default_factory=dict)
    rows: List[Dict[str, Any]] = field(default_factory=list)
    cells: int = 0


def effect(kinds: Sequence[Optional[str]]) -> str:
    """What the trials' divergences (one kind or None per trial) mean to a user."""
    seen = set(k for k in kinds if k)
    for kind, text in EFFECTS:
        if kind in seen:
            return text
    return NONE_SEEN if not seen else ", ".join(sorted(seen))


def _row(release: Optional[str], scenario: str, conf, **kw: Any) -> Dict[str, Any]:
    row = {"release": release, "scenario": scenario, "variant": conf.variant if conf else None,
           "configuration": list(conf.flags) if conf else [], "verdict": None,
           "trials": None, "reproduced": None, "pair": None, "effect": "", "known": None,
           "new": False, "report": None, "note": "", "command": None}
    row.update(kw)
    return row


# --- one release, in this process ------------------------------------------------------

def plan(target, names: Sequence[str]) -> List[tuple]:
    """(scenario, configuration or None) for each cell of the audit, in the registry's
    order; a scenario the loaded target cannot drive here is one cell with no
    configuration (its row says why)."""
    from scenarios.configurations import shipped
    from scenarios.registry import SCENARIOS
    cells = []
    for name in SCENARIOS:
        if name not in (target.scenarios or ()) or (names and name not in names):
            continue
        if not target.supports(name):
            cells.append((name, None))
            continue
        cells += [(name, conf) for conf in shipped(target.name, SCENARIOS[name])]
    return cells


def audit_here(options: Options, emit: Callable[[Dict[str, Any]], None]) -> Release:
    """The installed release's audit, in this process: ``emit`` gets the plan
    (``{"event": "plan", ...}``) and then each cell's rows (``{"event": "cell", ...}``)."""
    import targets
    target = targets.get(options.target)  # TargetError: not installed / unsupported here
    version = target.installed_version()
    cells = plan(target, options.scenarios)
    release = Release(version, "here", target.describe(), cells=len(cells))
    emit({"event": "plan", "release": version, "cells": len(cells),
          "target_info": release.target_info})
    environments = target.environments()

    def work(i: int) -> List[Dict[str, Any]]:
        return run_cell(target, environments, version, cells[i][0], cells[i][1], options)

    def died(i: int, how: str) -> List[Dict[str, Any]]:
        return [_row(version, cells[i][0], cells[i][1], verdict="error",
                     note=f"no verdict: {how}")]

    from harness.runtime import resolve_backend
    from specrace.audit_fork import can_fork, jobs_default, run_forked
    if resolve_backend(options.backend) == "sim" and can_fork():
        # each configuration in a fork of this process as loaded (``audit_fork``)
        ran = run_forked(work, len(cells), options.jobs or jobs_default(), died)
    else:  # CUDA: a process that touched the GPU cannot fork; one after another here
        ran = ((i, work(i)) for i in range(len(cells)))
    results = []
    for i, rows in ran:
        results.append((i, rows))
        emit({"event": "cell", "index": i, "rows": rows})
    release.rows = order(results)
    emit({"event": "done", "target_info": release.target_info})
    return release


def run_cell(target, environments, version: Optional[str], name: str, conf,
             options: Options) -> List[Dict[str, Any]]:
    """One scenario in one configuration: its rows (one per racing pair)."""
    from harness.target import DoesNotFit, TargetError
    from scenarios.resolve import ResolveError, RunRequest, resolve
    if conf is None:
        return [_row(version, name, None, verdict="not driven",
                     note=_unsupported(target, name))]
    why_not = environments.not_applicable(version, name) if _is_env(target, environments,
                                                                    version) else ""
    if why_not:
        return [_row(version, name, conf, verdict="not applicable", note=why_not)]
    try:
        run = resolve(RunRequest(scenario=name, target=target.name, variant=conf.variant,
                                 backend=options.backend, trials=options.trials,
                                 seed=options.seed))
    except (ResolveError, TargetError) as exc:  # the release lacks what the slice needs
        return [_row(version, name, conf, verdict="not driven", note=_cause(exc))]
    from harness.runtime.limits import gpu_watchdog
    from harness.trials.repro import run_repro
    try:
        # on CUDA, repro's watchdog per configuration: a hung GPU ends the audit (exit 3,
        # every thread's stack) instead of holding it forever
        with gpu_watchdog(str(run.backend), run.trials, None, "specrace audit"):
            result = run_repro(run)
    except DoesNotFit as exc:
        return [_row(version, name, conf, verdict="error", note=_cause(exc))]
    except Exception as exc:  # a harness fault on this cell: named, and the audit goes on
        return [_row(version, name, conf, verdict="error", note=_cause(exc))]
    result.command = result.repro_command()
    rows = rows_of(result.to_json(), version, name, conf)
    if options.reports and any(r["verdict"] != "clean" for r in rows):
        path = _write(result, rows, options, version)
        for r in rows:
            r["report"] = path
    return rows


def _is_env(target, environments, version: Optional[str]) -> bool:
    """Is the code this process imports that of ``version``'s release environment? Only
    then does that environment's source say what the release lacks: a checkout on
    ``PYTHONPATH`` (a pull request's) is judged by its own code, not by the release's."""
    if environments is None or not version:
        return False
    from targets import static
    here = static.package_root(target.name)
    env = os.path.dirname(os.path.dirname(environments.python(version)))
    return bool(here) and os.path.realpath(here).startswith(os.path.realpath(env) + os.sep)


def _unsupported(target, name: str) -> str:
    """Why the loaded target does not drive ``name`` here, naming the release once."""
    why = target.unsupported(name)
    return why if why.startswith(target.label()) else f"{target.label()}: {why}"


def _cause(exc: BaseException) -> str:
    """The cause in one line: what ``specrace repro`` would print, without the pointer to
    SPECRACE_TRACEBACK (the row itself says what raised)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    from harness.target import TargetError
    if not isinstance(exc, TargetError) and not text.startswith(type(exc).__name__):
        text = f"{type(exc).__name__}: {text}"
    return text[:400]


def rows_of(res: Dict[str, Any], version: Optional[str], name: str, conf) -> List[Dict[str, Any]]:
    """A run's rows (``res``: a repro's JSON): one per racing pair, or one for the run."""
    from scenarios.findings import match
    kinds = [t.get("divergence") for t in res.get("trial_results") or []]
    base = dict(trials=res.get("trials"), reproduced=res.get("reproduced"),
                effect=effect(kinds) if res.get("reproduced") else "",
                command=res.get("command"))
    first = res.get("first_divergence") or {}
    pairs = group(res.get("races") or [])
    if not pairs:
        verdict = ("clean" if not res.get("reproduced") else
                   first.get("kind") if first.get("kind") in ("crash", "deadlock") else "race")
        row = _row(version, name, conf, verdict=verdict, **base)
        if verdict != "clean":  # an oracle's finding with no race site: the value says it
            row["note"] = str(first.get("message") or "")[:300]
            row["new"] = True
        return [row]
    rows = []
    for pair in pairs:
        seen = [f for race in pair["races"] for f in frames(race)]
        known = match(res.get("target", ""), name, seen, version)
        rows.append(_row(version, name, conf, verdict="race", pair=_pair_doc(pair),
                         known=known, new=known is None or bool(known["regression"]),
                         **base))
    return rows


def report_context(result) -> Dict[str, Any]:
    """What a report of ``result`` (a ``ReproResult`` of an upstream target) says beyond
    the run: the flags that reach its configuration and the known races it matched."""
    from scenarios.configurations import flags
    from scenarios.findings import match
    from scenarios.registry import SCENARIOS
    scenario = SCENARIOS.get(result.scenario)
    if scenario is None or result.target == "impl":
        return {}
    variant = scenario.variants.get(result.variant)
    version = result.target_info.get(f"{result.target}_version")
    known = []
    for pair in group([r.to_json() for r in result.races]):
        k = match(result.target, result.scenario,
                  [f for race in pair["races"] for f in frames(race)], version)
        if k and k not in known:
            known.append(k)
    return {"configuration": list(flags(result.target, scenario, variant.args))
            if variant is not None else [], "known": known}


def annotate_known(target: str, scenario: str, rows: List[Dict[str, Any]]) -> None:
    """Each racing pair of ``specrace releases``'s rows (``targets.releases``) gets the
    known race it is (None: new)."""
    from scenarios.findings import match
    for row in rows:
        for pair in row.get("pairs") or []:
            pair["known"] = match(target, scenario, [tuple(f) for f in pair["frames"]],
                                  row.get("release"))


def _pair_doc(pair: Dict[str, Any]) -> Dict[str, Any]:
    """A pair as a row carries it: its text and the races' sites (the first few)."""
    return {"text": pair["text"], "kind": pair["kind"], "sites": pair["sites"],
            "count": pair["count"], "storages": pair["storages"][:8],
            "races": [r.get("summary") for r in pair["races"][:4]]}


def _write(result, rows: List[Dict[str, Any]], options: Options,
           version: Optional[str]) -> Optional[str]:
    """The run's report set (a failure to write is the row's note, not the audit's end)."""
    from harness.report import ReportDirError, write_reports
    folder = os.path.join(options.report_dir, version or result.target)
    try:
        return write_reports(result, folder, context=report_context(result))["markdown"]
    except (ReportDirError, OSError) as exc:
        for r in rows:
            r["note"] = f"report not written: {getattr(exc, 'strerror', None) or exc}"
        return None


# --- one release, in its environment ----------------------------------------------------

def audit_child(python: str, version: str, options: Options,
                progress: Callable[[Dict[str, Any]], None]) -> Release:
    """``version``'s audit in a child ``specrace audit --jsonl`` run by ``python``
    (its environment's interpreter). Whatever the child does, every cell gets a row."""
    release = Release(version, python)
    from seams import children
    from seams.children import child_error
    # the working directory off its path, the hash seed pinned, one hop (seams.children)
    cmd = children.command(python, "-m", "specrace.cli", "audit", "--target", options.target,
                           "--jsonl", "--trials", str(options.trials), "--seed",
                           str(options.seed), "--backend", options.backend, "--report-dir",
                           options.report_dir)
    cmd += [a for s in options.scenarios for a in ("--scenario", s)]
    if not options.reports:
        cmd.append("--no-report")
    if options.jobs:
        cmd += ["--jobs", str(options.jobs)]
    planned, results = None, []
    with tempfile.TemporaryFile("w+") as err:
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                                    env=children.env(hop=version, PYTHONUNBUFFERED="1"))
        except OSError as exc:
            return _failed(release, f"cannot run {python}: {exc.strerror or exc}")
        for event in _events(proc.stdout):
            if event.get("event") == "plan":
                planned = event
                release.cells = int(event.get("cells") or 0)
                release.target_info = event.get("target_info") or {}
            elif event.get("event") == "cell":
                rows = [r for r in event.get("rows") or [] if isinstance(r, dict)]
                index = event.get("index") if isinstance(event.get("index"), int) else 0
                results.append((index, rows))
            elif event.get("event") == "done":
                release.target_info = event.get("target_info") or release.target_info
            progress(event)
        code = proc.wait()
        release.rows = order(results)
        err.seek(0)
        why = child_error(err.read()) or f"exit {code}"
    if planned is None:
        return _failed(release, why)
    done = {(r["scenario"], r["variant"]) for r in release.rows}
    if code != 0 and len(done) < release.cells:  # died half-way: the rest are named
        release.rows.append(_row(version, "(the rest)", None, verdict="error",
                                 note=f"the release's audit ended early: {why}"))
    return release


def _events(stream) -> Iterator[Dict[str, Any]]:
    for line in stream:
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line of the server's own on stdout: not ours
        if isinstance(event, dict):
            yield event


def _failed(release: Release, why: str) -> Release:
    release.rows.append(_row(release.version, "(every scenario)", None, verdict="error",
                             note=why))
    return release


# --- the releases of one audit --------------------------------------------------------------

def releases(target, asked: Sequence[str]) -> List[tuple]:
    """(version, interpreter) of each release to audit -- interpreter None: this process.
    Named releases run in their environments; none named, the release this interpreter
    imports, else the newest environment set up (``ValueError`` when there is none)."""
    envs = target.environments()
    if envs is None:
        raise ValueError(f"the {target.name} target has no releases to audit (it is "
                         f"specrace's own code: `specrace matrix` is its gate)")
    if asked:
        return [(v, envs.python(v)) for v in envs.chosen(list(asked))]
    installed = target.installed_version()
    if installed is not None:
        return [(installed, None)]
    ready = envs.chosen([])  # none set up: the error says how to set one up
    return [(ready[-1], envs.python(ready[-1]))]


def run_audit(options: Options, where: Sequence[tuple],
              progress: Callable[[int, Optional[int]], None] = lambda n, t=None: None
              ) -> List[Release]:
    """Each release's audit in turn (this process, or a child in its environment);
    ``progress(cells done, cells planned so far)`` as each configuration ends."""
    done, planned, out = 0, 0, []

    def step(event: Dict[str, Any]) -> None:
        nonlocal done, planned
        if event.get("event") == "plan":
            planned += int(event.get("cells") or 0)
            progress(done, planned)
        elif event.get("event") == "cell":
            done += 1
            progress(done, planned)

    for version, python in where:
        if python is None:
            out.append(audit_here(options, step))
        else:
            out.append(audit_child(python, version, options, step))
    return out
