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
from typing import Any, Callable, Dict, List, Optional

from harness.target import Environments
from seams.vocab import Verdict

CHILD_TIMEOUT_S = 1800  # a release's run that has not answered by then is a harness error
# what every row of a finished child carries (a child's JSON without one is not a result)
_RESULT_KEYS = ("outcome", "trials", "reproduced")


def _row(version: str, **kw: Any) -> Dict[str, Any]:
    row = {"release": version, "outcome": None, "trials": None, "reproduced": None,
           "race_sites": None, "report": None, "war_barrier": None, "note": ""}
    row.update(kw)
    return row


def run_release(environments: Environments, target: str, version: str, scenario: str,
                options: List[str], report_dir: str) -> Dict[str, Any]:
    """One release's row: its verdict, or why there is none."""
    why_not = environments.not_applicable(version, scenario)
    if why_not:
        return _row(version, outcome="not applicable", note=why_not)
    cannot = environments.not_driven(version, scenario)
    if cannot:  # the code is there: not a verdict, and not "absent" either
        return _row(version, outcome="not driven", note=cannot)
    python = environments.python(version)
    cmd = [python, "-m", "specrace.cli", "repro", scenario, "--target", target, "--json",
           "--report-dir", os.path.join(report_dir, version), *options]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except subprocess.TimeoutExpired:
        return _row(version, outcome="error", note=f"no answer in {CHILD_TIMEOUT_S} s")
    except OSError as exc:  # the environment lost its interpreter since it was listed
        return _row(version, outcome="error",
                    note=f"cannot run {python}: {exc.strerror or type(exc).__name__}")
    res = _result(proc.stdout)
    if res is None:
        err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        note = err[-1] if err else f"exit {proc.returncode} without a result"
        return _row(version, outcome="error", note=note[:200])
    files = res.get("report_files") if isinstance(res.get("report_files"), dict) else {}
    first = res.get("first_divergence") if isinstance(res.get("first_divergence"), dict) else {}
    info = res.get("target_info") if isinstance(res.get("target_info"), dict) else {}
    races = res.get("races") if isinstance(res.get("races"), list) else []
    return _row(version, outcome=_outcome(res), trials=res["trials"],
                reproduced=res["reproduced"], race_sites=len(races),
                war_barrier=res.get("war_barrier"), variant=res.get("variant"),
                platform=res.get("platform", "cuda"), load=res.get("load", "none"),
                report=files.get("markdown"), tier=info.get(f"{target}_tier"),
                first_divergence=first.get("message"))


def _result(stdout: str) -> Optional[Dict[str, Any]]:
    """The child's result: its last line, when that is a JSON object with a verdict."""
    lines = stdout.strip().splitlines()
    if not lines:
        return None
    try:
        res = json.loads(lines[-1])
    except ValueError:
        return None
    if not isinstance(res, dict) or any(k not in res for k in _RESULT_KEYS):
        return None
    if not isinstance(res["outcome"], str):
        return None
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
                 progress: Callable[[int, int], None] = lambda n, t: None
                 ) -> List[Dict[str, Any]]:
    rows = []
    for i, v in enumerate(versions):
        progress(i, len(versions))
        rows.append(run_release(environments, target, v, scenario, options, report_dir))
    progress(len(versions), len(versions))
    return rows


def format_table(target: str, scenario: str, rows: List[Dict[str, Any]]) -> str:
    head = f"{'release':<14} {'fence':<7} {'outcome':<15} {'trials':>7} {'sites':>6}  report"
    read_as = sorted({r.get("platform") for r in rows if r.get("platform") not in (None, "cuda")})
    where = f" (read as {', '.join(read_as)})" if read_as else ""
    lines = [f"{scenario} on each installed {target} release{where}", head, "-" * len(head)]
    for r in rows:
        trials = "" if r["trials"] is None else f"{r['reproduced']}/{r['trials']}"
        sites = "" if r["race_sites"] is None else str(r["race_sites"])
        tail = r["report"] or r["note"]
        lines.append(f"{r['release']:<14} {r['war_barrier'] or '':<7} {r['outcome']:<15} "
                     f"{trials:>7} {sites:>6}  {tail}")
    return "\n".join(lines)
