"""The grammar oracle for outputs: every constrained output is a sentence of its grammar
-- each token accepted in turn by a fresh matcher -- and, once the grammar terminated, the
text parses as JSON and validates against the request's schema."""
from __future__ import annotations

import json
from typing import Dict, List

import jsonschema

from .workload import Workload


def check_constrained_outputs(workload: Workload, outputs: Dict[int, List[int]], oracle) -> None:
    """Judged with impl's own xgrammar matcher whatever the target: the reference grammar,
    independent of the code under test."""
    from impl.vocab import EOS_ID, decode
    from .runner import grammar_backend
    for spec in workload.requests:
        if not spec.schema or spec.rid not in outputs:
            continue
        tokens = outputs[spec.rid]
        g = grammar_backend("impl").grammar_for_json_schema(spec.schema)
        for k, tok in enumerate(tokens):
            try:
                g.accept_token(tok)
            except ValueError:
                oracle.diverge_grammar(spec.rid, k, f"token {tok} at position {k} is not "
                                                    f"allowed by the request's grammar")
                return
            if g.is_terminated():
                break
        if not g.is_terminated():
            continue  # budget ran out first: a valid prefix is all that can be asked
        text = decode([t for t in tokens if t != EOS_ID])
        try:
            jsonschema.validate(json.loads(text), json.loads(spec.schema))
        except (ValueError, jsonschema.ValidationError) as exc:
            oracle.diverge_grammar(spec.rid, None, f"output {text!r} is not schema-valid: "
                                                   f"{str(exc).splitlines()[0]}")
            return
