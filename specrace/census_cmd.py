"""``specrace census`` and ``specrace coverage``: their arguments and their tables.

The work is ``targets.census.census`` and ``targets.coverage.coverage`` (which other
commands call too); this module parses, shows progress and prints: a rich table on a
terminal or in a log, or one JSON object with ``--json``. Bad input -- an unknown
target or scenario, a release that is not a version or not set up -- is one line and
exit 2 (``UsageError``).
"""
from __future__ import annotations

import json
import sys
from typing import Any, Dict, List

from harness.run import AS_INSTALLED
from specrace import cli_args as A
from specrace.parser import UsageError

def run(args) -> int:
    from targets.census import CensusError
    try:
        if args.command == "census":
            return _census(args)
        return _coverage(args)
    except (CensusError, ValueError) as exc:  # EnvError is a ValueError
        raise UsageError(str(exc)) from None


def _console():
    from rich.console import Console
    # a log or a pipe gets wide rows (rich's default there is 80 columns, which folds
    # every path); a terminal its own width
    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def _table(title: str, columns: List[str], rows: List[List[Any]]):
    from rich.table import Table
    t = Table(title=title, title_justify="left")
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i == 0 or not rows
                     or not isinstance(rows[0][i], (int, float)) else "right",
                     overflow="fold")
    for r in rows:
        t.add_row(*["" if x is None else str(x) for x in r])
    return t


def _census(args) -> int:
    from targets.census import census
    c = A.with_progress(lambda prog: census(args.target, args.release, args.readbacks, prog),
                        None, f"census of {args.target}", quiet=args.json)
    if args.json:
        print(json.dumps(c.to_json()))
        return 0
    out = _console()
    out.print(f"{c.package} {c.version}: {len(c.sites)} ordering sites in {c.files} "
              f"files ({', '.join(c.areas)})")
    if c.missing_areas:
        out.print(f"areas absent from this release: {', '.join(c.missing_areas)}")
    areas: Dict[str, int] = {}
    for s in c.sites:
        area = next((a for a in c.areas if s.file == a or s.file.startswith(a + "/")), "?")
        areas[area] = areas.get(area, 0) + 1
    out.print(_table("by area", ["area", "sites"], [[a, areas.get(a, 0)] for a in c.areas]))
    out.print(_table("by kind", ["kind", "sites"], [[k, n] for k, n in c.by_kind().items()]))
    if c.unreadable:
        out.print(_table("files not read", ["file", "why"], [list(u) for u in c.unreadable]))
    if not args.summary:
        out.print(_table("sites", ["file:line", "function", "kind"],
                         [[f"{s.file}:{s.line}", s.function, s.kind] for s in c.sites]))
    return 0


def _coverage(args) -> int:
    from targets.census import census, spec_of
    from targets.coverage import coverage
    from specrace.audit_fork import jobs_default
    import targets
    spec_of(args.target)  # an unknown target fails before any work
    declared = targets.declared(args.target)
    for s in args.scenarios:
        if not declared.supports(s.partition(":")[0]):
            raise UsageError(f"scenario {A._echo(s)} does not run on the {args.target} "
                             f"target; {declared.unsupported(s)}")
    c = A.with_progress(lambda prog: census(args.target, args.release, progress=prog), None,
                        f"census of {args.target}", quiet=args.json)
    asked = list(args.scenarios) or default_set(args.target, declared)
    # on the simulator the children are independent processes: one per core; a GPU's
    # runs go one at a time (they would share the card and its timing)
    jobs = args.jobs or (jobs_default() if args.backend == "sim" else 1)
    res = A.with_progress(
        lambda prog: coverage(args.target, args.release, asked, prog,
                              backend=args.backend, trials=args.trials, census_of=c,
                              jobs=jobs),
        len(asked), f"coverage of {c.package} {c.version}", quiet=args.json)
    if args.json:
        print(json.dumps(res.to_json()))
        return 0
    print_coverage(res, summary=args.summary)
    return 0 if all(r.status != "error" for r in res.runs) else 1


def default_set(target: str, declared) -> List[str]:
    """What ``specrace coverage`` runs when no scenario is named: the target's own set where
    it declares one (vLLM: the axes measured to run sites of their own), else every
    shipped configuration of every scenario (``scenarios.configurations.shipped``), as
    ``specrace repro`` names them (``name``, ``name:variant``) -- the census counts what
    a server runs in any configuration it ships, not in its defaults alone."""
    from scenarios import registry
    from scenarios.configurations import shipped
    own = getattr(declared, "coverage_set", ())
    if own:
        return list(own)
    return [name if conf.variant == AS_INSTALLED else f"{name}:{conf.variant}"
            for name in declared.scenarios for conf in shipped(target, registry.get(name))]


def _share(n: int, d: int) -> str:
    return f"{n}/{d} ({round(100.0 * n / d, 1)}%)" if d else f"{n}/0"


def print_coverage(res, summary: bool = False) -> None:
    out = _console()
    s = res.summary()
    c = res.census
    total, single = s["sites"], s["single_node_sites"]
    out.print(_table(f"{c.package} {c.version}: census sites run, by scenario",
                     ["scenario", "status", "outcome", "sites run", "single-node run",
                      "note"],
                     [[r["scenario"], r["status"], r["outcome"], _share(r["ran"], total),
                       _share(r["single_node_ran"], single), r["note"]]
                      for r in s["by_scenario"]]))
    out.print(_table("by directory", ["directory", "sites run", "single-node run"],
                     [[d["directory"], _share(d["ran"], d["sites"]),
                       _share(d["single_node_ran"], d["single_node_sites"])]
                      for d in s["by_directory"]]))
    out.print(_table("not run, by reason", ["reason", "sites"],
                     [[k, v] for k, v in s["not_run_by_reason"].items()]))
    out.print(_table("not run, by the rule that names it", ["reason: the rule's words", "sites"],
                     [[k, v] for k, v in s["not_run_by_rule"].items()]))
    if not summary:
        out.print(_table("sites not run", ["file:line", "function", "kind", "reason"],
                         [[f"{x.file}:{x.line}", x.function, x.kind,
                           ": ".join(w for w in (why, res.whys.get(x.key, "")) if w)]
                          for x, why in res.not_run()]))
    out.print(f"total: {_share(s['ran'], total)} census sites run")
    out.print(f"single-node paths: {_share(s['single_node_ran'], single)} -- the headline "
              f"(all but the other-hardware and multi-node sites)")
