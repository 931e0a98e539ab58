"""Audit the installed sglang release on the simulator (writes reports/upstream/audit.json).

1. Every scenario of the sglang target, released code (variant ``fixed``, and every
   other configuration of it the scenario expects clean: retraction, chunked prefill, the
   SWA layout, the EAGLE shapes ...), both fences, under every policy family and several
   seeds: any race or stale value is a finding.
   The pre-fix variant of the seed scenario is run alongside as a positive control (the
   audit must see the race it is built to see).
2. The code that shares the relay and runs without GPU kernels:
   * ``ConfidenceRelay``'s ring (``FutureMap.publish`` with a confidence tensor ->
     ``issue_ring_copy`` on the private D2H stream behind ``publish_ready`` ->
     ``resolve_confidence_cpu``, which polls ``copy_done[slot].query()`` and reads the
     pinned ring on the host), step after step with the forward stream stalled: values
     must equal what was published ``CONFIDENCE_RELAY_RING_LAG`` steps earlier, and the
     trace must be race-free. Control: the same with the ``query()`` poll patched out
     (``resolve`` trusting the slot) must be a race.
   * ``FutureMap``'s private D2H stream and pinned seq-lens mirror are exercised by every
     engine step above (``resolve_seq_lens_cpu``).

Usage: python tools/reports/upstream_audit.py [--seeds N] [--out reports/upstream/audit.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from scenarios.sglang_relay import POLICIES  # noqa: E402


def released_cells(sc) -> list:
    """``(variant, fence)`` cells that run the released code: ``fixed`` under both fences,
    and every other configuration of it the scenario expects clean (no seeded bug, no
    candidate fix: retraction, chunked prefill, the SWA layout, the EAGLE shapes ...)."""
    from scenarios.base import AS_INSTALLED, FIXED
    cells = [(FIXED, fence) for fence in ("fine", "coarse")]
    for variant, v in sc.variants.items():
        if variant in (FIXED, AS_INSTALLED) or v.mutation is not None or v.fix is not None:
            continue
        if v.args.get("relay") == "spec_info":
            continue  # the pre-#35198 relay patched back in: not this release's code
        cells += [(variant, fence) for fence in ("fine", "coarse")
                  if sc.expected(variant, fence) == "clean"]
    return cells


def audit_scenarios(seeds: int) -> list:
    import targets
    from scenarios.resolve import run_scenario
    from harness.policies import parse_policy
    from scenarios.registry import get
    rows = []
    tgt = targets.get("sglang")
    for name in tgt.scenarios:
        sc = get(name)
        for variant, fence in released_cells(sc):
            for policy in POLICIES:
                res = run_scenario(name, variant=variant, war_barrier=fence, backend="sim",
                                   policy=parse_policy(policy), trials=seeds, target="sglang")
                rows.append({"scenario": name, "variant": variant, "fence": fence,
                             "policy": policy, "trials": res["trials"],
                             "reproduced": res["reproduced"],
                             "checked": sum(t["checked"] for t in res["trial_results"]),
                             "first_divergence": (res["first_divergence"] or {}).get("message"),
                             "races": [r["summary"] for r in res["races"]]})
                print(f"audit: {name} {variant} {fence} {policy}: {res['reproduced']}/"
                      f"{res['trials']}", file=sys.stderr, flush=True)
    control = run_scenario("ngram-filter-race", variant="pre-fix", war_barrier="fine",
                           backend="sim", trials=seeds, target="sglang")
    return rows, {"scenario": "ngram-filter-race", "variant": "pre-fix", "fence": "fine",
                  "reproduced": control["reproduced"], "trials": control["trials"],
                  "races": len(control["races"])}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out", default="reports/upstream/audit.json")
    args = ap.parse_args()
    import targets
    from scenarios.sglang_relay import confidence_ring
    t0 = time.perf_counter()
    tgt = targets.get("sglang")
    rows, control = audit_scenarios(args.seeds)
    ring = [confidence_ring(p, cpu) for cpu in (True, False) for p in POLICIES]
    ring_control = [confidence_ring(p, False, trust_slot=True) for p in ("lazy", "stall(forward)")]
    out = {"target": tgt.describe(), "policies": POLICIES, "seeds_per_cell": args.seeds,
           "scenario_cells": rows, "positive_control": control,
           "confidence_ring": ring, "confidence_ring_control": ring_control,
           "findings": [r for r in rows if r["reproduced"]]
           + [r for r in ring if r["mismatches"] or r["races"]],
           "wall_s": round(time.perf_counter() - t0, 1)}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    trials = sum(r["trials"] for r in rows)
    print(f"sglang {out['target']['sglang_version']}: {len(rows)} scenario cells, {trials} "
          f"trials, {sum(r['checked'] for r in rows)} values checked, findings: "
          f"{len(out['findings'])}; control (pre-fix) {control['reproduced']}/"
          f"{control['trials']}; confidence ring: {sum(r['resolved'] for r in ring)} resolves, "
          f"{sum(len(r['races']) for r in ring)} races; ring control races: "
          f"{[len(r['races']) for r in ring_control]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
