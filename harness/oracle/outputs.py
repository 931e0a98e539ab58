"""A drained run's final outputs, judged: against the synchronous reference's token for
token (``StaleValueOracle.check_outputs``), unconstrained ones against the target model's
greedy continuation (``model``), constrained ones against their grammar (``grammar``).
One function for every driver of the engine: a trial and the state machines."""
from __future__ import annotations

from typing import Any, Callable, Dict, List

from harness.oracle.grammar import check_constrained_outputs
from harness.oracle.model import check_model_outputs
from harness.oracle.workload import Workload


def judge_outputs(workload: Workload, outputs: Dict[int, List[int]], oracle,
                  grammar_backend: Callable[[], Any]) -> None:
    """Every output check, each reporting to ``oracle``; ``grammar_backend()`` -- the
    target's, whose grammars the requests were served under -- is asked for only when a
    request is constrained."""
    oracle.check_outputs(outputs)
    check_model_outputs(workload, outputs, oracle)
    if any(r.schema for r in workload.requests):
        check_constrained_outputs(workload, outputs, oracle, grammar_backend())
