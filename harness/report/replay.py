"""``specrace replay REPORT.json``: re-run a report's parameters and compare the verdict.

The file is untrusted input: it must be a regular file of at most 20 MB, it is parsed as
JSON only (nothing in it is imported, evaluated or unpickled), validated against
``schema.REPORT_SCHEMA``, and its scenario, variant and policy must name things this
checkout knows; its recorded schedule, if any, is decoded under the caps of
``harness.policies.schedule``. Every failure is a ``ValueError`` with a one-line message.

Compared: the number of reproducing trials, the first divergence (kind, request, step,
observed value) and the set of race sites (kind + both accesses' file:line). On the
simulator a replay is identical by construction; on CUDA it is a fresh sample.

``--schedule`` (``replay_report(.., schedule=True)``) re-runs only the trial the report
shows, from its recorded choices instead of the policy's seed, and compares that trial's
verdict -- and the choices themselves: the run must take exactly the recorded ones.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import stat
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from .text import printable

MAX_BYTES = 20 * 1024 * 1024
MAX_MSG = 300

__all__ = ["replay_report", "load_report", "LoadedReport", "RecordedTrial", "verdict_of",
           "MAX_BYTES"]


@dataclass(frozen=True)
class RecordedTrial:
    """A report's recorded schedule: trial ``trial`` replayed from its choices."""
    trial: int
    policy: Any  # harness.policies.Recorded: the trial's policy's idle rule + the choices
    result: Dict[str, Any]  # that trial's own verdict, as ``verdict_of`` reads it


@dataclass(frozen=True)
class LoadedReport:
    """A validated report, its policy parsed once (None: recorded on CUDA) and its
    recorded schedule decoded (None: none recorded)."""
    doc: Dict[str, Any]
    policy: Any
    schedule: Optional[RecordedTrial]


def _one_line(text: Any, limit: int = MAX_MSG) -> str:
    s = printable(re.sub(r"[\x00-\x1f\x7f]+", " ", str(text)).strip())
    return s if len(s) <= limit else s[:limit - 3] + "..."


def _display(path: Any) -> str:
    return _one_line(os.path.basename(str(path)) or str(path), 120)


def _read(path: Any) -> bytes:
    name = _display(path)
    try:
        p = os.fspath(path)
    except TypeError:
        raise ValueError(f"cannot read report: not a path ({type(path).__name__})") from None
    try:
        # O_NONBLOCK: opening a FIFO must not hang; fstat below rejects it anyway.
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ValueError(f"cannot read {name}: {_one_line(reason)}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise ValueError(f"cannot read {name}: {kind}")
        if st.st_size > MAX_BYTES:
            raise ValueError(f"cannot read {name}: {st.st_size} bytes is over the "
                             f"{MAX_BYTES // (1024 * 1024)} MB limit for a report")
        chunks: List[bytes] = []
        total = 0
        while True:
            try:
                chunk = os.read(fd, 1 << 20)
            except OSError as exc:
                raise ValueError(f"cannot read {name}: {_one_line(exc.strerror or exc)}") from None
            if not chunk:
                break
            total += len(chunk)
            if total > MAX_BYTES:  # grew while we read it
                raise ValueError(f"cannot read {name}: over the "
                                 f"{MAX_BYTES // (1024 * 1024)} MB limit for a report")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _reject_constant(token: str) -> Any:
    raise ValueError(f"non-standard JSON constant {token}")


def load_report(path: Any) -> LoadedReport:
    """Read, parse and validate a report; ``ValueError`` (one line) if it is not one."""
    import jsonschema

    from .schema import REPORT_SCHEMA

    name = _display(path)
    data = _read(path)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{name}: not valid JSON (not UTF-8 text at byte {exc.start})") from None
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name}: not valid JSON (line {exc.lineno}: {_one_line(exc.msg, 80)})"
                         ) from None
    except ValueError as exc:
        raise ValueError(f"{name}: not valid JSON ({_one_line(exc, 80)})") from None
    except RecursionError:
        raise ValueError(f"{name}: not valid JSON (nested too deeply)") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{name}: not a specrace report: expected a JSON object, got "
                         f"{_json_type(doc)}")
    validator = jsonschema.Draft202012Validator(REPORT_SCHEMA)
    try:
        errors = sorted(validator.iter_errors(doc), key=_error_order)
    except RecursionError:
        raise ValueError(f"{name}: not a specrace report (nested too deeply)") from None
    if errors:
        raise ValueError(f"{name}: not a specrace report: {_describe(errors[0])}")
    if doc["reproduced"] > doc["trials"]:
        raise ValueError(f"{name}: not a specrace report: 'reproduced' ({doc['reproduced']}) "
                         f"is more than 'trials' ({doc['trials']})")
    policy = _check_names(doc, name)
    return LoadedReport(doc, policy, _recorded_trial(doc, policy, name))


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def _error_order(err) -> Tuple[int, int, str]:
    # Shallow errors first, "missing key" before "wrong value", then by path.
    return (len(err.absolute_path), 0 if err.validator == "required" else 1,
            "/".join(str(p) for p in err.absolute_path))


