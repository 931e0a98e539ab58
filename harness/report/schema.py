"""JSON Schema of a ``specrace repro`` report (``NAME.json``), format version 1.

Every list has a ``maxItems`` and every free object a ``maxProperties`` (the parser,
``bounded.parse``, has already bounded depth and size), so validation is bounded work; it
stops at the first error (``load.load_report``). What replay relies on is required; every other key the typed reader
(``document.Report.from_json``) reads is optional -- older reports lack some -- but typed
where present, so nothing unchecked reaches the renderers. Other keys are free. The
bounds are the very constants ``repro`` and the CLI enforce, so a report asks for no more
than ``repro`` itself allows and every report ``repro`` writes replays.
"""
from __future__ import annotations

from harness.trials.repro import MAX_RACE_SITES, MAX_SEED, MAX_TRIALS
from harness.oracle.divergence import KINDS
from harness.policies import MAX_POLICY_CHARS
from harness.runtime.policy import MAX_SCHEDULE_CHARS
from harness.runtime.limits import MAX_STALL_MS
from harness.runtime.load import LOADS
from seams.vocab import Platform, TargetName, Verdict

VERDICTS = [v.value for v in Verdict]

_TEXT = {"type": "string", "maxLength": 1000}
_OPT_TEXT = {"type": ["string", "null"], "maxLength": 1000}
_OPT_INT = {"type": ["integer", "null"]}
_FRAME = {"file": _OPT_TEXT, "line": {"type": ["integer", "null"], "minimum": 0},
          "function": _OPT_TEXT}

_SITE = {
    "type": "object",
    "required": ["file", "line"],
    "properties": {
        "actor": {"type": "string", "maxLength": 200},
        "op": {"type": "string", "maxLength": 500},
        "seq": {"type": "integer"},
        "access": {"enum": ["read", "write"]},
        **_FRAME,
        "trace_index": {"type": "integer"},
        "replayed_at": {"type": "object", "required": ["file", "line"], "properties": _FRAME},
    },
}

_OWNER = {"type": "object", "properties": {"storage": _TEXT, "stream": _OPT_TEXT, **_FRAME}}

_RACES = {
    "type": "array",
    "maxItems": MAX_RACE_SITES,
    "items": {
        "type": "object",
        "required": ["kind", "first", "second"],
        "properties": {
            "kind": {"enum": ["RAW", "WAR", "WAW"]},
            "storage": {"type": "string"},
            "count": {"type": "integer", "minimum": 0},
            "first": _SITE,
            "second": _SITE,
            "reuse": {"type": "object",
                      "properties": {"block": {"type": "integer"}, "old": _OWNER,
                                     "new": _OWNER}},
        },
    },
}

# ``expected`` / ``observed`` are any JSON value (token lists, numbers, messages)
_DIVERGENCE = {
    "type": ["object", "null"],
    "required": ["kind"],
    "properties": {
        "kind": {"enum": list(KINDS)},
        "message": {"type": "string"},
        "rid": _OPT_INT,
        "step": _OPT_INT,
        "position": _OPT_INT,
        "where": _OPT_TEXT,
        "stream": _OPT_TEXT,
    },
}

_TRIAL = {
    "type": "object",
    "required": ["trial", "seed", "reproduced", "divergence", "races", "traced", "ms",
                 "checked"],
    "properties": {
        "trial": {"type": "integer", "minimum": 0},
        "seed": {"type": "integer"},
        "reproduced": {"type": "boolean"},
        "divergence": {"enum": [*KINDS, None]},
        "races": {"type": "integer", "minimum": 0},
        "traced": {"type": "boolean"},
        "ms": {"type": "number"},
        "checked": {"type": "integer", "minimum": 0},
    },
}

MAX_EVERY = 1_000_000  # a stall or an answer at every n-th hit

