"""Reading a report back: ``load_report(path)`` -> ``LoadedReport``.

The file is untrusted input: it must be a regular file of at most 20 MB, it is parsed as
JSON only (nothing in it is imported, evaluated or unpickled), validated against
``schema.REPORT_SCHEMA``, read into a typed ``document.Report`` (the one reader of its
keys), and its scenario, variant and policy must name things this checkout knows; its
recorded schedules, if any, are decoded last, under the caps of ``Schedule.decode``
(``harness.runtime.policy``). Every failure is a ``ValueError`` with a one-line message.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
from dataclasses import dataclass
from typing import Any, List

from harness.report import bounded
from seams.text import printable
from seams.vocab import Backend

MAX_BYTES = 20 * 1024 * 1024
MAX_MSG = 300

__all__ = ["load_report", "LoadedReport", "one_line", "MAX_BYTES"]


@dataclass(frozen=True)
class LoadedReport:
    """A validated report, typed (``document.Report``): its policy parsed once (None:
    recorded on CUDA) and its recorded schedules decoded into one replayable policy
    (None: none recorded)."""
    report: Any  # harness.report.document.Report
    policy: Any  # harness.policies.SchedulePolicy
    schedules: Any  # harness.policies.Schedules
    # the content no longer matches its run id (True), it does (False), no run id (None)
    edited: Any = None
    keys: frozenset = frozenset()  # the document's top-level keys (older reports lack some)

    @property
    def result(self) -> Any:  # harness.trials.results.ReproResult
        return self.report.result


def one_line(text: Any, limit: int = MAX_MSG) -> str:
    s = printable(re.sub(r"[\x00-\x1f\x7f]+", " ", str(text)).strip())
    return s if len(s) <= limit else s[:limit - 3] + "..."


def _display(path: Any) -> str:
    return one_line(os.path.basename(str(path)) or str(path), 120)


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
        raise ValueError(f"cannot read {name}: {one_line(reason)}") from None
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
                raise ValueError(f"cannot read {name}: {one_line(exc.strerror or exc)}") from None
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


def load_report(path: Any) -> LoadedReport:
    """Read, parse and validate a report; ``ValueError`` (one line) if it is not one."""
    import jsonschema

    from harness.report.schema import REPORT_SCHEMA

    name = _display(path)
    data = _read(path)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{name}: not valid JSON (not UTF-8 text at byte {exc.start})") from None
    try:
        doc = bounded.parse(data, text)
    except bounded.TooBig as exc:
        raise ValueError(f"{name}: not a specrace report: {exc} (the limit for a report)"
                         ) from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name}: not valid JSON (line {exc.lineno}: {one_line(exc.msg, 80)})"
                         ) from None
    except ValueError as exc:
        raise ValueError(f"{name}: not valid JSON ({one_line(exc, 80)})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{name}: not a specrace report: expected a JSON object, got "
                         f"{_json_type(doc)}")
    # The first error is the answer: validation stops there (collecting every error of a
    # crafted file is unbounded work). The schema lists cheap checks (required keys,
    # types, list lengths) before the per-item ones, so the first is a shallow one.
    error = next(jsonschema.Draft202012Validator(REPORT_SCHEMA).iter_errors(doc), None)
    if error is not None:
        raise ValueError(f"{name}: not a specrace report: {_describe(error)}")
    from harness.report.document import Report, content_id
    # the one reader of a report's keys; the schedules (the costliest to decode) are
    # decoded last, so a report with other faults is told those first
    report = Report.from_json({k: v for k, v in doc.items() if k != "schedules"})
    result = report.result
    _check_derived(doc, result, f"{name}: not a specrace report")
    policy = _check_names(result, name)
    edited = None if report.run_id is None else content_id(doc) != report.run_id
    schedules = _schedules(doc.get("schedules"), result, policy, name)
    if schedules is not None:
        result = dataclasses.replace(result, schedules=list(schedules.per_trial))
        report = dataclasses.replace(report, result=result)
    return LoadedReport(report, policy, schedules, edited, frozenset(doc))


def _check_derived(doc: dict, result: Any, bad: str) -> None:
    """What a run derives from its own figures must follow from them: an edited figure
    is refused here, not replayed as if the report said it (``from_json`` reads none of
    these; they are for people and scripts)."""
    if result.reproduced > result.trials:
        raise ValueError(f"{bad}: 'reproduced' ({result.reproduced}) is more than 'trials' "
                         f"({result.trials})")
    rows = result.trial_results
    if rows:
        if len(rows) != result.trials:
            raise ValueError(f"{bad}: 'trial_results' has {len(rows)} rows for "
                             f"{result.trials} trials")
        for i, row in enumerate(rows):
            if row.trial != i or row.seed != result.seed + i:
                raise ValueError(f"{bad}: 'trial_results[{i}]' is not trial {i} of seed "
                                 f"{result.seed} (trial {row.trial}, seed {row.seed})")
        if sum(r.reproduced for r in rows) != result.reproduced:
            raise ValueError(f"{bad}: 'reproduced' ({result.reproduced}) is not the number "
                             f"of reproducing rows in 'trial_results'")
        first = next((r.trial for r in rows if r.reproduced), None)
        if "first_trial" in doc and result.first_trial != first:
            raise ValueError(f"{bad}: 'first_trial' is not the first reproducing trial")
    derived = {"outcome": result.outcome, "rate": result.rate,
               "matches_expectation": result.matches_expectation,
               "traced_trials": result.traced_trials if rows else doc.get("traced_trials")}
    for key, want in derived.items():
        if key in doc and doc[key] != want:
            raise ValueError(f"{bad}: {key!r} ({_short(doc[key])}) does not follow from the "
                             f"report's figures ({_short(want)})")


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


def _where(err) -> str:
    parts = []
    for p in err.absolute_path:
        parts.append(f"[{p}]" if isinstance(p, int) else (("." if parts else "") + str(p)))
    return one_line("".join(parts), 80)


def _describe(err) -> str:
    where = _where(err)
    at = f" in '{where}'" if where else ""
    v = err.validator
    if v == "required":
        missing = [k for k in err.validator_value if k not in err.instance]
        return f"missing {_short(missing[0])}{at}" if missing else f"missing key{at}"
    if v == "const" and where == "specrace_report":
        return (f"unsupported format version {_short(err.instance)} "
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
                f"{_short(err.instance)}")
    if v == "const":
        return f"'{where}' must be {err.validator_value!r}, not {_short(err.instance)}"
    if v in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return f"'{where}' = {_short(err.instance)} is out of range"
    if v in ("maxLength", "minLength"):
        return f"'{where}' has a bad length"
    if v == "maxItems":
        return f"'{where}' has more than {err.validator_value} items"
    if v == "minItems":
        return f"'{where}' has fewer than {err.validator_value} items"
    if v == "maxProperties":
        return f"'{where}' has more than {err.validator_value} keys"
    if v == "pattern":
        return f"'{where}' is not in the expected form"
    # never ``err.message``: it quotes the whole instance, which may be the whole file
    return f"'{where or '(the report)'}' fails the schema's {one_line(v, 40)!r} rule"


def _short(value: Any) -> str:
    """A bounded repr of a value from the file (reprlib cuts long strings and lists)."""
    import reprlib
    r = reprlib.Repr()
    r.maxstring, r.maxother, r.maxlevel = 40, 40, 3
    return one_line(r.repr(value), 60)


def _check_names(result: Any, name: str) -> Any:
    import targets
    from scenarios.registry import get

    try:
        scen = get(result.scenario)
    except KeyError as exc:  # the registry's own message: close matches, kept short
        raise ValueError(f"{name}: {one_line(str(exc.args[0]), 200)}") from None
    if result.variant not in scen.variants:
        raise ValueError(f"{name}: unknown variant {one_line(repr(result.variant), 80)} for "
                         f"{scen.name}; expected one of: {', '.join(scen.variants)}")
    try:
        target = targets.declared(result.target)
        if not _in_its_own_release(result, target):
            target = targets.get(result.target)
    except targets.TargetError as exc:
        raise ValueError(f"{name}: recorded on target {result.target}, which cannot run "
                         f"here: {one_line(exc, 200)}") from None
    if not target.supports(scen.name):
        raise ValueError(f"{name}: scenario {scen.name} does not run on the {target.name} "
                         f"target")
    if result.backend != Backend.SIM:
        return None
    from harness.policies import parse_policy
    try:
        return parse_policy(result.policy)
    except ValueError as exc:
        raise ValueError(f"{name}: {one_line(exc, 200)}") from None


def _in_its_own_release(result: Any, target: Any) -> bool:
    """Does the report replay in its release's environment (a release of an upstream
    server this interpreter does not have)? Then that interpreter loads the target and
    checks the report again; this one need not import the server at all."""
    if target.environments() is None:
        return False
    info = result.target_info if isinstance(result.target_info, dict) else {}
    was = info.get(f"{target.name}_version")
    # as parsed versions: "v0.17.0" is 0.17.0 (specrace.replay.release_python agrees)
    from targets.tiers import same_version
    return isinstance(was, str) and not same_version(was, target.installed_version())


def _schedules(texts: Any, result: Any, policy: Any, name: str) -> Any:
    """The report's recorded schedules (their text form), decoded (one budget for all
    trials) and checked against the report they sit in: one replayable policy."""
    if texts is None:
        return None
    from harness.policies import Schedules
    from harness.runtime.policy import decode_schedules
    bad = f"{name}: not a specrace report: 'schedules'"
    if policy is None:
        raise ValueError(f"{bad}: schedules are recorded on the simulator only")
    if len(texts) != result.trials:
        raise ValueError(f"{bad}: {len(texts)} recorded for {result.trials} trials")
    try:
        per_trial = decode_schedules(texts)  # None: that trial never ran
    except ValueError as exc:
        raise ValueError(f"{bad}{one_line(exc, 200)}") from None
    return Schedules(policy, per_trial)
