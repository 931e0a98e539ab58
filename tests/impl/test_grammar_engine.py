"""Grammar-constrained verify through the whole engine, on both staging paths and under
every schedule policy: constrained outputs are sentences of their grammar and, when
finished, schema-valid JSON; unconstrained requests in the same batch are unaffected
(token for token equal to the synchronous reference)."""
import json

import jsonschema
import pytest

from harness.trials.drive import server_args
from harness.trials.reference import reference
from harness.trials.trial import run_trial
from harness.policies import parse_policy
from toys.vocab import EOS_ID, decode
from scenarios.registry import get
import targets

POLICIES = ["eager", "lazy", "stall(forward)", "random(5)", "pct(3,3)"]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("scenario", ["grammar-ngram", "grammar-tree-staging"])
def test_constrained_outputs_valid_and_others_unaffected(scenario, policy):
    sc = get(scenario)
    completed = constrained = 0
    for seed in (0, 1):
        wl = sc.workload(seed)
        args = server_args(wl, sc.variants["fixed"].args, targets.get("impl"))
        res = run_trial("sim", parse_policy(policy), wl, args, sc.stalls(None), target=targets.get("impl"))
        assert res.divergence is None, res.divergence
        assert res.races == []
        ref = reference(wl, args, "sim", targets.get("impl"))
        for spec in wl.requests:
            out = res.outputs[spec.rid]
            assert out == ref.outputs[spec.rid]  # every request, constrained or not
            if spec.schema is None:
                continue
            constrained += 1
            if EOS_ID in out:  # the grammar terminated: the text is a complete document
                completed += 1
                jsonschema.validate(json.loads(decode(out)), json.loads(spec.schema))
    assert constrained >= 2 and completed >= 1  # the oracle had something to judge
