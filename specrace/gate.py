"""The release gate: every scenario of the sglang target on every release set up, in every
configuration the release ships (``make release-gate``), or the subset CI runs (``make
release-gate-ci``): each scenario and each release at least once, as installed, one trial
a cell, the scenarios spread across the releases whose code has them.

A cell whose release lacks the scenario's code is ``not applicable`` (the environments
say what is absent); one whose code is there but that specrace cannot build is ``not
driven``, named -- neither counts as touching the scenario or the release. The plan is
computed without running anything (``plan``); the gate fails on a cell that errs or
crashes, or whose outcome is not the scenario's declared expectation.

    python -m specrace.gate [--subset] [--trials N] [--coverage] [--jobs N] [--plan]
                            [--markdown PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from harness.run import AS_INSTALLED

Cell = Tuple[str, str, str]  # (release, scenario, configuration: a variant name)
# (release, scenario) -> "" where the gate can run it, else the row's outcome and why
Why = Callable[[str, str], Tuple[str, str]]


def plan(scenarios: Mapping[str, Any], versions: Sequence[str], why_not: Why,
         configurations: Callable[[Any], List[str]], subset: bool) -> List[Cell]:
    """The cells, releases oldest first. The full plan: every release x scenario x
    configuration (one cell where the release cannot run the scenario). The subset: one cell per scenario, as installed, on the release that
    has it with the fewest cells so far (the scenarios with the fewest such releases
    placed first), then a cell on each release still without one; a scenario no release
    can run still gets a cell, on the newest, whose row says why."""
    if not subset:  # a release without the scenario's code: one row says so
        return [(v, s, c) for v in versions for s in scenarios
                for c in ([AS_INSTALLED] if why_not(v, s)[0]
                          else configurations(scenarios[s]))]
    runs = {s: [v for v in versions if not why_not(v, s)[0]] for s in scenarios}
    load = {v: 0 for v in versions}
    cells: List[Cell] = []
    for s in sorted(scenarios, key=lambda s: (len(runs[s]), s)):
        v = min(runs[s] or versions[-1:], key=lambda v: (load[v], -versions.index(v)))
        cells.append((v, s, AS_INSTALLED))
        load[v] += 1
    for v in versions:
        if not load[v]:
            s = min((s for s in scenarios if v in runs[s]),
                    key=lambda s: (sum(c[1] == s for c in cells), s), default=None)
            if s is not None:
                cells.append((v, s, AS_INSTALLED))
                load[v] += 1
    return sorted(cells, key=lambda c: (versions.index(c[0]), c[1], c[2]))


def untouched(cells: Sequence[Cell], scenarios: Sequence[str], versions: Sequence[str],
              why_not: Why) -> List[str]:
    """What a plan leaves untouched: each scenario some release can run and each release
    that can run some scenario, with no cell that runs."""
    ran = [c for c in cells if not why_not(c[0], c[1])[0]]
    can = [(v, s) for v in versions for s in scenarios if not why_not(v, s)[0]]
    miss = [f"scenario {s}" for s in scenarios
            if any(cs == s for _, cs in can) and not any(c[1] == s for c in ran)]
    return miss + [f"release {v}" for v in versions
                   if any(cv == v for cv, _ in can) and not any(c[0] == v for c in ran)]


def problems(rows: Sequence[Dict[str, Any]], scenarios: Mapping[str, Any]) -> List[str]:
    """The cells that fail the gate: errors and crashes, outcomes that are not the
    scenario's expectation for the configuration (``Scenario.expected``), and, under
    ``--coverage``, a cell whose census sites could not be measured."""
    out = []
    for r in rows:
        if r["outcome"] in ("not applicable", "not driven"):
            continue
        if "coverage_sites" in r and r.get("coverage_ran") is None:  # --coverage
            out.append(f"{r['release']} {r['scenario']} [{r['configuration']}]: coverage "
                       f"not measured: {r.get('coverage_note') or 'no lines came back'}")
        want = scenarios[r["scenario"]].expected(r["configuration"], r.get("war_barrier"))
        if r["outcome"] != want:
            out.append(f"{r['release']} {r['scenario']} [{r['configuration']}]: "
                       f"{r['outcome']}, expected {want} {r.get('note') or ''}".strip())
    return out


def _environment():
    import targets
    from scenarios.configurations import shipped
    from scenarios.registry import SCENARIOS
    target = targets.declared("sglang")
    envs = target.environments()
    scenarios = {s: SCENARIOS[s] for s in target.scenarios}

    def why_not(v: str, s: str) -> Tuple[str, str]:
        na = envs.not_applicable(v, s)
        if na:
            return "not applicable", na
        nd = envs.not_driven(v, s)
        return ("not driven", nd) if nd else ("", "")
    return envs, scenarios, why_not, lambda sc: [c.variant for c in shipped("sglang", sc)]


def run(cells: Sequence[Cell], envs, trials: int, report_dir: str, coverage: bool,
        progress: Callable[[str], None] = lambda line: None, jobs: int = 1
        ) -> List[Dict[str, Any]]:
    """Each cell's row, in the plan's order; ``jobs`` cells at a time (each is a child
    process of its release's environment: the threads only wait on them)."""
    from concurrent.futures import ThreadPoolExecutor
    from specrace.audit import annotate_known
    from targets.releases import run_releases, settle
    done = []

    def cell(c: Cell) -> Dict[str, Any]:
        v, s, conf = c
        start = time.monotonic()
        row, = run_releases(envs, "sglang", s, ["--trials", str(trials)], report_dir, [v],
                            coverage=coverage, configurations=[(conf, "")])
        annotate_known("sglang", s, [row])
        settle([row])
        row.update(scenario=s, seconds=round(time.monotonic() - start, 1))
        done.append(c)
        progress(f"[{len(done)}/{len(cells)}] {v} {s} [{conf}]: {row['outcome']} "
                 f"({row['seconds']} s)")
        return row
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(cell, cells))


