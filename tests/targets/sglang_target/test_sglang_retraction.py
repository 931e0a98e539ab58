"""Retraction on the sglang target: upstream's ``release_req`` --
``release_kv_cache(checkpoint=False)`` and ``Req.reset_for_retract`` -- under upstream's
loop, the retracted requests filtered out with upstream's ``filter_batch`` and prefilled
again. The same checks as impl's (``tests/impl/test_retraction.py``)."""
from __future__ import annotations

import pytest

from tests.impl import test_retraction as impl_tests
import targets


pytestmark = pytest.mark.usefixtures("sglang")


@pytest.mark.parametrize("variant", ["retract", "chunked-retract"])  # chunked prefill too
@pytest.mark.parametrize("policy", impl_tests.POLICIES)
def test_the_release_is_clean_through_retractions(policy, variant):
    res = impl_tests.run_retract("sglang", policy, variant=variant)
    impl_tests.assert_clean(res)


def test_retractions_go_through_upstreams_release_req(monkeypatch):
    from sglang.srt.managers import schedule_batch as upstream_sb
    released = []
    real = upstream_sb.release_req

    def spy(**kw):
        released.append(kw["req"].rid)
        return real(**kw)
    monkeypatch.setattr(upstream_sb, "release_req", spy)
    seen, res = impl_tests.watch_retractions(monkeypatch, "sglang")
    impl_tests.check_retractions(seen, res)
    assert released and released == [rid for rid, _, _ in seen]


@pytest.mark.parametrize("name", ["retracted-result-committed", "war-barrier-removed"])
def test_retraction_bugs_are_killed_on_every_seed(name):
    impl_tests.test_retraction_bugs_are_killed_on_every_seed(name, target="sglang")


def test_removing_the_barrier_reads_a_retracted_row_rewritten():
    impl_tests.test_removing_the_barrier_reads_a_retracted_row_rewritten(target="sglang")


@pytest.mark.parametrize("policy", ["eager", "lazy", "random(1)"])
def test_upstreams_eagle_worker_is_clean_through_retractions(monkeypatch, policy):
    """EAGLE v2: the retracted requests leave through upstream's filter_batch with their
    EagleDraftInput, a step of theirs in flight; prefilled again, they draft on."""
    import toys.requests
    from harness.policies import parse_policy
    from harness.trials.drive import server_args
    from harness.trials.trial import run_trial
    from scenarios.registry import get
    seen = []
    real = toys.requests.retract

    def spy(req, kv):
        seen.append(req.launched - 1 > req.committed_step)
        real(req, kv)
    monkeypatch.setattr(toys.requests, "retract", spy)
    sc = get("eagle-v2")
    for seed in (0, 1):
        wl = sc.workload(seed)
        res = run_trial("sim", parse_policy(policy), wl,
                        server_args(wl, sc.variants["retract"].args, targets.get("sglang")), sc.stalls(None),
                        target=targets.get("sglang"))
        impl_tests.assert_clean(res, judged=None)
    assert any(seen)  # a step in flight at a retraction


def test_the_retraction_bug_is_killed_on_the_eagle_probe():
    import dataclasses
    from matrix.run import PROBES, run_probe
    m = targets.get("sglang").mutation("retracted-result-committed")
    for seed in PROBES["eagle-v2-retract"].seeds:
        killed, _, detail = run_probe(dataclasses.replace(PROBES["eagle-v2-retract"],
                                                          seeds=(seed,)), "sim", m,
                                      target="sglang")
        assert killed, (seed, detail)


@pytest.mark.parametrize("policy,count", [("lazy", 2), ("eager", 4)])
def test_a_grammar_request_retracted_before_its_first_verify(policy, count):
    impl_tests.test_a_grammar_request_retracted_before_its_first_verify(policy, count,
                                                                       target="sglang")
