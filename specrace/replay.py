"""``specrace replay REPORT.json``: re-run a report and compare the verdict.

The report is read by ``load.load_report`` (untrusted input: validated, one-line errors).
A replay re-runs every trial of the report, either

* ``from="schedule"`` (the default when the report recorded schedules: simulator reports)
  -- each trial gives its recorded choices back to the device (``policies.Schedules``),
  so no policy seed is needed; the run must take exactly the recorded choices, and a
  run that leaves them (the code changed, the report was edited) is told as such, with
  the trial and the choice where it left; or
* ``from="seed"`` -- the policy is drawn again from its seed (CUDA reports: a fresh
  sample of the GPU's schedule).

Every recorded field is either an *input* of the re-run or *compared* with it, so an
edited report cannot come out "identical":

* inputs: scenario, target, variant, war_barrier, backend, policy / schedules, stall_ms,
  stall_plan, host_order, seed, trials, expect;
* compared (simulator: all of them; CUDA, a fresh sample: the first four): the number of
  reproducing trials, the first divergence (kind, request, step, observed value; on the
  simulator every field), the set of race sites (kind + both accesses' file:line), the
  trace digest of the shown trial; on the simulator also every race's details, every
  trial's row (seed, reproduced, divergence kind, race count, values checked), the first
  trial and the expected verdict of the variant; the target's description (version,
  digest of the driven files) on both;
* checked at load: the derived figures (outcome, rate, ...) follow from the rest;
  the run id is a digest of the whole document, so any other edit (the environment, the
  command) is told as "EDITED report" -- as is an edit of the inputs above, which the
  re-run nevertheless honours;
* not compared: wall-clock times (``ms``, ``median_trial_ms``) and the environment.

Bounded: a report asking for more than ``max_trials`` trials (default
``DEFAULT_MAX_TRIALS``) is refused before any trial runs, and a replay past its
wall-clock ``budget_s`` (default ``DEFAULT_BUDGET_S``) stops after the trial it is in;
both are a one-line ``ValueError``.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from harness.runtime.policy import Schedule
from harness.runtime.trace import frame_text

from specrace.load import MAX_BYTES, LoadedReport, load_report, one_line

__all__ = ["replay_report", "load_report", "LoadedReport", "verdict_of", "MAX_BYTES",
           "SOURCES"]

SOURCES = ("schedule", "seed")  # what a replay re-runs from
DEFAULT_MAX_TRIALS = 1_000  # more: ask for it (--max-trials); the schema allows MAX_TRIALS
DEFAULT_BUDGET_S = 600.0  # wall clock, checked between trials (--budget-s)


# --- the verdict and its comparison -------------------------------------------------------

def verdict_of(result: Any) -> Dict[str, Any]:
    """What replay compares, from a ``ReproResult`` (a report's or a fresh run's); on the
    simulator (deterministic) every detail, on CUDA (a fresh sample) the identity."""
    div = result.first_divergence
    sites = {(r.kind, _place(r.first), _place(r.second)) for r in result.races}
    out = {"reproduced": result.reproduced, "trials": result.trials,
           "first_divergence": None if div is None else div.identity(),
           "race_sites": [list(s) for s in sorted(sites)],
           "target_info": dict(result.target_info)}
    if result.backend == "sim":
        out["details"] = {
            "first_divergence": None if div is None else div.to_json(),
            "races": sorted(json.dumps(r.to_json(), sort_keys=True, default=str)
                            for r in result.races),
            "trial_results": [[t.trial, t.seed, t.reproduced, t.divergence, t.races,
                               t.checked] for t in result.trial_results],
            "first_trial": result.first_trial,
            "expected_by_scenario": result.expected_by_scenario}
    return out


def _place(acc: Any) -> str:
    return frame_text(acc.frame, missing="unknown site", function=False)


def _div_text(d: Optional[Dict[str, Any]]) -> str:
    if not d:
        return "none"
    return one_line(f"{d['kind']} (request {d['rid']}, step {d['step']}, observed "
                     f"{d['observed']})", 100)


def compare(original: Dict[str, Any], replayed: Dict[str, Any]) -> Tuple[bool, str]:
    diffs = []
    if (original["reproduced"], original["trials"]) != (replayed["reproduced"],
                                                        replayed["trials"]):
        diffs.append(f"reproduced {original['reproduced']}/{original['trials']} -> "
                     f"{replayed['reproduced']}/{replayed['trials']}")
    if original["first_divergence"] != replayed["first_divergence"]:
        diffs.append(f"first divergence {_div_text(original['first_divergence'])} -> "
                     f"{_div_text(replayed['first_divergence'])}")
    a = {tuple(s) for s in original["race_sites"]}
    b = {tuple(s) for s in replayed["race_sites"]}
    if a != b:
        new, gone = sorted(b - a), sorted(a - b)
        bits = []
        if new:
            bits.append(f"{len(new)} new (e.g. {new[0][0]} {new[0][1]} -> {new[0][2]})")
        if gone:
            bits.append(f"{len(gone)} gone (e.g. {gone[0][0]} {gone[0][1]} -> {gone[0][2]})")
        diffs.append("race sites: " + ", ".join(bits))
    if original.get("target_info") != replayed.get("target_info"):
        diffs.append("the target's description (version, digest of the driven files)")
    if not diffs and "details" in original:
        # the same identity, but some detail differs: name the first
        for key, label in (("first_divergence", "first divergence details"),
                           ("races", "race details (counts, storages, ops)"),
                           ("trial_results", "per-trial results"),
                           ("first_trial", "first trial"),
                           ("expected_by_scenario", "expected verdict of the variant")):
            if original["details"][key] != replayed.get("details", {}).get(key):
                diffs.append(label)
    n = len(b)
    if not diffs:
        return True, (f"replay: identical verdict (reproduced {replayed['reproduced']}/"
                      f"{replayed['trials']}, {n} race site{'s' if n != 1 else ''})")
    return False, one_line("replay: DIFFERENT verdict: " + "; ".join(diffs), 400)


def replay_report(source: Any, progress: Optional[Callable[..., None]] = None,
                  from_: Optional[str] = None, max_trials: Optional[int] = None,
                  budget_s: Optional[float] = None) -> Dict[str, Any]:
    """Re-run the report at ``source`` (a path, or a ``LoadedReport``); ``progress(done,
    total)`` after each trial. ``from_``: ``"schedule"`` or ``"seed"`` (None: the recorded
    schedules when the report has them, else the seed). ``max_trials`` / ``budget_s``:
    the bounds (None: ``DEFAULT_MAX_TRIALS`` / ``DEFAULT_BUDGET_S``)."""
    loaded = source if isinstance(source, LoadedReport) else load_report(source)
    from_ = replay_source(loaded, from_)
    check_bounds(loaded, max_trials)
    from harness.trials.repro import run_repro

    old = loaded.result
    run = _rerun(loaded, from_)
    new = run_repro(run, _budgeted(progress, run.trials, budget_s))
    original, replayed = verdict_of(old), verdict_of(new)
    same, summary = compare(original, replayed)
    same, summary = _with_notes(loaded, from_, new, same, summary)
    code_changed, summary = _source_change(loaded, same, summary)
    if not same:
        summary = _version_change(old, new, summary)
    return {"same": same, "summary": summary, "original": original, "replayed": replayed,
            "backend": old.backend, "code_changed": code_changed, "from": from_}


def _rerun(loaded: LoadedReport, from_: str) -> Any:
    """The report's run resolved again, its inputs as recorded (``ValueError``, one line,
    for a CUDA report on a machine without a GPU)."""
    from harness.runtime import cuda_available
    from scenarios.resolve import RunRequest, resolve

    old = loaded.result
    if old.backend == "cuda" and not cuda_available():
        raise ValueError(f"report was recorded on cuda; this machine has no GPU (use "
                         f"--backend sim to reproduce on the simulator: "
                         f"{one_line(old.repro_command(backend='sim'), 200)})")
    sim = old.backend == "sim"
    return resolve(RunRequest(
        scenario=old.scenario, variant=old.variant, war_barrier=old.war_barrier,
        backend=old.backend,
        policy=(loaded.schedules if from_ == "schedule" else loaded.policy) if sim else None,
        stall_ms=float(old.stall_ms) if old.stall_ms is not None else None,
        trials=old.trials, seed=old.seed, expect=old.expect, target=old.target,
        stall_plan=list(old.stall_plan) if "stall_plan" in loaded.keys else None,
        host_order=dict(old.host_order) if "host_order" in loaded.keys else None,
        load=old.load, platform=old.platform, detect=old.detected))


def _notes(loaded: LoadedReport, from_: str, new: Any) -> List[str]:
    """What the re-run did other than the report beside the verdict: it left the recorded
    schedule, or its shown trial's trace differs."""
    notes = []
    if from_ == "schedule":
        left = _left_schedule(loaded.schedules.per_trial, new.schedules)
        if left:
            notes.append(left)
    report = loaded.report
    if report.trace_digest and new.trace is not None:
        from harness.report import python_hash_seed
        from harness.report.chrome import trace_digest
        if trace_digest(new.trace, new.trace_races) != report.trace_digest:
            recorded, now = report.environment.get("python_hash_seed"), python_hash_seed()
            notes.append("DIFFERENT trace: the shown trial's trace differs from the report's"
                         + (f" (recorded under PYTHONHASHSEED={one_line(str(recorded), 20)}, "
                            f"replayed under {now})"
                            if recorded is not None and recorded != now else ""))
    return notes


