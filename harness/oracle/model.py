"""The model oracle: reference-free. The toy target model's greedy continuation is known
in closed form (``toys.model.successor``: each token's successor, a few tokens lead to
EOS), and speculative decoding with greedy verification is lossless -- whatever the
drafts, every unconstrained output must be exactly that continuation of its prompt, up
to EOS or the request's budget.

The output comparison judges a trial against the synchronous reference run of the same
engine, so a deterministic bug the engine has in both runs (a wrong commit stride, a
dropped or doubled token) is invisible to it. This judge does not share the engine's
code: it sees such bugs in every run. Constrained requests are the grammar oracle's.
"""
from __future__ import annotations

from typing import Dict, List

from harness.oracle.workload import Workload


def greedy_continuation(prompt: List[int], budget: int) -> List[int]:
    """The target model's greedy output for ``prompt``: ``budget`` tokens, or up to and
    including EOS."""
    from toys.model import successor  # torch: imported when a run is judged
    from toys.vocab import EOS_ID
    out: List[int] = []
    token = prompt[-1]
    while len(out) < budget:
        token = successor(token)
        out.append(token)
        if token == EOS_ID:
            break
    return out


def check_model_outputs(workload: Workload, outputs: Dict[int, List[int]], oracle) -> None:
    """Each finished unconstrained request's output against its greedy continuation;
    the first that differs is the run's divergence (kind ``model``)."""
    for spec in workload.requests:
        got = outputs.get(spec.rid)
        if spec.schema or got is None:
            continue
        exp = greedy_continuation(spec.prompt, spec.max_new_tokens)
        if got != exp:
            oracle.diverge_model(spec.rid, exp, got)
            return
