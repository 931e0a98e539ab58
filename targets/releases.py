"""``specrace releases SCENARIO``: one scenario on every release of a target set up here.

Each release runs in its own environment (the target's ``environments()``), in a child
``specrace repro --target NAME --json``, so its own pins are the ones imported; this
process never imports the server. A release whose code lacks what the scenario drives is
"not applicable", with the reason read from its source. Whatever the child does --
exits, dies, prints nothing, prints half a line, loses its interpreter -- the release
gets a row: an ``error`` row names what happened, and the other releases still run.
"""
from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Callable, Dict, List, Sequence, Tuple, Union

from harness.report.pairs import frames, group
from harness.run import refused_variant
from harness.target import Environments
from seams import children
from seams.children import child_error
from seams.vocab import FENCED_TARGETS, Verdict

CHILD_TIMEOUT_S = 1800  # a release's run that has not answered by then is a harness error
_TEXT = {"type": "string", "maxLength": 4096}
_OPTIONAL_TEXT = {"type": ["string", "null"], "maxLength": 4096}
# What a release's row reads of its child's ``repro --json`` result, each field by type:
# a child's JSON that is not this is not a result (an ``error`` row that says why)
CHILD_RESULT = {
    "type": "object",
    "required": ["outcome", "trials", "reproduced"],
    "properties": {
        "outcome": {"enum": [str(Verdict.RACE), str(Verdict.CLEAN)]},
        "trials": {"type": "integer", "minimum": 1},
        "reproduced": {"type": "integer", "minimum": 0},
        "races": {"type": "array"},
        "war_barrier": _OPTIONAL_TEXT, "variant": _OPTIONAL_TEXT,
        "platform": _TEXT, "load": _TEXT,
        "report_files": {"type": ["object", "null"],
                         "properties": {"markdown": _OPTIONAL_TEXT}},
        "target_info": {"type": ["object", "null"]},
        "first_divergence": {"type": ["object", "null"],
                             "properties": {"kind": _OPTIONAL_TEXT,
                                            "where": _OPTIONAL_TEXT,
                                            "message": _OPTIONAL_TEXT}},
    },
}


def _row(version: str, **kw: Any) -> Dict[str, Any]:
    row = {"release": version, "outcome": None, "trials": None, "reproduced": None,
           "race_sites": None, "report": None, "war_barrier": None, "note": ""}
    row.update(kw)
    return row


def run_release(environments: Environments, target: str, version: str, scenario: str,
                options: List[str], report_dir: str,
                wrap: Callable[[List[str]], List[str]] = lambda cmd: cmd) -> Dict[str, Any]:
    """One release's row: its verdict, or why there is none. ``wrap`` may change how the
    child runs (``--coverage``: under coverage.py, ``targets.coverage.RowCoverage``)."""
    why_not = environments.not_applicable(version, scenario)
    if why_not:
        return _row(version, outcome="not applicable", note=why_not)
    cannot = environments.not_driven(version, scenario)
    if cannot:  # the code is there: not a verdict, and not "absent" either
        return _row(version, outcome="not driven", note=cannot)
    python = environments.python(version)
    # the working directory off the child's path, its hash seed pinned, marked as the one
    # hop it is (seams.children)
    cmd = wrap(children.command(python, "-m", "specrace.cli", "repro", scenario, "--target",
                                target, "--json", "--report-dir",
                                os.path.join(report_dir, version), *options))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                              env=children.env(hop=version, PYTHONUNBUFFERED="1"))
    except subprocess.TimeoutExpired:
        return _row(version, outcome="error", note=f"no answer in {CHILD_TIMEOUT_S} s")
    except OSError as exc:  # the environment lost its interpreter since it was listed
        return _row(version, outcome="error",
                    note=f"cannot run {python}: {exc.strerror or type(exc).__name__}")
    res = _result(proc.stdout)
    if res is None:
        note = child_error(proc.stderr) or f"exit {proc.returncode} without a result"
        # the child refused the variant on this release (its patch does not fit, or the
        # configuration is driven elsewhere): no verdict, and no harness fault either
        refused = refused_variant(proc.returncode, note)
        return _row(version, outcome="not driven" if refused else "error", note=note)
    if isinstance(res, str):  # a JSON object, but not a result: named, never counted
        return _row(version, outcome="error",
                    note=f"exit {proc.returncode} without a result: its JSON {res}"[:200])
    files = res.get("report_files") or {}
    first = res.get("first_divergence") or {}
    return _row(version, outcome=_outcome(res), trials=res["trials"],
                reproduced=res["reproduced"], race_sites=len(res.get("races", [])),
                war_barrier=res.get("war_barrier"), variant=res.get("variant"),
                platform=res.get("platform", "cuda"), load=res.get("load", "none"),
                report=files.get("markdown"),
                tier=(res.get("target_info") or {}).get(f"{target}_tier"),
                first_divergence=first.get("message"), pairs=racing_pairs(res))


