"""The Markdown summary: what a person reads first."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union

from seams.paths import REPO_ROOT
from harness.runtime.trace import Frame, Trace, short_path

from seams.text import printable
from seams.vocab import FENCED_TARGETS
from harness.report.graph_owned import graph_owned_reads

if TYPE_CHECKING:
    from harness.detect import Race
    from harness.detect.hb import AccessInfo, Owner
    from harness.oracle.divergence import Divergence
    from harness.report.document import Report

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


def _site(acc: Union[AccessInfo, Owner]) -> str:
    """Where an access (``AccessInfo``) or an owner (``Owner``) happened, in Markdown."""
    if acc.frame is None:
        return "unknown site"
    site = _frame(acc.frame)
    replay = getattr(acc, "replayed_at", None)
    if replay is not None:  # an op of a CUDA graph: captured here, replayed there
        return f"{site} -- captured in a CUDA graph there, replayed at {_frame(replay)}"
    return site


def _frame(frame: Frame) -> str:
    return f"`{short_path(frame[0])}:{frame[1]}` ({frame[2]})"


def _code(v: Any) -> str:
    s = str(v).replace("`", "'")
    return f"`{s if len(s) <= 200 else s[:197] + '...'}`"


def render_markdown(report: Report, paths: Dict[str, Optional[str]],
                    timeline_note: Optional[str],
                    context: Optional[Dict[str, Any]] = None) -> str:
    """The summary of ``report`` (a ``document.Report``) whose files are at ``paths``;
    ``context`` as ``write_reports`` takes it."""
    return printable(_render(report, paths, timeline_note, context or {}), keep_newlines=True)


def _render(report: Report, paths: Dict[str, Optional[str]], timeline_note: Optional[str],
            context: Dict[str, Any]) -> str:
    r = report.result
    shown = (r.first_trial or 0) + 1  # the trial the trace and the divergence are from
    out = _summary(report)
    out += _context(context, paths)
    out += _races(r.races)
    out += _graph_owned(r.trace)
    out += _divergence(r.first_divergence, shown)
    out += _trials(r.trial_results)
    out += _replay(report)
    out += _timeline(paths, timeline_note, shown)
    out += _environment(report.environment)
    return "\n".join(out)


def _summary(report: Report) -> List[str]:
    """The title, the target (when not ours), the verdict against what was expected, and
    the run's settings."""
    r = report.result
    n, t = r.reproduced, r.trials
    out: List[str] = [f"# specrace: {r.heading()}", ""]
    if r.target != "impl":
        out += [_target_line(r.target, r.target_info), ""]
    head = (f"**RACE REPRODUCED in {n}/{t} trials**" if n else f"**clean: 0/{t} trials**")
    stated = ("no expectation stated" if r.expect is None else
              f"expected `{r.expect}` "
              f"({'matches' if r.matches_expectation else 'does NOT match'})")
    out.append(f"{head} -- {stated}; "
               f"the scenario expects `{r.expected_by_scenario}` for this "
               f"{'variant/fence' if r.target in FENCED_TARGETS else 'variant'}.")
    out += ["", f"> {r.verdict_line()}", ""]
    points = ", ".join(f"`{s.point}`" for s in r.stall_plan)
    stall = "until forced" if r.stall_ms is None else f"{r.stall_ms} ms"
    out.append(f"- policy: `{r.policy}`; "
               + (f"stall {stall} at {points}" if points else "no stalls"))
    out.append(f"- seed {r.seed} (trial i runs seed {r.seed}+i), first failing trial: "
               f"{'none' if r.first_trial is None else r.first_trial + 1}")
    if report.run_id:
        out.append(f"- run id `{report.run_id}` (every file of this report set carries it)")
    out.append("")
    return out


def _replay(report: Report) -> List[str]:
    """How to run it again: the recorded report's replay, or the repro from scratch."""
    r = report.result
    out = ["## Replay", "", "Re-run with the same parameters and compare the verdict "
           "(identical on the simulator):", "", "```sh", report.replay_command or "", "```", ""]
    version = r.target_info.get(f"{r.target}_version")
    if isinstance(version, str):
        out += [f"It replays on {r.target} {version}: in the interpreter that runs it if that "
                f"is the release it imports, else in the release's own environment "
                f"(`.releases/{r.target}/{version}`; `make upstream TARGET={r.target} "
                f"{r.target.upper()}={version}` sets it up); a release not set up is refused "
                f"(exit 2), never replayed on another.", ""]
    return out + ["or from scratch:", "", "```sh", r.repro_command(), "```", ""]