def _with_notes(loaded: LoadedReport, from_: str, new: Any, same: bool,
                summary: str) -> Tuple[bool, str]:
    """The verdict and its summary with the notes (any makes it different), the number of
    recorded choices replayed, and an edited report told."""
    notes = _notes(loaded, from_, new)
    if same and from_ == "schedule":
        n = sum(len(c) for c in loaded.schedules.per_trial if c is not None)
        summary += f", from the recorded schedules ({n} choices)"
    if notes:
        same = False
        rest = summary.replace("replay: ", "", 1)
        summary = one_line("replay: " + "; ".join(notes) + "; " + rest, 400)
    if loaded.edited:  # last: what the re-run found comes first
        same = False
        summary = one_line(summary.replace("identical verdict", "same figures", 1)
                           + "; EDITED report: its content does not match its run id", 400)
    return same, summary


def _source_change(loaded: LoadedReport, same: bool,
                   summary: str) -> Tuple[Optional[bool], str]:
    """For a different verdict of a report that recorded its source digest: whether the
    source changed since (None: not asked), told in the summary when it did."""
    recorded = loaded.report.environment.get("source_digest")
    code_changed = None
    if not same and isinstance(recorded, str):
        from harness.report import source_digest
        code_changed = recorded != source_digest()
        if code_changed:
            summary = one_line(summary + " (the source changed since the report was written)",
                               400)
    return code_changed, summary