# A free-form object (what the environment, the target and the host order recorded): any
# keys, a bounded number of them (the parser bounds the depth of what is inside).
_FREE = {"type": "object", "maxProperties": 200}
_STALL = {
    "type": "object",
    "required": ["point"],
    "properties": {"point": _TEXT,
                   "ms": {"type": ["number", "null"], "minimum": 0, "maximum": MAX_STALL_MS},
                   "every": {"type": "integer", "minimum": 1, "maximum": MAX_EVERY}},
}
# The host-order answers ``replay`` gives the engine (``FaultPlan.ask``): per question a
# constant or ``{"every": n}``.
_HOST_ORDER = {
    "type": "object",
    "maxProperties": 50,
    "additionalProperties": {"anyOf": [
        {"type": ["boolean", "integer"]},
        {"type": "object", "required": ["every"], "additionalProperties": False,
         "properties": {"every": {"type": "integer", "minimum": 1, "maximum": MAX_EVERY}}},
    ]},
}
# Every trial's recorded schedule (simulator only: null on CUDA; absent in reports written
# before schedules were recorded): trial i's ``Schedule`` in its text form
# (``harness.runtime.policy``), or null for a trial that never ran. ``replay`` checks there is one per trial and decodes them under one budget.
_SCHEDULES = {
    "type": ["array", "null"],
    "maxItems": MAX_TRIALS,
    "items": {"type": ["string", "null"], "maxLength": MAX_SCHEDULE_CHARS},
}

# sha256 of the shown trial's Chrome trace (``chrome.trace_digest``): the same trace
_DIGEST = {"type": ["string", "null"], "pattern": "^[0-9a-f]{64}$"}

REPORT_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "specrace repro report",
    "type": "object",
    "required": ["specrace_report", "scenario", "variant", "war_barrier", "backend", "policy",
                 "stall_ms", "seed", "trials", "reproduced", "races", "first_divergence"],
    "properties": {
        "specrace_report": {"const": 1},
        "scenario": {"type": "string", "minLength": 1, "maxLength": 200},
        # absent in reports written before targets existed: impl
        "target": {"enum": [t.value for t in TargetName]},
        "variant": {"type": "string", "minLength": 1, "maxLength": 200},
        "war_barrier": {"enum": ["fine", "coarse"]},
        "backend": {"enum": ["sim", "cuda"]},
        "policy": {"type": "string", "minLength": 1, "maxLength": MAX_POLICY_CHARS},
        "stall_ms": {"type": ["number", "null"], "minimum": 0, "maximum": MAX_STALL_MS},
        "seed": {"type": "integer", "minimum": 0, "maximum": MAX_SEED},
        "trials": {"type": "integer", "minimum": 1, "maximum": MAX_TRIALS},
        "reproduced": {"type": "integer", "minimum": 0, "maximum": MAX_TRIALS},
        "races": _RACES,
        "first_divergence": _DIVERGENCE,
        # the rest is optional (older reports lack some), but typed where present: it is
        # what ``document.Report.from_json`` reads
        "first_trial": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_TRIALS},
        "trial_results": {"type": "array", "maxItems": MAX_TRIALS, "items": _TRIAL},
        "median_trial_ms": {"type": ["number", "null"]},
        "expected_by_scenario": {"enum": [*VERDICTS, None]},
        "target_info": _FREE,
        "stall_plan": {"type": "array", "maxItems": 100, "items": _STALL},
        "host_order": _HOST_ORDER,
        "load": {"type": "string", "enum": sorted(LOADS)},
        "platform": {"type": "string", "enum": [p.value for p in Platform]},
        "command": _OPT_TEXT,
        "environment": _FREE,
        "replay": {"type": "object", "properties": {"command": _OPT_TEXT}},
        "report_files": {"type": "object", "maxProperties": 20,
                         "additionalProperties": _OPT_TEXT},
        "run_id": _OPT_TEXT,
        "schedules": _SCHEDULES,
        "trace_digest": _DIGEST,
        "expect": {"enum": [*VERDICTS, None]},  # null: none was stated
    },
}
