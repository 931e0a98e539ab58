"""The model oracle (``harness/oracle/model.py``): reference-free. It knows the target
model's greedy continuation without running the engine, so a deterministic bug the
engine has in the trial *and* in the synchronous reference -- which the output
comparison cannot see, the two runs agree -- is still a finding."""
import collections

import torch

import impl.scheduler
import toys.requests
from harness.oracle.model import greedy_continuation
from harness.policies import parse_policy
from harness.trials import reference as reference_module
from harness.trials.drive import server_args
from harness.trials.trial import run_trial
from toys.model import ToyTargetModel
from toys.vocab import EOS_ID
from scenarios.registry import get
import targets


def test_the_greedy_continuation_is_the_models_argmax_chain():
    model = ToyTargetModel("cpu")
    for prompt in ([5, 6, 7], [28], [57, 58]):
        token, want = prompt[-1], []
        for _ in range(12):
            token = int(model.forward(torch.tensor([token])).argmax(dim=-1))
            want.append(token)
            if token == EOS_ID:
                break
        assert greedy_continuation(prompt, 12) == want
    assert greedy_continuation([29], 12) == [EOS_ID]  # 29 leads to EOS: it stops there
    assert len(greedy_continuation([5], 3)) == 3  # the budget


def _seed_trial():
    sc = get("ngram-filter-race")
    wl = sc.workload(0)
    args = server_args(wl, sc.variants["fixed"].args, targets.get("impl"))
    return run_trial("sim", parse_policy("eager"), wl, args, sc.stalls(None),
                     answers=sc.answers, target=targets.get("impl"))


def test_the_fixed_engine_passes():
    r = _seed_trial()
    assert r.divergence is None and r.outputs


def test_a_bug_in_both_runs_is_caught_by_the_model_oracle_alone(monkeypatch):
    """The commit drops a finishing request's last token: the trial and its reference
    share the bug, so their outputs agree -- only the model oracle can say they are
    wrong."""
    commit = toys.requests.accept_tokens

    def drops_last(req, tokens, advance_grammar=True):
        done = commit(req, tokens, advance_grammar)
        if done:
            req.output_ids.pop()
        return done
    monkeypatch.setattr(impl.scheduler, "accept_tokens", drops_last)
    # the reference runs with the bug too (not a cached one of the fixed engine)
    monkeypatch.setattr(reference_module, "_REFERENCE_CACHE", collections.OrderedDict())
    r = _seed_trial()
    assert r.divergence is not None and r.divergence.kind == "model", r.divergence
    assert "greedy continuation" in r.divergence.message
