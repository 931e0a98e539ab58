"""The Markdown summary: what a person reads first."""
from __future__ import annotations

import os
import shlex
from typing import Any, Dict, List, Optional

from harness.paths import REPO_ROOT

from .text import printable

MAX_RACES = 20
MAX_TRIAL_ROWS = 20


def _source_line(path: Optional[str], line: Optional[int]) -> Optional[str]:
    """The source text at ``path:line`` (project-relative path), if it is readable."""
    if not path or not isinstance(line, int) or line < 1:
        return None
    full = os.path.normpath(os.path.join(REPO_ROOT, path))
    if not full.startswith(REPO_ROOT + os.sep) or not os.path.isfile(full):
        return None
    try:
        with open(full, encoding="utf-8", errors="replace") as f:
            for i, text in enumerate(f, 1):
                if i == line:
                    return text.strip()[:160] or None
    except OSError:
        return None
    return None


def _site(acc: Dict[str, Any]) -> str:
    if acc.get("file") is None:
        return "unknown site"
    site = f"`{acc['file']}:{acc['line']}` ({acc.get('function')})"
    replay = acc.get("replayed_at")
    if isinstance(replay, dict):  # an op of a CUDA graph: captured here, replayed there
        return (f"{site} -- captured in a CUDA graph there, replayed at "
                f"`{replay.get('file')}:{replay.get('line')}` ({replay.get('function')})")
    return site


def _code(v: Any) -> str:
    s = str(v).replace("`", "'")
    return f"`{s if len(s) <= 200 else s[:197] + '...'}`"


def repro_command(r: Dict[str, Any]) -> str:
    parts = ["specrace", "repro", str(r.get("scenario"))]
    if r.get("target", "impl") != "impl":
        parts += ["--target", str(r["target"])]
    parts += ["--variant", str(r.get("variant")),
             "--war-barrier", str(r.get("war_barrier")), "--backend", str(r.get("backend"))]
    if r.get("backend") == "sim" and r.get("policy"):
        parts += ["--policy", str(r["policy"])]
    if r.get("stall_ms") is not None:
        parts += ["--stall-ms", str(r["stall_ms"])]
    parts += ["--trials", str(r.get("trials")), "--seed", str(r.get("seed")),
              "--expect", str(r.get("expect"))]
    return " ".join(shlex.quote(p) for p in parts)


def render_markdown(report: Dict[str, Any], paths: Dict[str, Optional[str]], trace: Any,
                    races: List[Any], timeline_note: Optional[str]) -> str:
    return printable(_render(report, paths, trace, races, timeline_note), keep_newlines=True)


