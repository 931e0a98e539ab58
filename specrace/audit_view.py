"""What ``specrace audit`` shows: one table (rich, on the console), its JSON (``--json``,
and ``audit.json`` in the report folder), its Markdown (``audit.md``, every write-up and
report linked), and the gate (``--fail-on race|new``).

The gate, row by row:

* ``race`` -- a row that is a finding: a race, a crash or a hang as shipped, known or not;
* ``new``  -- such a row that no known race matches, or one that is a known race come back
  after the release that fixed it (a regression);
* both     -- an ``error`` row: the audit could not judge that configuration (the code no
  longer fits the target, or the harness failed on it), so it cannot vouch for it.
"""
from __future__ import annotations

import io
import json
import os
from typing import Any, Dict, List, Optional, Sequence

from seams.text import printable, printable_tree

from specrace.audit import RACING, Options, Release

AUDIT_FORMAT = 1
FAIL_ON = ("race", "new")
# Columns a row may carry beyond the audit's own, shown when any row has one: where a
# measurement of each configuration plugs in (the census sites its run executed, as
# ``specrace releases --coverage`` shows them: the row's "coverage" text)
EXTRA_COLUMNS = ("coverage",)


def meets(row: Dict[str, Any], fail_on: Optional[str]) -> bool:
    """Does ``row`` fail a gate of ``fail_on`` (None: no gate)?"""
    if fail_on is None:
        return False
    if row.get("verdict") == "error":
        return True
    if row.get("verdict") not in RACING:
        return False
    return fail_on == "race" or bool(row.get("new"))


def document(options: Options, releases: Sequence[Release], fail_on: Optional[str]
             ) -> Dict[str, Any]:
    rows = [r for rel in releases for r in rel.rows]
    return {"format": AUDIT_FORMAT, "target": options.target, "trials": options.trials,
            "seed": options.seed, "backend": options.backend, "fail_on": fail_on,
            "releases": [{"version": rel.version, "where": rel.where,
                          "configurations": rel.cells, "target_info": rel.target_info}
                         for rel in releases],
            "rows": rows, "failing": sum(meets(r, fail_on) for r in rows),
            "summary": summary(options.target, releases)}


def summary(target: str, releases: Sequence[Release]) -> List[str]:
    """One line per release: what ran and what it found."""
    out = []
    for rel in releases:
        cells = {(r["scenario"], r["variant"]): r for r in rel.rows}
        count: Dict[str, int] = {}
        for r in cells.values():
            count[r["verdict"]] = count.get(r["verdict"], 0) + 1
        pairs = [r for r in rel.rows if r["verdict"] in RACING]
        new = sum(bool(r["new"]) for r in pairs)
        scenarios = len({r["scenario"] for r in rel.rows})
        verdicts = ", ".join(f"{n} {v}" for v, n in sorted(count.items()))
        out.append(f"{target} {rel.version or '?'}: {len(cells)} configuration(s) of "
                   f"{scenarios} scenario(s) -- {verdicts or 'nothing ran'}; "
                   f"{len(pairs)} racing pair row(s): {len(pairs) - new} known, {new} new")
    return out


def _known(row: Dict[str, Any]) -> str:
    k = row.get("known")
    if row.get("verdict") not in RACING:
        return ""
    if not k:
        return "new"
    if k.get("regression"):
        return f"REGRESSION of {k['name']} (fixed in {k.get('fixed_in')}): {k['writeup']}"
    settled = " (settled: not a bug)" if k.get("kind") == "settled" else ""
    return f"{k['name']}{settled}: {k['writeup']}"


def _verdict(row: Dict[str, Any]) -> str:
    v = str(row.get("verdict"))
    if row.get("trials") is not None:
        v += f" {row.get('reproduced')}/{row.get('trials')}"
    return v


def _pair(row: Dict[str, Any]) -> str:
    if row.get("pair"):
        return row["pair"]["text"]
    return row.get("note") or ""


