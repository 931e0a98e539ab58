"""JSON from outside, parsed under bounds that are checked *before* parsing.

``parse(data)`` refuses a document nested deeper than ``MAX_DEPTH`` or holding more than
``MAX_VALUES`` values before ``json.loads`` builds anything, so neither the parser's C
recursion nor the objects it would build can be driven by the input: one pass of array
operations over the bytes, a few MB at a time (C speed, no Python loop over the text, a
few chunks' memory), measures both.
Everything that walks the parsed value afterwards (the schema validator, the renderers,
``json.dumps``) is therefore bounded by ``MAX_DEPTH`` too.

How the pre-scan measures: escaped backslashes and escaped quotes are blanked first, then
the parity of the quotes marks what is inside strings (in well-formed JSON a ``"`` outside
a string always opens one, and UTF-8 never puts a ``"`` or ``\\`` byte inside a
multi-byte character, so bytes suffice); what is left is structure. Each value is a container or follows a ``,``/opening bracket, so ``values <=
commas + containers + 1``; the depth is the running maximum of opening minus closing
brackets. A malformed text may be measured wrongly, but then ``json.loads`` rejects it.
"""
from __future__ import annotations

import json
import re
from typing import Any, Dict

MAX_DEPTH = 32  # a report is ~5 deep (races[i].reuse.old.file); observed values ~3
# values in one document: a report of MAX_TRIALS trials with its schedules and every race
# site is ~2*10^5; the cap keeps the parsed objects of a 20 MB file within tens of MB
MAX_VALUES = 500_000

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


class TooBig(ValueError):
    """The document is over a bound (one line)."""


def measure(data: bytes) -> "tuple[int, int]":
    """(depth, values) of the JSON text ``data``, without parsing it."""
    depth, values, _, _ = _scan(data, members=False)
    return depth, values


def _scan(data: bytes, members: bool, chunk: int = 1 << 21):
    """One pass over ``data`` in chunks of a few MB (array operations; the memory is a few
    chunks', whatever the text): escapes blanked to two bytes (offsets kept), a quote
    parity marks what is inside strings, a running depth. Returns (deepest, values,
    {top-level member index: values in it}, [where each top-level member starts])."""
    import numpy as np
    # an escaped backslash, then an escaped quote: neither delimits a string (two
    # replaces, left to right, pair the backslashes as a JSON reader does)
    blank = data.replace(b"\\\\", b"__").replace(b'\\"', b"__")
    counts: Dict[int, int] = {}
    starts = [0]
    parity, depth0, deepest, values = False, 0, 0, 1
    for at in range(0, len(blank), chunk):
        b = np.frombuffer(blank, dtype=np.uint8, count=min(chunk, len(blank) - at),
                          offset=at)
        quote = b == ord('"')
        inside = np.logical_xor.accumulate(quote) ^ parity
        parity = bool(inside[-1])
        plain = ~(inside | quote)
        opens = plain & ((b == ord("[")) | (b == ord("{")))
        step = opens.astype(np.int32) - (plain & ((b == ord("]")) | (b == ord("}")))
                                          ).astype(np.int32)
        depth = np.cumsum(step, dtype=np.int64) + depth0
        depth0 = int(depth[-1])
        deepest = max(deepest, int(depth.max()))
        comma = plain & (b == ord(","))
        values += int(np.count_nonzero(comma)) + int(np.count_nonzero(opens))
        if members:
            seps = np.flatnonzero(comma & (depth == 1))
            inner = np.flatnonzero((comma | opens) & (depth >= 2))
            # a value's member: how many top-level separators precede it
            index = np.searchsorted(seps, inner) + (len(starts) - 1)
            for k, n in zip(*np.unique(index, return_counts=True)):
                counts[int(k)] = counts.get(int(k), 0) + int(n)
            starts.extend(int(x) + at + 1 for x in seps)
    return deepest, values, counts, starts


def parse(data: bytes, text: str) -> Any:
    """``json.loads(text)`` (``text`` is ``data`` decoded) after the bounds hold;
    ``TooBig`` if not, ``ValueError`` for a non-standard constant (NaN, Infinity)."""
    depth, values = measure(data)
    if values > MAX_VALUES:
        where = largest_member(data)
        raise TooBig(f"more than {MAX_VALUES} values"
                     + (f", most of them in {where!r}" if where else ""))
    if depth > MAX_DEPTH:
        raise TooBig(f"nested more than {MAX_DEPTH} deep")
    return json.loads(text, parse_constant=_reject_constant)


def largest_member(data: bytes, max_chars: int = 60) -> "str | None":
    """The top-level key of the JSON object ``data`` whose value holds the most values
    (for the error line; None if it cannot tell)."""
    _, _, counts, starts = _scan(data, members=True)
    if not counts:
        return None
    k = max(counts, key=counts.get)
    q = data.find(b'"', starts[k])
    m = _STRING.match(data, q) if q >= 0 else None
    try:
        key = json.loads(m.group(0)) if m else None
    except ValueError:
        return None
    if not isinstance(key, str):
        return None
    return key if len(key) <= max_chars else key[:max_chars] + "..."


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
