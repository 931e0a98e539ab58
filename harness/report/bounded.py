"""JSON from outside, parsed under bounds that are checked *before* parsing.

``parse(data)`` refuses a document nested deeper than ``MAX_DEPTH`` or holding more than
``MAX_VALUES`` values before ``json.loads`` builds anything, so neither the parser's C
recursion nor the objects it would build can be driven by the input: one pass of regular
expressions and byte counts (C speed, no Python loop over the text) measures both.
Everything that walks the parsed value afterwards (the schema validator, the renderers,
``json.dumps``) is therefore bounded by ``MAX_DEPTH`` too.

How the pre-scan measures: strings are blanked first (inside a well-formed JSON text a
``"`` outside a string always opens one, and UTF-8 never puts a ``"`` or ``\\`` byte inside
a multi-byte character, so a byte-level pattern finds exactly the strings); what is left
is structure. Each value is a container or follows a ``,``/opening bracket, so ``values <=
commas + containers + 1``; the depth is the running maximum of opening minus closing
brackets. A malformed text may be measured wrongly, but then ``json.loads`` rejects it.
"""
from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 32  # a report is ~5 deep (races[i].reuse.old.file); observed values ~3
# values in one document: a report of MAX_TRIALS trials with its schedules and every race
# site is ~2*10^5; the cap keeps the parsed objects of a 20 MB file within tens of MB
MAX_VALUES = 500_000

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


class TooBig(ValueError):
    """The document is over a bound (one line)."""


def measure(data: bytes) -> "tuple[int, int]":
    """(depth, values) of the JSON text ``data``, without parsing it."""
    skeleton = _STRING.sub(b"0", data)
    brackets = skeleton.translate(None, _NOT_BRACKET)
    opens = brackets.count(b"[") + brackets.count(b"{")
    values = skeleton.count(b",") + opens + 1
    if opens > MAX_VALUES:  # no need for the depth: refused anyway, and bounds the array
        return 0, values
    if not brackets:
        return 0, values
    import numpy as np
    b = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((b == ord("[")) | (b == ord("{")), 1, -1).astype(np.int32)
    return int(np.cumsum(steps).max()), values


def parse(data: bytes, text: str) -> Any:
    """``json.loads(text)`` (``text`` is ``data`` decoded) after the bounds hold;
    ``TooBig`` if not, ``ValueError`` for a non-standard constant (NaN, Infinity)."""
    depth, values = measure(data)
    if values > MAX_VALUES:
        raise TooBig(f"more than {MAX_VALUES} values")
    if depth > MAX_DEPTH:
        raise TooBig(f"nested more than {MAX_DEPTH} deep")
    return json.loads(text, parse_constant=_reject_constant)


def _reject_constant(token: str) -> Any:
    raise ValueError(f"non-standard JSON constant {token}")


def depth_of(value: Any, limit: int = MAX_DEPTH) -> int:
    """The nesting depth of a JSON-like value, walked iteratively; stops counting past
    ``limit`` (returns ``limit + 1``) -- for values that did not come through ``parse``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            items = v.values()
        elif isinstance(v, (list, tuple)):
            items = v
        else:
            continue
        if d > limit:
            return limit + 1
        deepest = max(deepest, d)
        stack.extend((x, d + 1) for x in items)
    return deepest
