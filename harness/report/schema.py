"""JSON Schema of a ``specrace repro`` report (``NAME.json``), format version 1.

Only what replay relies on is constrained; other keys (environment, trial results, ...)
are free. The bounds are the very constants ``repro`` and the CLI enforce, so a report
asks for no more than ``repro`` itself allows and every report ``repro`` writes replays.
"""
from __future__ import annotations

from harness.oracle.repro import MAX_SEED, MAX_TRIALS
from harness.policies import MAX_POLICY_CHARS
from harness.policies.schedule import MAX_SCHEDULE_CHARS
from harness.runtime.limits import MAX_STALL_MS

_SITE = {
    "type": "object",
    "required": ["file", "line"],
    "properties": {
        "actor": {"type": "string", "maxLength": 200},
        "op": {"type": "string", "maxLength": 500},
        "access": {"enum": ["read", "write"]},
        "file": {"type": ["string", "null"], "maxLength": 1000},
        "line": {"type": ["integer", "null"], "minimum": 0},
        "function": {"type": ["string", "null"], "maxLength": 500},
    },
}

_RACES = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["kind", "first", "second"],
        "properties": {
            "kind": {"enum": ["RAW", "WAR", "WAW"]},
            "storage": {"type": "string"},
            "count": {"type": "integer", "minimum": 0},
            "first": _SITE,
            "second": _SITE,
        },
    },
}

_DIVERGENCE = {
    "type": ["object", "null"],
    "required": ["kind"],
    "properties": {
        "kind": {"type": "string", "maxLength": 200},
        "rid": {"type": ["integer", "null"]},
        "step": {"type": ["integer", "null"]},
    },
}

# Every trial's recorded schedule (simulator only: null on CUDA; absent in reports written
# before schedules were recorded): trial i's choices in ``harness.policies.schedule``'s
# text form, or null for a trial that never ran. ``replay`` checks there is one per trial and decodes them under one budget.
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
                 "stall_ms", "seed", "trials", "reproduced", "races", "first_divergence",
                 "expect"],
    "properties": {
        "specrace_report": {"const": 1},
        "scenario": {"type": "string", "minLength": 1, "maxLength": 200},
        # absent in reports written before targets existed: impl
        "target": {"enum": ["impl", "sglang"]},
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
        "schedules": _SCHEDULES,
        "trace_digest": _DIGEST,
        "expect": {"enum": ["clean", "race"]},
    },
}
