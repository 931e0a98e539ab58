"""Grammar-constrained verify (PR #32393): JSON-schema requests beside unconstrained ones.

* ``grammar-ngram``: the NGRAM path, tree derived on the host (``GrammarTree.from_host``).
* ``grammar-tree-staging``: the device-drafted (EAGLE-style) path; the forward stream is
  stalled between the drafter's kernels and the tree's D2H copies, so the host traversal
  reads the staged tree exactly when ``resolve()`` must wait for it.
"""
import json

from scenarios.base import Scenario, stall_at, with_bug
from scenarios.workloads import random_workload

SCHEMAS = [
    json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}},
                "required": ["ok"], "additionalProperties": False}),
    json.dumps({"type": "array", "items": {"type": "boolean"}, "maxItems": 3}),
    json.dumps({"type": "object", "properties": {"name": {"type": "string", "enum": ["ab", "on"]},
                                                  "id": {"type": "integer", "minimum": 0,
                                                         "maximum": 9}},
                "required": ["name", "id"], "additionalProperties": False}),
    json.dumps({"type": "string", "enum": ["the", "and", "ing"]}),
]


def grammar_workload(seed: int):
    return random_workload(seed, n_requests=5, draft_token_num=4, min_tokens=12,
                           max_tokens=28, schemas=SCHEMAS, grammar_fraction=0.6)


GRAMMAR_NGRAM = Scenario(
    name="grammar-ngram",
    summary="JSON-schema requests on the NGRAM path (host tree, from_host); forward stalled "
            "after the shared-read-done record",
    workload=grammar_workload,
    stalls=stall_at("forward.after_read_done"),
    variants={"fixed": {}, "stale-mask": with_bug("stale-extend-mask")},
    default_variant="fixed",
    expect={("fixed", None): "clean", ("stale-mask", None): "race"},
    sim_trials=6,
)

GRAMMAR_TREE_STAGING = Scenario(
    name="grammar-tree-staging",
    summary="device-drafted tree staged with GrammarTree.from_device; forward stalled "
            "between the drafter's kernels and the tree's D2H copies",
    workload=grammar_workload,
    stalls=stall_at("forward.after_draft"),
    variants={"fixed": {"spec_algorithm": "eagle"},
              "no-event": with_bug("tree-copy-no-event", spec_algorithm="eagle"),
              "stale-mask": with_bug("stale-extend-mask", spec_algorithm="eagle")},
    default_variant="fixed",
    expect={("fixed", None): "clean", ("no-event", None): "race",
            ("stale-mask", None): "race"},
    sim_trials=6,
)
