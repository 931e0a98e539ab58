"""Retraction under memory pressure on the sglang target: on 0.5.23 upstream's
own ``ScheduleBatch.check_decode_mem`` and ``retract_decode`` decide whom to retract and
release them (``release_req``), under upstream's loop. The same checks as impl's
(``tests/impl/test_pressure.py``)."""
from __future__ import annotations

import pytest

from tests.impl import test_pressure as impl_tests


pytestmark = pytest.mark.usefixtures("sglang")


def test_pressure_retracts_and_the_runs_do_not_part():
    impl_tests.test_pressure_retracts_and_the_runs_part(target="sglang", part=False)


@pytest.mark.parametrize("policy", impl_tests.POLICIES)
def test_the_fixed_code_is_clean_under_pressure(policy):
    impl_tests.test_the_fixed_code_is_clean_under_pressure(policy, target="sglang")


def test_a_missing_barrier_is_killed_under_pressure_on_every_seed():
    impl_tests.test_a_missing_barrier_is_killed_under_pressure_on_every_seed(target="sglang")


def test_a_committed_retracted_result_is_killed_under_pressure():
    impl_tests.test_a_committed_retracted_result_is_killed_under_pressure(target="sglang",
                                                                          seeds=(0, 1))


def test_upstreams_retract_decode_chooses(monkeypatch):
    """On 0.5.23 the choice is upstream's: every retraction under pressure comes out of
    its ``ScheduleBatch.retract_decode``."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from targets.sglang.engine import kv_lifecycle
    if not kv_lifecycle.fits():
        pytest.skip("this release has not 0.5.23's KV lifecycle")
    chosen = []
    real = ScheduleBatch.retract_decode

    def spy(self, *a, **kw):
        out = real(self, *a, **kw)
        chosen.extend(r.rid for r in out[0])
        return out
    monkeypatch.setattr(ScheduleBatch, "retract_decode", spy)
    seen, _, _ = impl_tests.retraction_points("sglang", 0, overlap=True)
    assert chosen and sorted(chosen) == sorted(r for r, steps in seen.items() for _ in steps)