def _where(err) -> str:
    parts = []
    for p in err.absolute_path:
        parts.append(f"[{p}]" if isinstance(p, int) else (("." if parts else "") + str(p)))
    return _one_line("".join(parts), 80)


def _describe(err) -> str:
    where = _where(err)
    at = f" in '{where}'" if where else ""
    v = err.validator
    if v == "required":
        missing = [k for k in err.validator_value if k not in err.instance]
        return f"missing {_one_line(repr(missing[0]), 60)}{at}" if missing else f"missing key{at}"
    if v == "const" and where == "specrace_report":
        return (f"unsupported format version {_one_line(repr(err.instance), 40)} "
                f"(specrace_report must be {err.validator_value})")
    if v == "type":
        names = {"integer": "an integer", "number": "a number", "string": "a string",
                 "null": "null", "object": "an object", "array": "an array",
                 "boolean": "a boolean"}
        want = err.validator_value
        want = " or ".join(names.get(w, w) for w in (want if isinstance(want, list) else [want]))
        return f"'{where}' must be {want}, not {_json_type(err.instance)}"
    if v == "enum":
        return (f"'{where}' must be one of {', '.join(map(str, err.validator_value))}, not "
                f"{_one_line(repr(err.instance), 40)}")
    if v in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return f"'{where}' = {_one_line(repr(err.instance), 40)} is out of range"
    if v in ("maxLength", "minLength"):
        return f"'{where}' has a bad length"
    return _one_line(f"{err.message}{at}", 160)


def _check_names(doc: Dict[str, Any], name: str) -> None:
    import targets
    from scenarios.registry import SCENARIOS

    scen = SCENARIOS.get(doc["scenario"])
    if scen is None:
        raise ValueError(f"{name}: unknown scenario {_one_line(repr(doc['scenario']), 80)}; "
                         f"known: {', '.join(sorted(SCENARIOS))}")
    if doc["variant"] not in scen.variants:
        raise ValueError(f"{name}: unknown variant {_one_line(repr(doc['variant']), 80)} for "
                         f"{scen.name}; expected one of: {', '.join(scen.variants)}")
    try:
        target = targets.get(doc.get("target", "impl"))
    except targets.TargetError as exc:
        raise ValueError(f"{name}: recorded on target {doc.get('target')}, which cannot run "
                         f"here: {_one_line(exc, 200)}") from None
    if not target.supports(scen.name):
        raise ValueError(f"{name}: scenario {scen.name} does not run on the {target.name} "
                         f"target")
    if doc["backend"] != "sim":
        return None
    from harness.policies import parse_policy
    try:
        return parse_policy(doc["policy"])
    except ValueError as exc:
        raise ValueError(f"{name}: {_one_line(exc, 200)}") from None


def _recorded_trial(doc: Dict[str, Any], policy: Any, name: str) -> Optional[RecordedTrial]:
    """The report's schedule, decoded and checked against the report it sits in."""
    block = doc.get("schedule")
    if block is None:
        return None
    from harness.policies import Recorded
    from harness.policies.schedule import decode_choices
    bad = f"{name}: not a specrace report: 'schedule'"
    if policy is None:
        raise ValueError(f"{bad}: a schedule is recorded on the simulator only")
    if block["trial"] >= doc["trials"]:
        raise ValueError(f"{bad}: trial {block['trial']} of a {doc['trials']}-trial run")
    if block["policy"] != str(policy.offset(block["trial"])):
        raise ValueError(f"{bad}: recorded under {_one_line(repr(block['policy']), 60)}, "
                         f"not trial {block['trial']}'s policy {policy.offset(block['trial'])}")
    try:
        choices = decode_choices(block["choices"])
    except ValueError as exc:
        raise ValueError(f"{bad}: {_one_line(exc, 200)}") from None
    if len(choices) != block["count"]:
        raise ValueError(f"{bad}: {len(choices)} choices, not the {block['count']} it says")
    base = policy.offset(block["trial"])  # the same spelling, checked above: no second parse
    return RecordedTrial(block["trial"], Recorded(base, choices), block["result"])


# --- the verdict and its comparison -------------------------------------------------------

def _norm(v: Any) -> Any:
    return json.loads(json.dumps(v, default=str))


def verdict_of(result: Dict[str, Any]) -> Dict[str, Any]:
    """What replay compares, from a report or a fresh result."""
    div = result.get("first_divergence")
    first = None
    if isinstance(div, dict):
        first = {k: _norm(div.get(k)) for k in ("kind", "rid", "step", "observed")}
    sites = set()
    for r in result.get("races") or []:
        a, b = r.get("first") or {}, r.get("second") or {}
        sites.add((str(r.get("kind")), f"{a.get('file')}:{a.get('line')}",
                   f"{b.get('file')}:{b.get('line')}"))
    return {"reproduced": int(result.get("reproduced") or 0),
            "trials": int(result.get("trials") or 0),
            "first_divergence": first,
            "race_sites": [list(s) for s in sorted(sites)]}