def _version_change(old: Any, new: Any, summary: str) -> str:
    """The summary of a different verdict, with the target's release where it moved."""
    key = f"{old.target}_version"
    was = old.target_info.get(key)
    if was:
        now = new.target_info.get(key)
        if now != was:
            summary = one_line(f"{summary} ({one_line(old.target, 20)} {one_line(was, 40)} "
                               f"-> {one_line(now, 40)})")
    return summary


def release_python(loaded: LoadedReport) -> Optional[str]:
    """The interpreter of the release environment a report must replay in, or None: this
    one (its target has one version, or this interpreter has the report's release --
    versions compared parsed: ``v0.17.0`` is 0.17.0). ``ValueError`` (one line) when the
    report's release is not set up here (replaying it on another release would compare
    two releases, not replay one), or when this process was itself handed the report
    (``seams.children.HOP``) and its environment still does not have the release (an
    environment whose metadata and folder name disagree): a hand-off is one hop, never a
    chain of interpreters."""
    import targets
    from seams import children
    from targets.tiers import same_version
    old = loaded.result
    try:
        target = targets.declared(old.target)
    except targets.TargetError as exc:
        raise ValueError(str(exc)) from None
    environments = target.environments()
    was = old.target_info.get(f"{target.name}_version")
    if environments is None or not isinstance(was, str):
        return None
    have = target.installed_version()
    if same_version(was, have):
        return None
    name, shown = target.name, one_line(was, 40)
    hop = children.handed_off()
    if hop is not None:
        raise ValueError(f"the report was recorded on {name} {shown}; it was handed to "
                         f"{name} {one_line(hop, 40)}'s environment, whose {name} is "
                         f"{one_line(have or 'not installed', 40)}: not handed on (one "
                         f"hop at most)")
    try:
        version = environments.chosen([was])[0]
    except ValueError as exc:
        raise ValueError(f"the report was recorded on {name} {shown}, which is not set up "
                         f"here ({exc})") from None
    python = environments.python(version)
    if os.path.realpath(sys.prefix) == os.path.realpath(os.path.dirname(
            os.path.dirname(python))):
        raise ValueError(f"the report was recorded on {name} {shown}; this is {name} "
                         f"{version}'s environment, whose {name} is "
                         f"{one_line(have or 'not installed', 40)}: set it up again "
                         f"(make upstream TARGET={name} ...)")
    return python


