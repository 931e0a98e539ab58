"""A trial that crashes with an exception saying the code was handed what it does not take
(``repro.UNFIT_EXCEPTIONS``) is no verdict -- the trial took a path specrace's build of the
server does not fit -- while a crash a stale value can cause stays a divergence."""
from __future__ import annotations

import pytest

from harness.oracle.divergence import Divergence
from harness.trials import repro


def _crash(observed: str, where: str = "trial") -> Divergence:
    return Divergence("crash", f"engine crashed in the trial run: {observed}", where=where,
                      observed=observed)


@pytest.mark.parametrize("observed", [
    "AttributeError: 'SingleRankGroup' object has no attribute 'pcie_ipc_comm'",
    "TypeError: f() missing 1 required positional argument: 'server_args'",
    "ModuleNotFoundError: No module named 'sglang.srt.mem_cache.kv_index_translator'",
    "NotImplementedError: specrace: the stand-in does not model mrope positions"])
def test_an_exception_of_a_path_specrace_does_not_fit_is_no_verdict(observed):
    assert repro._unfit_crash(_crash(observed))


@pytest.mark.parametrize("divergence", [
    _crash("IndexError: index 9 is out of bounds for dimension 0 with size 8"),
    _crash("RuntimeError: CUDA error: device-side assert triggered"),
    _crash("AssertionError: accept length past the draft"),
    # the reference run's crash is the other rule's (DoesNotFit before any trial counts)
    _crash("AttributeError: x", where="reference"),
    Divergence("deadlock", "engine deadlocked in the trial run", where="trial",
               observed="DeadlockError: x"),
    None])
def test_a_crash_a_stale_value_can_cause_stays_a_divergence(divergence):
    assert not repro._unfit_crash(divergence)