def markdown(rows: Sequence[Dict[str, Any]], title: str) -> str:
    """The gate's release table: a row per release x scenario x configuration."""
    lines = [f"# {title}", "",
             "Written by `python -m specrace.gate` (docs/release-gate.md); coverage: the "
             "census sites of the single-node paths the cell ran.", "",
             "| release | scenario | configuration | outcome | trials | coverage | note |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        trials = "" if r["trials"] is None else f"{r['reproduced']}/{r['trials']}"
        cov = ("-" if r.get("coverage_ran") is None else
               f"{r['coverage_ran']}/{r['coverage_sites']} ({r['coverage_percent']}%)")
        note = (r.get("note") or "").replace("|", "/")
        lines.append(f"| {r['release']} | `{r['scenario']}` | {r['configuration']} | "
                     f"{r['outcome']} | {trials} | {cov} | {note} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specrace.gate", description=__doc__)
    p.add_argument("--subset", action="store_true",
                   help="each scenario and each release at least once, as installed")
    p.add_argument("--as-installed", action="store_true",
                   help="every release x scenario, as installed only (the release table)")
    p.add_argument("--trials", type=int, default=1)
    p.add_argument("--coverage", action="store_true",
                   help="each cell under coverage.py: the census sites it ran")
    p.add_argument("--jobs", type=int, default=1, help="cells run at a time")
    p.add_argument("--plan", action="store_true", help="print the plan, run nothing")
    p.add_argument("--markdown", default=None, help="write the gate's table here too")
    p.add_argument("--report-dir", default="reports/release-gate")
    args = p.parse_args(argv)
    if not (1 <= args.trials <= 1000 and 1 <= args.jobs <= 64):
        print("specrace: error: --trials must be in 1..1000, --jobs in 1..64",
              file=sys.stderr)
        return 2
    envs, scenarios, why_not, confs = _environment()
    versions = envs.line.installed()
    if not versions:
        print("specrace: error: no sglang release is set up (make upstream-releases)",
              file=sys.stderr)
        return 2
    if args.as_installed:
        confs = lambda scenario: [AS_INSTALLED]  # noqa: E731
    cells = plan(scenarios, versions, why_not, confs, args.subset)
    missing = untouched(cells, list(scenarios), versions, why_not)
    print(f"release gate: {len(cells)} cells over {len(versions)} releases and "
          f"{len(scenarios)} scenarios" + (f"; untouched: {', '.join(missing)}"
                                           if missing else ""), file=sys.stderr)
    if args.plan:
        print(json.dumps(cells))
        return 0 if not missing else 1
    start = time.monotonic()
    rows = run(cells, envs, args.trials, args.report_dir, args.coverage,
               lambda line: print(line, file=sys.stderr, flush=True), args.jobs)
    which = ("the CI subset" if args.subset else "as installed" if args.as_installed
             else "every shipped configuration")
    text = markdown(rows, f"The sglang release gate ({which}): {len(rows)} cells, "
                          f"{args.trials} trial(s) each")
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    bad = problems(rows, scenarios) + [f"untouched: {m}" for m in missing]
    print(f"release gate: {len(rows)} cells in {time.monotonic() - start:.0f} s; "
          f"{len(bad)} failed", file=sys.stderr)
    for line in bad:
        print(f"  {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
