"""Reading a report back: ``load_report(path)`` -> ``LoadedReport``.

The file is untrusted input: it must be a regular file of at most 20 MB, it is parsed as
JSON only (nothing in it is imported, evaluated or unpickled), validated against
``schema.REPORT_SCHEMA``, read into a typed ``document.Report`` (the one reader of its
keys), and its scenario, variant and policy must name things this checkout knows; its recorded schedules, if any, are decoded under the caps of
``harness.policies.schedule``. Every failure is a ``ValueError`` with a one-line message.
"""
from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from typing import Any, List, Tuple

from .text import printable

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

    @property
    def result(self) -> Any:  # harness.engine.results.ReproResult
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
        raise ValueError(f"{name}: not valid JSON (line {exc.lineno}: {one_line(exc.msg, 80)})"
                         ) from None
    except ValueError as exc:
        raise ValueError(f"{name}: not valid JSON ({one_line(exc, 80)})") from None
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
    from .document import Report
    report = Report.from_json(doc)  # the one reader of a report's keys
    result = report.result
    if result.reproduced > result.trials:
        raise ValueError(f"{name}: not a specrace report: 'reproduced' ({result.reproduced}) "
                         f"is more than 'trials' ({result.trials})")
    policy = _check_names(result, name)
    return LoadedReport(report, policy, _schedules(result, policy, name))


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
    return one_line("".join(parts), 80)


def _describe(err) -> str:
    where = _where(err)
    at = f" in '{where}'" if where else ""
    v = err.validator
    if v == "required":
        missing = [k for k in err.validator_value if k not in err.instance]
        return f"missing {one_line(repr(missing[0]), 60)}{at}" if missing else f"missing key{at}"
    if v == "const" and where == "specrace_report":
        return (f"unsupported format version {one_line(repr(err.instance), 40)} "
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
                f"{one_line(repr(err.instance), 40)}")
    if v in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return f"'{where}' = {one_line(repr(err.instance), 40)} is out of range"
    if v in ("maxLength", "minLength"):
        return f"'{where}' has a bad length"
    return one_line(f"{err.message}{at}", 160)


def _check_names(result: Any, name: str) -> Any:
    import targets
    from scenarios.registry import SCENARIOS

    scen = SCENARIOS.get(result.scenario)
    if scen is None:
        raise ValueError(f"{name}: unknown scenario {one_line(repr(result.scenario), 80)}; "
                         f"known: {', '.join(sorted(SCENARIOS))}")
    if result.variant not in scen.variants:
        raise ValueError(f"{name}: unknown variant {one_line(repr(result.variant), 80)} for "
                         f"{scen.name}; expected one of: {', '.join(scen.variants)}")
    try:
        target = targets.get(result.target)
    except targets.TargetError as exc:
        raise ValueError(f"{name}: recorded on target {result.target}, which cannot run "
                         f"here: {one_line(exc, 200)}") from None
    if not target.supports(scen.name):
        raise ValueError(f"{name}: scenario {scen.name} does not run on the {target.name} "
                         f"target")
    if result.backend != "sim":
        return None
    from harness.policies import parse_policy
    try:
        return parse_policy(result.policy)
    except ValueError as exc:
        raise ValueError(f"{name}: {one_line(exc, 200)}") from None


def _schedules(result: Any, policy: Any, name: str) -> Any:
    """The report's recorded schedules, decoded (one budget for all trials) and checked
    against the report they sit in."""
    texts = result.schedules
    if texts is None:
        return None
    from harness.policies import Schedules
    from harness.policies.schedule import MAX_CHOICES, decode_choices
    bad = f"{name}: not a specrace report: 'schedules'"
    if policy is None:
        raise ValueError(f"{bad}: schedules are recorded on the simulator only")
    if len(texts) != result.trials:
        raise ValueError(f"{bad}: {len(texts)} recorded for {result.trials} trials")
    per_trial, budget = [], MAX_CHOICES
    for i, text in enumerate(texts):
        if text is None:  # the trial never ran
            per_trial.append(None)
            continue
        try:
            choices = decode_choices(text, budget)
        except ValueError as exc:
            raise ValueError(f"{bad}[{i}]: {one_line(exc, 200)}") from None
        budget -= len(choices)
        per_trial.append(choices)
    return Schedules(policy, per_trial)