def _render(report: Dict[str, Any], paths: Dict[str, Optional[str]], trace: Any,
            races: List[Any], timeline_note: Optional[str]) -> str:
    from harness.oracle.repro import verdict_line

    r = report
    n, t = r.get("reproduced", 0), r.get("trials", 0)
    out: List[str] = []
    out.append(f"# specrace: {r.get('scenario')} [{r.get('variant')}, "
               f"{r.get('war_barrier')} fence] on {r.get('backend')}")
    out.append("")
    info = r.get("target_info") or {}
    if r.get("target", "impl") != "impl":
        out.append(f"Target: installed **{r.get('target')} {info.get('sglang_version', '')}** "
                   f"(files digest `{info.get('sglang_files_digest')}`; stood in for: "
                   f"{', '.join(info.get('stood_in') or []) or 'nothing'}). Upstream frames "
                   f"are named `sglang/...`, relative to the install.")
        out.append("")
    head = (f"**RACE REPRODUCED in {n}/{t} trials**" if n else f"**clean: 0/{t} trials**")
    out.append(f"{head} -- expected `{r.get('expect')}` "
               f"({'matches' if r.get('matches_expectation') else 'does NOT match'}); "
               f"the scenario expects `{r.get('expected_by_scenario')}` for this variant/fence.")
    out.append("")
    try:
        out.append(f"> {verdict_line(r)}")
    except (KeyError, TypeError, ValueError):
        pass
    out.append("")
    points = ", ".join(f"`{s.get('point')}`" for s in r.get("stall_plan") or []
                       if isinstance(s, dict))
    stall = ("until forced" if r.get("stall_ms") is None else f"{r.get('stall_ms')} ms")
    out.append(f"- policy: `{r.get('policy')}`; "
               + (f"stall {stall} at {points}" if points else "no stalls"))
    out.append(f"- seed {r.get('seed')} (trial i runs seed {r.get('seed')}+i), "
               f"first failing trial: "
               f"{'none' if r.get('first_trial') is None else r.get('first_trial') + 1}")
    if r.get("run_id"):
        out.append(f"- run id `{r['run_id']}` (every file of this report set carries it)")
    out.append("")

    # --- what raced with what ---
    rs = r.get("races") or []
    out.append(f"## What raced ({len(rs)} site{'s' if len(rs) != 1 else ''})")
    out.append("")
    if not rs:
        out.append("No unordered conflicting accesses were found by the happens-before "
                   "detector.")
    for i, race in enumerate(rs[:MAX_RACES], 1):
        a, b = race.get("first", {}), race.get("second", {})
        out.append(f"{i}. **{race.get('kind')}** on `{race.get('storage')}` "
                   f"(seen {race.get('count', 1)}x over the trials): the {a.get('access')} "
                   f"is not ordered before the {b.get('access')} -- no event/sync edge "
                   f"between them.")
        for label, acc in (("first ", a), ("second", b)):
            out.append(f"   - {label}: stream **{acc.get('actor')}**, op `{acc.get('op')}` "
                       f"({acc.get('access')}, #{acc.get('seq')} on its stream) at "
                       f"{_site(acc)}")
            src = _source_line(acc.get("file"), acc.get("line"))
            if src:
                out.append(f"     `{src.replace('`', chr(39))}`")
        reuse = race.get("reuse")
        if isinstance(reuse, dict):
            out.append(f"   - **across a reuse**: the caching allocator handed block "
                       f"{reuse.get('block')} on to a new storage while the first access, "
                       f"made through the old one, may still be pending (free it after a "
                       f"sync, or `record_stream` the stream that uses it):")
            for label, owner in (("old owner", reuse.get("old") or {}),
                                 ("new owner", reuse.get("new") or {})):
                on = f" on stream **{owner.get('stream')}**" if owner.get("stream") else ""
                out.append(f"     - {label}: `{owner.get('storage')}`, allocated{on} at "
                           f"{_site(owner) if owner.get('file') else 'an unknown site'}")
    if len(rs) > MAX_RACES:
        out.append(f"\n... and {len(rs) - MAX_RACES} more in the JSON report.")
    out.append("")

    # --- first divergence ---
    out.append("## First divergence")
    out.append("")
    div = r.get("first_divergence")
    if not div:
        out.append("None: every value that reached the host matched the synchronous "
                   "reference.")
    else:
        trial = (r.get('first_trial') or 0) + 1
        if div.get("kind") in ("accept_lens", "accept_tokens"):
            out.append(f"Trial {trial}: **stale `{div.get('kind')}`** for request "
                       f"{div.get('rid')}, step {div.get('step')}, at {div.get('where')} "
                       f"(stream `{div.get('stream')}`).")
        else:
            out.append(f"Trial {trial}: **{div.get('kind')}** -- "
                       f"{_code(div.get('message'))}")
        out.append("")
        out.append("| | value |")
        out.append("|---|---|")
        out.append(f"| expected (synchronous reference) | {_code(div.get('expected'))} |")
        out.append(f"| observed | {_code(div.get('observed'))} |")
        obs = div.get("observed")
        if isinstance(obs, int) and obs in (0x5A5A5A5A, 0x5A5A5A5A5A5A5A5A):
            out.append("")
            out.append("The observed value is the simulator's uninitialised-memory fill "
                       "(0x5A5A...): the host read memory no kernel had written yet.")
    out.append("")

    # --- trials ---
    trials = r.get("trial_results") or []
    if trials:
        out.append("## Trials")
        out.append("")
        out.append("| trial | seed | reproduced | divergence | races | values checked |")
        out.append("|---:|---:|:---:|---|---:|---:|")
        for tr in trials[:MAX_TRIAL_ROWS]:
            out.append(f"| {tr.get('trial', 0) + 1} | {tr.get('seed')} | "
                       f"{'yes' if tr.get('reproduced') else 'no'} | "
                       f"{tr.get('divergence') or '-'} | {tr.get('races')} | "
                       f"{tr.get('checked')} |")
        if len(trials) > MAX_TRIAL_ROWS:
            out.append(f"\n({len(trials) - MAX_TRIAL_ROWS} more trials in the JSON report.)")
        out.append("")

    # --- replay ---
    out.append("## Replay")
    out.append("")
    out.append("Re-run with the same parameters and compare the verdict (identical on the "
               "simulator):")
    out.append("")
    out.append("```sh")
    out.append(r.get("replay", {}).get("command", ""))
    out.append("```")
    out.append("")
    out.append("or from scratch:")
    out.append("")
    out.append("```sh")
    out.append(repro_command(r))
    out.append("```")
    out.append("")

    # --- timeline ---
    out.append("## Timeline")
    out.append("")
    if paths.get("timeline"):
        png = os.path.basename(paths["timeline"])
        out.append(f"![timeline of trial {(r.get('first_trial') or 0) + 1}]({png})")
        out.append("")
        if timeline_note and timeline_note != "full trace":
            out.append(f"The picture shows a {timeline_note}.")
            out.append("")
        out.append(f"The full trace is `{os.path.basename(paths['trace'])}` "
                   f"(Chrome trace-event format). Open it at <https://ui.perfetto.dev> -> "
                   f"**Open trace file**, or in Chrome at `chrome://tracing` -> **Load**. "
                   f"One lane per stream plus the host; the racing accesses carry "
                   f"`args.race` and a \"race\" flow arrow, event record -> wait edges are "
                   f"flow arrows.")
    else:
        out.append("No trace was kept for this run (race detection off), so there is no "
                   "timeline.")
    out.append("")

    # --- environment ---
    env = r.get("environment") or {}
    out.append("## Environment")
    out.append("")
    for k in ("python", "platform", "torch", "cuda", "gpu", "driver", "xgrammar", "specrace",
              "git_commit"):
        if env.get(k) is not None:
            out.append(f"- {k}: `{env[k]}`")
    out.append("")
    return "\n".join(out)