def racing_pairs(res: Dict[str, Any]) -> List[Dict[str, Any]]:
    """A result's racing pairs (``harness.report.pairs``): each its text, its sites and
    the frames a known race is matched against."""
    races = res.get("races") if isinstance(res.get("races"), list) else []
    return [{"text": p["text"], "sites": p["sites"],
             "frames": sorted({f for r in p["races"] for f in frames(r)})}
            for p in group(races)]


def _result(stdout: str) -> Union[None, str, Dict[str, Any]]:
    """The child's result: its last line, when that is a JSON object (None: it is not);
    a string saying what is wrong when the object is not a result by type
    (``CHILD_RESULT``): a row counts only a result whose every field it reads is of its
    type, with no more reproductions than trials."""
    lines = stdout.strip().splitlines()
    if not lines:
        return None
    try:
        res = json.loads(lines[-1])
    except (ValueError, RecursionError):
        return None
    if not isinstance(res, dict):
        return None
    import jsonschema
    try:
        jsonschema.validate(res, CHILD_RESULT)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(the object)"
        return f"{where}: {str(exc.message)[:120]}"
    if res["reproduced"] > res["trials"]:
        return f"says {res['reproduced']} of {res['trials']} trials reproduced"
    return res


def _outcome(res: Dict[str, Any]) -> str:
    """The repro's outcome, except that a run whose only finding is the engine crashing
    (or deadlocking) says so -- ``crash``, or ``crash (reference)`` when the synchronous
    reference run itself failed: neither is a race, and a gate expecting one must not
    take it for one."""
    first = res.get("first_divergence") or {}
    kind = first.get("kind")
    if res["outcome"] == Verdict.RACE and kind in ("crash", "deadlock") and not res.get("races"):
        return f"{kind} (reference)" if first.get("where") == "reference" else kind
    return res["outcome"]


def repro_options(scenario, args) -> List[str]:
    """The child ``specrace repro`` flags for ``specrace releases``'s arguments."""
    if args.variant is not None and args.variant not in scenario.variants:
        raise ValueError(f"unknown variant {args.variant!r} for {scenario.name}; "
                         f"expected one of: {', '.join(scenario.variants)}")
    # checked here, before any release is set up or run: a bad one would fail in every
    # release's child, each after its start-up
    load, platform = getattr(args, "load", None), getattr(args, "platform", None)
    if load is not None:
        from harness.runtime.load import get_load
        get_load(str(load))  # ValueError naming the choices
    if platform is not None:
        import targets
        platforms = targets.declared(args.target).platforms
        if platform not in platforms:
            raise ValueError(f"--platform {str(platform)[:40]!r}: the {args.target} target "
                             f"reads its code as {' or '.join(platforms)}")
    options = ["--seed", str(args.seed)]
    for flag, value in (("--variant", args.variant), ("--war-barrier", args.war_barrier),
                        ("--trials", args.trials), ("--expect", args.expect),
                        ("--load", getattr(args, "load", None)),
                        ("--platform", getattr(args, "platform", None))):
        if value is not None:
            options += [flag, str(value)]
    return options


def run_releases(environments: Environments, target: str, scenario: str,
                 options: List[str], report_dir: str, versions: List[str],
                 progress: Callable[[int, int], None] = lambda n, t: None,
                 coverage: bool = False,
                 configurations: Sequence[Tuple[str, str]] = ()) -> List[Dict[str, Any]]:
    """A row per release, and per configuration where ``configurations`` names them
    ((variant, its flags), each run as ``--variant VARIANT``; none: ``options`` as given;
    one row for a release that cannot run the scenario)."""
    confs = list(configurations) or [None]
    # a release that cannot run the scenario gets one row saying why, not one per
    # configuration
    cells = [(v, conf) for v in versions for conf in confs
             if conf is confs[0] or not (environments.not_applicable(v, scenario)
                                         or environments.not_driven(v, scenario))]
    rows = []
    for i, (v, conf) in enumerate(cells):
        progress(i, len(cells))
        opts = options if conf is None else [*options, "--variant", conf[0]]
        measured = None
        if coverage:
            from targets.coverage import RowCoverage  # the census sites the child executed
            measured = RowCoverage(target, v)
        row = run_release(environments, target, v, scenario, opts, report_dir,
                          *([measured.command] if measured else []))
        if measured:
            row = {**row, **measured.figures()}
        if conf is not None:
            row = {**row, "configuration": conf[0], "flags": conf[1]}
        rows.append(row)
    progress(len(cells), len(cells))
    return rows