def hand_off(python: str, argv: List[str]) -> int:
    """Run ``specrace ARGV`` (a replay) by the release environment's interpreter
    ``python``: the working directory kept off its path, the hash seed pinned, and
    marked as the one hop it may take (``seams.children``). Its output is this command's,
    its exit status this command's status (``OSError`` where it cannot start)."""
    import subprocess
    from seams import children
    hop = os.path.basename(os.path.dirname(os.path.dirname(python)))
    cmd = children.command(python, "-m", "specrace.cli", *argv)
    return subprocess.run(cmd, env=children.env(hop=hop)).returncode


def check_bounds(loaded: LoadedReport, max_trials: Optional[int] = None) -> None:
    """Refuse, before any trial, a report asking for more trials than ``max_trials``."""
    cap = DEFAULT_MAX_TRIALS if max_trials is None else max_trials
    if loaded.result.trials > cap:
        raise ValueError(f"the report asks for {loaded.result.trials} trials; replay runs "
                         f"at most {cap} unless told more (--max-trials N)")


def _budgeted(progress: Optional[Callable[..., None]], trials: int,
              budget_s: Optional[float]) -> Callable[..., None]:
    """``progress``, and past the wall-clock budget a one-line ``ValueError`` after the
    trial that crossed it (the run's context managers close on the way out)."""
    budget = DEFAULT_BUDGET_S if budget_s is None else budget_s
    deadline = time.monotonic() + budget

    def tick(done: int, total: Optional[int] = None) -> None:
        if progress is not None:
            progress(done, total) if total is not None else progress(done)
        if 0 < done < trials and time.monotonic() > deadline:
            raise ValueError(f"replay stopped after {done}/{trials} trials: past its "
                             f"{budget:g} s budget (--budget-s)")
    tick(0, trials)
    return tick


def replay_source(report: LoadedReport, from_: Optional[str]) -> str:
    """What a replay re-runs from (``ValueError``, one line, if the report cannot)."""
    if from_ is None:
        return "schedule" if report.schedules is not None else "seed"
    if from_ not in SOURCES:
        raise ValueError(f"replay from {one_line(repr(from_), 40)}: expected one of "
                         f"{', '.join(SOURCES)}")
    if from_ == "schedule" and report.schedules is None:
        raise ValueError("this report recorded no schedules (it ran on CUDA, or was written "
                         "before schedules were recorded): replay it with --from seed")
    return from_


def _left_schedule(recorded: Tuple[Optional[Schedule], ...],
                   ran: List[Optional[Schedule]]) -> Optional[str]:
    """Where the replay left the recorded choices (None: every trial with recorded choices
    took exactly them)."""
    for trial, (want_s, got_s) in enumerate(zip(recorded, ran)):
        if want_s is None:  # nothing recorded: the trial replayed from the seed
            continue
        want, got = want_s.choices, (got_s or Schedule()).choices
        if got != want:
            at = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b),
                      min(len(want), len(got)))
            if at >= len(want):  # every recorded choice taken, and then more
                return (f"DIFFERENT schedule: trial {trial + 1} made {len(got) - len(want)} "
                        f"choice(s) past its {len(want)} recorded")
            return (f"DIFFERENT schedule: trial {trial + 1} left its recorded choices at "
                    f"choice {at + 1} of {len(want)} (the run made {len(got)})")
    return None
