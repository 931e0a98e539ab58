"""The mutation matrix's result and its kill table: pure functions over the cells' rows,
no torch -- so the process that only reports (pytest-xdist's controller) does not load the
engine. ``matrix.run`` runs the cells and re-exports these."""
from __future__ import annotations

from typing import List, Optional, Tuple

Cell = Tuple[str, str]  # ("probe", name): the fixed code; ("mutation", name): a seeded bug


def cell_failed(cell: Cell, row: dict) -> bool:
    """Does this cell fail the gate? A mutation that is not killed (a declared-equivalent
    one that survived passes: that is what it declared), a finding on the fixed code, a
    harness error or a timeout (``matrix_ok`` over one cell)."""
    if cell[0] == "probe":
        return row["status"] != "clean"
    return row["status"] not in ("killed", "equivalent")


def assemble(backend: str, target: str, cells: List[Cell], rows: List[dict],
             seconds: float) -> dict:
    """The matrix result (what ``format_matrix``/``matrix_ok`` read) from its cells' rows."""
    fixed = [r for (kind, _), r in zip(cells, rows) if kind == "probe"]
    every_mut = [r for (kind, _), r in zip(cells, rows) if kind == "mutation"]
    muts = [r for r in every_mut if r.get("status") not in ("disabled", "equivalent")]
    every = fixed + muts
    return {"backend": backend, "target": target,
            "fixed_findings": sum(1 for f in fixed if f["finding"]),
            "fixed": fixed,
            "total": len(muts), "killed": sum(r["killed"] for r in muts),
            "harness_errors": sum(c.get("status") == "harness-error" for c in every),
            "timeouts": sum(c.get("status") == "timeout" for c in every),
            "seconds": round(seconds, 3),
            "mutations": muts,
            # patches that do not fit this release: named, not counted
            "disabled": [{"name": r["name"], "detail": r.get("detail")}
                         for r in every_mut if r.get("status") == "disabled"],
            # seeded bugs that cannot change behaviour here, shown to survive every probe
            "equivalent": [{"name": r["name"], "detail": r.get("detail")}
                           for r in every_mut if r.get("status") == "equivalent"]}


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
    for d in res.get("disabled", ()):
        lines.append(f"  disabled {d['name']:<36} {d['detail'] or ''}")
    for d in res.get("equivalent", ()):
        lines.append(f"  equiv.   {d['name']:<36} {d['detail'] or ''}")
    return "\n".join(lines)