def settle(rows: List[Dict[str, Any]]) -> None:
    """A race row whose every racing pair is a known *settled* race (``scenarios.findings``:
    read against what consumes the raced value, not a bug) -- none of them the scenario's
    own subject, none a regression -- and whose trials changed no value the oracles read
    reads ``clean``: the scenario's own race is absent. The settled pairs stay listed under
    it; ``settled_trials`` keeps how many trials raced on them. Rows need their pairs
    annotated first (``specrace.audit.annotate_known``)."""
    for row in rows:
        pairs = row.get("pairs") or []
        if row["outcome"] != Verdict.RACE or not pairs or row.get("first_divergence"):
            continue
        known = [p.get("known") or {} for p in pairs]
        if all(k.get("kind") == "settled" and not k.get("regression") and not k.get("subject")
               for k in known):
            names = ", ".join(dict.fromkeys(k["name"] for k in known))
            row.update(outcome=str(Verdict.CLEAN), settled_trials=row["reproduced"],
                       reproduced=0,
                       note=f"settled pairs only, in {row['reproduced']}/{row['trials']} "
                            f"trials, no value changed: {names}")


def format_table(target: str, scenario: str, rows: List[Dict[str, Any]]) -> str:
    """One line per release -- and per racing pair, where a release races more than one
    way (each named at upstream's lines, with the known race it is when the caller matched
    it) -- the fence only for a target that has one."""
    fenced = target in FENCED_TARGETS
    # a row per release x configuration: which one, after the release
    width = max([len(r.get("configuration") or "") for r in rows] + [0])
    width = max(width, len("configuration")) if width else 0
    head = (f"{'release':<14} " + (f"{'configuration':<{width}} " if width else "")
            + (f"{'fence':<7} " if fenced else "")
            + f"{'outcome':<15} {'trials':>7} {'sites':>6}  report / racing pair")
    read_as = sorted({r.get("platform") for r in rows if r.get("platform") not in (None, "cuda")})
    where = f" (read as {', '.join(read_as)})" if read_as else ""
    measured = any("coverage_sites" in r for r in rows)  # --coverage: a column more
    if measured:
        head = head.replace("  report", f"  {'coverage':>16}  report")
    lines = [f"{scenario} on each installed {target} release{where}", head, "-" * len(head)]
    for r in rows:
        trials = "" if r["trials"] is None else f"{r['reproduced']}/{r['trials']}"
        sites = "" if r["race_sites"] is None else str(r["race_sites"])
        tail = "; ".join(t for t in (_said(r), r["report"]) if t) or r["note"]
        if measured:
            tail = f"{_coverage_cell(r):>16}  {tail}"
        conf = f"{r.get('configuration') or '':<{width}} " if width else ""
        lead = (f"{r['release']:<14} {conf}" + (f"{r['war_barrier'] or '':<7} " if fenced else "")
                + f"{r['outcome']:<15} {trials:>7}")
        lines.append(f"{lead} {sites:>6}  {tail}")
        for pair in r.get("pairs") or []:
            known = pair.get("known", False)
            tag = ("" if known is False else " [new]" if known is None
                   else f" [known: {known['name']}{', settled' if known.get('kind') == 'settled' else ''}"
                        f"{' -- REGRESSION' if known.get('regression') else ''}]")
            lines.append(f"{lead} {pair['sites']:>6}  {pair['text']}{tag}")
    return "\n".join(lines)


def _said(row: Dict[str, Any]) -> str:
    """What a row's report link needs beside it: the settled pairs of a row read clean,
    or that a race changed no value the oracles read (the detector's pairs alone: for a
    pair that needs a window upstream does not leave, what its users have)."""
    if row.get("settled_trials"):
        return row["note"]
    if row["outcome"] == Verdict.RACE and row.get("pairs") and not row.get("first_divergence"):
        return "no value changed"
    return ""


def _coverage_cell(row: Dict[str, Any]) -> str:
    """``49/809 (6.1%)``: the census sites of the single-node paths the child executed."""
    if row.get("coverage_ran") is None:
        return "-"
    return f"{row['coverage_ran']}/{row['coverage_sites']} ({row['coverage_percent']}%)"