def _timeline(paths: Dict[str, Optional[str]], timeline_note: Optional[str],
              shown: int) -> List[str]:
    """The picture of trial ``shown`` and where to open the full trace (none: no trace)."""
    out = ["## Timeline", ""]
    if paths.get("timeline"):
        png = os.path.basename(paths["timeline"])
        out += [f"![timeline of trial {shown}]({png})", ""]
        if timeline_note and timeline_note != "full trace":
            out += [f"The picture shows a {timeline_note}.", ""]
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
    return out


def _environment(env: Dict[str, Any]) -> List[str]:
    """Where the run happened, one line per thing known."""
    out = ["## Environment", ""]
    for k in ("python", "platform", "torch", "cuda", "gpu", "driver", "xgrammar", "specrace",
              "git_commit"):
        if env.get(k) is not None:
            out.append(f"- {k}: `{env[k]}`")
    out.append("")
    return out


def _graph_owned(trace: Optional[Trace]) -> List[str]:
    """The graph outputs a copy read in the shown trial (``graph_owned``): what a fix
    must clone, or wait for, before the next replay."""
    rows = graph_owned_reads(trace) if trace is not None else []
    if not rows:
        return []
    out = ["## Graph-owned buffers read by copies", "",
           "Storage a CUDA graph replay writes, read by a device-to-host copy in the shown "
           "trial (the next replay rewrites it in place):", ""]
    for row in rows:
        code = _source_line(*row["written_frame"]) if row["written_frame"] else None
        out.append(f"- `{row['storage']}`: read by {row['read_by']} at `{row['read_at']}`,"
                   f" written by {row['written_by']}" + (f": `{code}`" if code else ""))
    return out + [""]


def _races(races: List[Race]) -> List[str]:
    """What raced with what (``harness.detect.Race``, counted over the trials)."""
    out = [f"## What raced ({len(races)} site{'s' if len(races) != 1 else ''})", ""]
    if not races:
        out.append("No unordered conflicting accesses were found by the happens-before "
                   "detector.")
    for i, race in enumerate(races[:MAX_RACES], 1):
        a, b = race.first, race.second
        out.append(f"{i}. **{race.kind}** on `{race.storage}` (seen {race.count}x over the "
                   f"trials): the {a.access_kind()} is not ordered before the "
                   f"{b.access_kind()} -- no event/sync edge between them.")
        for label, acc in (("first ", a), ("second", b)):
            out.append(f"   - {label}: stream **{acc.actor}**, op `{acc.op}` "
                       f"({acc.access_kind()}, #{acc.seq} on its stream) at {_site(acc)}")
            src = _source_line(short_path(acc.frame[0]), acc.frame[1]) if acc.frame else None
            if src:
                out.append(f"     `{src.replace('`', chr(39))}`")
        if race.reuse is not None:
            out.append(f"   - **across a reuse**: the caching allocator handed block "
                       f"{race.reuse.block} on to a new storage while the first access, "
                       f"made through the old one, may still be pending (free it after a "
                       f"sync, or `record_stream` the stream that uses it):")
            for label, owner in (("old owner", race.reuse.old), ("new owner", race.reuse.new)):
                on = f" on stream **{owner.stream}**" if owner.stream else ""
                out.append(f"     - {label}: `{owner.storage}`, allocated{on} at "
                           f"{_site(owner) if owner.frame else 'an unknown site'}")
    if len(races) > MAX_RACES:
        out.append(f"\n... and {len(races) - MAX_RACES} more in the JSON report.")
    out.append("")
    return out


