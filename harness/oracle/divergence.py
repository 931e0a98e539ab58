"""A judge's verdict on one value: ``Divergence`` -- the data and its one JSON form.

Every judge (the stale-value oracle, the output check, the grammar oracle, a crash of the
engine) reports what it found as one of these; the report, the console, the matrix and
``replay`` read its fields, and ``to_json`` / ``from_json`` are the only places that
know its JSON keys (``from_json`` reads a report that ``report.schema`` has validated).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, Literal, Optional, Tuple, get_args

# What diverged: a stale accept length / accept token row / relayed confidence row /
# returned hidden-state row / resolved sequence length / zeroed draft-id row seen by the
# host, a forward's attention that read KV other than its request's own context, a final
# output (against the reference run's; ``model``: against the target model's greedy
# continuation), a constrained output its grammar rejects, or the engine crashed /
# deadlocked.
DivergenceKind = Literal["accept_lens", "accept_tokens", "confidence", "hidden_states",
                         "seq_lens", "draft_rows", "kv_context", "output", "model",
                         "grammar", "crash", "deadlock"]
KINDS: Tuple[str, ...] = get_args(DivergenceKind)
# a stale value on the host
STALE_KINDS = ("accept_lens", "accept_tokens", "confidence", "hidden_states", "seq_lens",
               "draft_rows", "kv_context")


@dataclass(frozen=True)
class Divergence:
    kind: DivergenceKind
    message: str  # one sentence a person reads first
    rid: Optional[int] = None  # the request (None: the run as a whole)
    step: Optional[int] = None  # the request's verify step (None: not step-bound)
    where: Optional[str] = None  # where the value was seen (or: trial / reference run)
    stream: Optional[str] = None  # the stream the host read it on (host: final output)
    expected: Any = None  # JSON values: the synchronous reference's
    observed: Any = None
    position: Optional[int] = None  # output / grammar: the first bad token's index

    @property
    def stale(self) -> bool:
        return self.kind in STALE_KINDS

    def to_json(self) -> Dict[str, Any]:
        out = {"kind": self.kind, "rid": self.rid, "step": self.step, "where": self.where,
               "stream": self.stream, "expected": _plain(self.expected),
               "observed": _plain(self.observed), "message": self.message}
        if self.kind in ("output", "model", "grammar"):
            out["position"] = self.position
        return out

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "Divergence":
        """From a validated report (``message`` and the rest may be absent in a crafted
        one: the schema requires only ``kind``)."""
        return cls(kind=doc["kind"], message=str(doc.get("message") or doc["kind"]),
                   rid=doc.get("rid"), step=doc.get("step"), where=doc.get("where"),
                   stream=doc.get("stream"), expected=doc.get("expected"),
                   observed=doc.get("observed"), position=doc.get("position"))

    def identity(self) -> Dict[str, Any]:
        """What ``replay`` compares: kind, request, step and observed value."""
        return {"kind": self.kind, "rid": self.rid, "step": self.step,
                "observed": _plain(self.observed)}


MAX_VALUE_DEPTH = 32  # an observed value's nesting (token rows: 2) -- the report's bound


def _plain(v: Any) -> Any:
    """A JSON value (tuples -> lists, anything else its text), as the report stores it; a
    value nested deeper than ``MAX_VALUE_DEPTH`` is its (cut) text instead, so neither
    json's C recursion nor a report reader meets it (checked iteratively)."""
    if _deeper_than(v, MAX_VALUE_DEPTH):
        return f"<value nested deeper than {MAX_VALUE_DEPTH}>"
    return json.loads(json.dumps(v, default=str))


def _deeper_than(v: Any, limit: int) -> bool:
    stack = [(v, 0)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, (list, tuple, dict)):
            if d >= limit:
                return True
            stack.extend((y, d + 1) for y in (x.values() if isinstance(x, dict) else x))
    return False
