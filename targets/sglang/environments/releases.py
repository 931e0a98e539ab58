"""``specrace releases SCENARIO``: one scenario on every installed sglang release.

Each release runs in its own environment (``envs``), in a child ``specrace repro
--target sglang --json``, so its own pins are the ones imported; this process never
imports sglang. A release whose code lacks what the scenario drives (no ``GrammarTree``
before 0.5.17) is "not applicable", read from its source (``contract.features``).
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from typing import Callable, Dict, List, Optional

from targets.sglang.boundary import contract
from targets.sglang.environments import envs

# scenario -> the feature (contract.FEATURES) its code needs
NEEDS: Dict[str, str] = {"grammar-ngram": "grammar_tree", "grammar-tree-staging": "grammar_tree",
                         "dspark-confidence-ring": "dspark", "dspark-result-readback": "dspark",
                         "eagle-v2": "eagle_v2", "eagle-v2-grammar": "eagle_v2"}
CHILD_TIMEOUT_S = 1800  # a release's run that has not answered by then is a harness error


def release_root(version: str) -> Optional[str]:
    found = glob.glob(os.path.join(envs.env_dir(version), "lib", "python*", "site-packages",
                                   "sglang"))
    return found[0] if found else None


def run_release(version: str, scenario: str, options: List[str], report_dir: str) -> Dict:
    """One release's row: its verdict (or why there is none)."""
    row = {"release": version, "outcome": None, "trials": None, "reproduced": None,
           "race_sites": None, "report": None, "war_barrier": None, "note": ""}
    root = release_root(version)
    need = NEEDS.get(scenario)
    missing = contract.missing_code(root, need) if root is not None and need else None
    if missing:
        row["outcome"] = "not applicable"
        row["note"] = f"the release has no {missing.split(':')[1]}"
        return row
    out_dir = os.path.join(report_dir, version)
    cmd = [envs.env_python(version), "-m", "specrace.cli", "repro", scenario,
           "--target", "sglang", "--json", "--report-dir", out_dir, *options]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except subprocess.TimeoutExpired:
        row.update(outcome="error", note=f"no answer in {CHILD_TIMEOUT_S} s")
        return row
    try:
        res = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        row.update(outcome="error", note=(err[-1] if err else f"exit {proc.returncode}")[:200])
        return row
    files = res.get("report_files") or {}
    row.update(outcome=_outcome(res), trials=res["trials"], reproduced=res["reproduced"],
               race_sites=len(res.get("races") or ()), war_barrier=res.get("war_barrier"),
               variant=res.get("variant"), report=files.get("markdown"),
               tier=(res.get("target_info") or {}).get("sglang_tier"),
               first_divergence=(res.get("first_divergence") or {}).get("message"))
    return row


def _outcome(res: Dict) -> str:
    """The repro's outcome, except that a run whose only finding is the engine crashing
    (or deadlocking) says so -- ``crash``, or ``crash (reference)`` when the synchronous
    reference run itself failed: neither is a race, and a gate expecting one must not
    take it for one."""
    first = res.get("first_divergence") or {}
    kind = first.get("kind")
    if res["outcome"] == "race" and kind in ("crash", "deadlock") and not res.get("races"):
        return f"{kind} (reference)" if first.get("where") == "reference" else kind
    return res["outcome"]


def repro_options(scenario, args) -> List[str]:
    """The child ``specrace repro`` flags for ``specrace releases``'s arguments."""
    if args.variant is not None and args.variant not in scenario.variants:
        raise ValueError(f"unknown variant {args.variant!r} for {scenario.name}; "
                         f"expected one of: {', '.join(scenario.variants)}")
    options = ["--seed", str(args.seed)]
    for flag, value in (("--variant", args.variant), ("--war-barrier", args.war_barrier),
                        ("--trials", args.trials), ("--expect", args.expect)):
        if value is not None:
            options += [flag, str(value)]
    return options


def run_releases(scenario: str, options: List[str], report_dir: str,
                 versions: Optional[List[str]] = None,
                 progress: Callable[[int, int], None] = lambda n, t: None) -> List[Dict]:
    versions = versions if versions is not None else envs.installed()
    rows = []
    for i, v in enumerate(versions):
        progress(i, len(versions))
        rows.append(run_release(v, scenario, options, report_dir))
    progress(len(versions), len(versions))
    return rows


def format_table(scenario: str, rows: List[Dict]) -> str:
    head = f"{'release':<14} {'fence':<7} {'outcome':<15} {'trials':>7} {'sites':>6}  report"
    lines = [f"{scenario} on each installed sglang release", head, "-" * len(head)]
    for r in rows:
        trials = "" if r["trials"] is None else f"{r['reproduced']}/{r['trials']}"
        sites = "" if r["race_sites"] is None else str(r["race_sites"])
        tail = r["report"] or r["note"]
        lines.append(f"{r['release']:<14} {r['war_barrier'] or '':<7} {r['outcome']:<15} "
                     f"{trials:>7} {sites:>6}  {tail}")
    return "\n".join(lines)


def main_table(scenario: str, options: List[str], report_dir: str) -> int:
    rows = run_releases(scenario, options, report_dir)
    print(format_table(scenario, rows))
    return 0 if rows else 2


if __name__ == "__main__":
    sys.exit(main_table(sys.argv[1], sys.argv[2:], "reports/releases"))
