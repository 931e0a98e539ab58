"""JSON Schema of a ``specrace repro`` report (``NAME.json``), format version 1.

Only what replay relies on is constrained; other keys (environment, trial results, ...)
are free. Bounds follow the CLI's (trials 1..100000, seed 0..2**31-1, stall 0..2000 ms).
"""
from __future__ import annotations

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
        "policy": {"type": "string", "minLength": 1, "maxLength": 200},
        "stall_ms": {"type": ["number", "null"], "minimum": 0, "maximum": 2000},
        "seed": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
        "trials": {"type": "integer", "minimum": 1, "maximum": 100_000},
        "reproduced": {"type": "integer", "minimum": 0, "maximum": 100_000},
        "races": {
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
        },
        "first_divergence": {
            "type": ["object", "null"],
            "required": ["kind"],
            "properties": {
                "kind": {"type": "string", "maxLength": 200},
                "rid": {"type": ["integer", "null"]},
                "step": {"type": ["integer", "null"]},
            },
        },
        "expect": {"enum": ["clean", "race"]},
    },
}