def table(doc: Dict[str, Any], width: Optional[int] = None) -> str:
    """The summary table as text (rich: wrapped to ``width``, default the terminal's or
    200 columns when stdout is not one), then one summary line per release."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    t = Table(box=box.SIMPLE_HEAD, show_lines=False, expand=False)
    extra = [k for k in EXTRA_COLUMNS if any(k in r for r in doc["rows"])]
    for name, kw in (("release", {"no_wrap": True}), ("scenario", {}),
                     ("configuration", {"ratio": 3}), ("verdict", {"no_wrap": True}),
                     ("racing pair (upstream's lines) / cause", {"ratio": 5}),
                     ("effect", {"ratio": 2}), ("known race", {"ratio": 3}),
                     *((k, {"ratio": 2}) for k in extra)):
        t.add_column(name, overflow="fold", **kw)  # a path is folded, never cut
    for r in doc["rows"]:
        conf = (f"{r['variant']}: " if r.get("variant") else "") + " ".join(r["configuration"])
        t.add_row(*(printable(x) for x in (r.get("release") or "", r["scenario"], conf,
                                            _verdict(r), _pair(r), r.get("effect") or "",
                                            _known(r), *(str(r.get(k, "")) for k in extra))))
    buf = io.StringIO()
    cols = width or (os.get_terminal_size().columns if _tty() else 200)
    Console(file=buf, width=max(100, cols), color_system=None, highlight=False).print(t)
    lines = [ln.rstrip() for ln in buf.getvalue().splitlines()]
    return "\n".join(lines).strip("\n") + "\n" + "\n".join(doc["summary"])


def _tty() -> bool:
    try:
        return os.isatty(1)
    except (OSError, ValueError):
        return False


def markdown(doc: Dict[str, Any], folder: str) -> str:
    """``audit.md``: the table with every write-up and report linked (relative to
    ``folder``, where the file lies)."""
    from harness.report.markdown import repo_link

    def report(path: str) -> str:  # a report set, written under ``folder``
        return f"[report]({os.path.relpath(os.path.abspath(path), os.path.abspath(folder))})"

    out = [f"# specrace audit: {doc['target']}", ""]
    out += [f"- {line}" for line in doc["summary"]]
    out += ["", f"Trials per configuration: {doc['trials']} (seed {doc['seed']}, backend "
                f"{doc['backend']}); gate: `--fail-on {doc['fail_on']}`" if doc["fail_on"]
            else f"Trials per configuration: {doc['trials']} (seed {doc['seed']}, backend "
                 f"{doc['backend']}); no gate.", "",
            "| release | scenario | configuration | verdict | racing pair / cause | effect | "
            "known race | report |", "|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        k = r.get("known")
        known = _known(r)
        if k and known != "new":
            known = repo_link(k["writeup"], known.split(":")[0], folder)
        cells = [r.get("release") or "", f"`{r['scenario']}`",
                 (f"`{r['variant']}`: " if r.get("variant") else "")
                 + " ".join(f"`{c}`" for c in r["configuration"]),
                 _verdict(r), _pair(r), r.get("effect") or "", known,
                 report(r["report"]) if r.get("report") else ""]
        out.append("| " + " | ".join(printable(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out) + "\n"


def write(doc: Dict[str, Any], folder: str) -> Dict[str, str]:
    """``audit.json`` and ``audit.md`` in ``folder``, each replaced whole (a reader sees
    the previous file or this one)."""
    os.makedirs(folder, exist_ok=True)
    paths = {"json": os.path.join(folder, "audit.json"),
             "markdown": os.path.join(folder, "audit.md")}
    for kind, text in (("json", json.dumps(printable_tree(doc), indent=1, default=str) + "\n"),
                       ("markdown", markdown(doc, folder))):
        tmp = paths[kind] + f".tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, paths[kind])
    return paths


def failing(doc: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [r for r in doc["rows"] if meets(r, doc["fail_on"])]
