"""The grammar oracles.

* Outputs: every constrained output is a sentence of its grammar -- each token accepted in
  turn by a fresh matcher -- and, once the grammar terminated, the text parses as JSON and
  validates against the request's schema.
* Bitmasks: ``brute_force_rows`` is the per-node reference a verify-tree bitmask must
  equal -- each node's row computed on a fresh grammar walked down the node's own path,
  no traversal and no rollback -- for any grammar object with ``accept_token`` /
  ``fill_vocab_mask`` / ``is_terminated`` (specrace's and sglang's alike).
"""
from __future__ import annotations

import json
from typing import Callable, Dict, List, Optional

import jsonschema

from harness.oracle.workload import Workload


def check_constrained_outputs(workload: Workload, outputs: Dict[int, List[int]], oracle,
                              backend) -> None:
    """A fresh grammar of the target's own ``backend`` replays each output (the grammar
    the request was served under: upstream's and impl's differ in whitespace), and the
    text is validated as JSON against the schema -- independent of either backend."""
    from toys.vocab import EOS_ID, decode
    for spec in workload.requests:
        if not spec.schema or spec.rid not in outputs:
            continue
        tokens = outputs[spec.rid]
        g = backend.grammar_for_json_schema(spec.schema)
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


def bitmask_row(grammar, width: int) -> List[int]:
    """The grammar's next-token row (int32 words, LSB first)."""
    import torch
    row = torch.full((1, width), -1, dtype=torch.int32)
    grammar.fill_vocab_mask(row, 0)
    return row[0].tolist()


def allowed_tokens(grammar, vocab_size: int) -> List[int]:
    words = bitmask_row(grammar, (vocab_size + 31) // 32)
    return [t for t in range(vocab_size) if (words[t // 32] >> (t % 32)) & 1]


def brute_force_rows(fresh: Callable[[], object], parents: List[int], tokens: List[int],
                     vocab_size: int) -> List[List[int]]:
    """Each tree node's expected bitmask row. ``fresh()`` returns a new grammar in the
    request's committed state; node ``i``'s row is that grammar walked down the path
    root -> i (every token must be allowed by its parent's row and the grammar not yet
    terminated), all ones (-1) where the node is unreachable or the grammar terminated."""
    width = (vocab_size + 31) // 32
    rows = []
    for i in range(len(parents)):
        path = []
        node = i
        while node != 0:
            path.append(node)
            node = parents[node]
        path.reverse()  # root -> i, root excluded
        g = fresh()
        row: Optional[List[int]] = None
        reached = True
        for node in path:
            if g.is_terminated():  # no descent below a terminated grammar
                reached = False
                break
            tok = tokens[node]
            if tok not in allowed_tokens(g, vocab_size):  # rejected by the parent's row
                reached = False
                break
            g.accept_token(tok)
        if reached and not g.is_terminated():
            row = bitmask_row(g, width)
        rows.append(row if row is not None else [-1] * width)
    return rows