def _divergence(div: Optional[Divergence], trial: int) -> List[str]:
    """The first divergence (``harness.oracle.divergence.Divergence``), seen in ``trial``."""
    out = ["## First divergence", ""]
    if div is None:
        return out + ["None: every value that reached the host matched the synchronous "
                      "reference.", ""]
    if div.stale:
        out.append(f"Trial {trial}: **stale `{div.kind}`** for request {div.rid}, step "
                   f"{div.step}, at {div.where} (stream `{div.stream}`).")
    else:
        out.append(f"Trial {trial}: **{div.kind}** -- {_code(div.message)}")
    out += ["", "| | value |", "|---|---|",
            f"| expected (synchronous reference) | {_code(div.expected)} |",
            f"| observed | {_code(div.observed)} |"]
    if isinstance(div.observed, int) and div.observed in (0x5A5A5A5A, 0x5A5A5A5A5A5A5A5A):
        out += ["", "The observed value is the simulator's uninitialised-memory fill "
                "(0x5A5A...): the host read memory no kernel had written yet."]
    return out + [""]


def _trials(trials: List[Any]) -> List[str]:
    """One row per trial (``TrialSummary``), the first ``MAX_TRIAL_ROWS``."""
    if not trials:
        return []
    out = ["## Trials", "", "| trial | seed | reproduced | divergence | races | values checked |",
           "|---:|---:|:---:|---|---:|---:|"]
    for tr in trials[:MAX_TRIAL_ROWS]:
        out.append(f"| {tr.trial + 1} | {tr.seed} | {'yes' if tr.reproduced else 'no'} | "
                   f"{tr.divergence or '-'} | {tr.races} | {tr.checked} |")
    if len(trials) > MAX_TRIAL_ROWS:
        out.append(f"\n({len(trials) - MAX_TRIAL_ROWS} more trials in the JSON report.)")
    return out + [""]


def _target_line(target: str, info: Dict[str, Any]) -> str:
    """The server the run drove, in its own description's words (``Target.describe``:
    ``{target}_version``, ``_tier``, ``_files_digest``, ``stood_in`` where it keeps one)."""
    version = info.get(f"{target}_version") or "(version not recorded)"
    tier = info.get(f"{target}_tier")
    digest = info.get(f"{target}_files_digest")
    facts = [f"{tier} tier" if tier else None,
             f"files digest `{digest}`" if digest else "no files digest recorded"]
    if "stood_in" in info:
        facts.append("stood in for: " + (", ".join(map(str, info.get("stood_in") or []))
                                          or "nothing"))
    changed = info.get(f"{target}_changed_files") or []
    if changed:
        facts.append(f"{len(changed)} file(s) not as the release shipped them: "
                     + ", ".join(f"`{c}`" for c in changed[:5]))
    doc = f"docs/{target}-target.md"
    ours = (f" What is upstream's and what is specrace's (its stand-ins): `{doc}`."
            if os.path.exists(os.path.join(REPO_ROOT, doc)) else "")
    return (f"Target: installed **{target} {version}** ({'; '.join(f for f in facts if f)})."
            f" Upstream frames are named `{target}/...`, relative to the install.{ours}")


def _context(context: Dict[str, Any], paths: Dict[str, Optional[str]]) -> List[str]:
    """What the caller knew beyond the run: the server flags that reach this
    configuration, and the known races it matched, each linked to its write-up."""
    out: List[str] = []
    flags = context.get("configuration") or []
    if flags:
        out += ["Server configuration that reaches this run: "
                + " ".join(f"`{f}`" for f in flags), ""]
    known = context.get("known") or []
    folder = os.path.dirname(paths.get("markdown") or paths.get("json") or "") or "."
    for k in known:
        state = (f" -- **a regression**: fixed in {k.get('fixed_in')}" if k.get("regression")
                 else " (settled: not a bug)" if k.get("kind") == "settled" else "")
        out.append(f"Known race: {repo_link(str(k.get('writeup', '')), str(k.get('title')), folder)}"
                   f"{state}.")
    return out + ([""] if known else [])


def repo_link(path: str, text: str, folder: str) -> str:
    """A Markdown link from a file in ``folder`` to ``path`` in specrace's tree (an anchor
    kept): relative when the file lies in the tree, so it follows a clone; else the path
    named as specrace's (a report written outside the tree, a CI artifact, has no tree
    beside it to link into)."""
    page, _, anchor = path.partition("#")
    here = os.path.abspath(folder)
    if not (here + os.sep).startswith(REPO_ROOT + os.sep):
        return f"{text} (specrace's `{path}`)"
    rel = os.path.relpath(os.path.join(REPO_ROOT, page), here)
    return f"[{text}]({rel}{'#' + anchor if anchor else ''})"