def _div_text(d: Optional[Dict[str, Any]]) -> str:
    if not d:
        return "none"
    return _one_line(f"{d['kind']} (request {d['rid']}, step {d['step']}, observed "
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
    n = len(b)
    if not diffs:
        return True, (f"replay: identical verdict (reproduced {replayed['reproduced']}/"
                      f"{replayed['trials']}, {n} race site{'s' if n != 1 else ''})")
    return False, _one_line("replay: DIFFERENT verdict: " + "; ".join(diffs), 400)


def replay_report(source: Any, progress: Optional[Callable[..., None]] = None,
                  schedule: bool = False) -> Dict[str, Any]:
    """Re-run the report at ``source`` (a path, or a ``LoadedReport``); ``progress(done,
    total)`` after each trial. ``schedule``: the shown trial only, from its choices."""
    report = source if isinstance(source, LoadedReport) else load_report(source)
    doc = report.doc
    from harness.oracle.repro import ReproConfig, run_repro
    from harness.runtime import cuda_available
    from scenarios.registry import SCENARIOS

    if doc["backend"] == "cuda" and not cuda_available():
        cmd = " ".join(shlex.quote(str(p)) for p in (
            "specrace", "repro", doc["scenario"], "--target", doc.get("target", "impl"),
            "--variant", doc["variant"], "--war-barrier", doc["war_barrier"], "--backend",
            "sim", "--trials", doc["trials"], "--seed", doc["seed"]))
        raise ValueError(f"report was recorded on cuda; this machine has no GPU (use "
                         f"--backend sim to reproduce on the simulator: {_one_line(cmd, 200)})")
    scenario = SCENARIOS[doc["scenario"]]
    common = dict(scenario=doc["scenario"], variant=doc["variant"],
                  war_barrier=doc["war_barrier"], backend=doc["backend"],
                  stall_ms=float(doc["stall_ms"]) if doc["stall_ms"] is not None else None,
                  expect=doc["expect"], target=doc.get("target", "impl"))
    rec = report.schedule
    if schedule:
        if rec is None:
            raise ValueError("this report carries no recorded schedule (recorded on CUDA, or "
                             "written before schedules were recorded): replay it by seed")
        # trial t ran workload seed + t; its policy is the recorded choices
        cfg = ReproConfig(**common, policy=rec.policy, trials=1, seed=int(doc["seed"]) + rec.trial)
        original = verdict_of(rec.result)
    else:
        cfg = ReproConfig(**common, policy=report.policy, trials=int(doc["trials"]),
                          seed=int(doc["seed"]))
        original = verdict_of(doc)
    if progress is not None:
        progress(0, cfg.trials)
    outcome = run_repro(cfg, scenario, progress)
    replayed = verdict_of(outcome.result)
    same, summary = compare(original, replayed)
    if schedule:
        same, summary = _same_choices(rec, outcome.result["schedule"], same, summary)
    env = doc.get("environment")
    recorded = env.get("source_digest") if isinstance(env, dict) else None
    code_changed = None
    if isinstance(recorded, str):
        from . import source_digest
        code_changed = recorded != source_digest()
        if not same and code_changed:
            summary += " (note: impl/, harness/ or scenarios/ changed since the report was written)"
    recorded_target = doc.get("target_info")
    if isinstance(recorded_target, dict) and recorded_target.get("sglang_files_digest"):
        now = outcome.result.get("target_info") or {}
        if recorded_target.get("sglang_files_digest") != now.get("sglang_files_digest"):
            code_changed = True
            summary += (f" (note: the installed sglang differs from the one recorded: "
                        f"{_one_line(recorded_target.get('sglang_version'), 40)} -> "
                        f"{_one_line(now.get('sglang_version'), 40)})")
    return {"same": same, "summary": summary, "original": original, "replayed": replayed,
            "backend": doc["backend"], "code_changed": code_changed,
            "from": "schedule" if schedule else "seed"}


def _same_choices(rec: RecordedTrial, ran: Dict[str, Any], same: bool,
                  summary: str) -> Tuple[bool, str]:
    """A schedule replay is identical only if the run took exactly the recorded choices."""
    from harness.policies.schedule import decode_choices
    want, got = rec.policy.choices, decode_choices(ran["choices"])
    where = f"trial {rec.trial} from its recorded schedule ({len(want)} choices)"
    if got == want:
        return same, summary.replace("replay:", f"replay of {where}:", 1)
    at = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    return False, _one_line(f"replay of {where}: DIFFERENT schedule: the run left the "
                            f"recorded choices at choice {at + 1} ({len(got)} taken); "
                            + summary.replace("replay: ", "", 1), 400)
