"""Upstream's own ``Req`` and ``SchedulerBatchResultProcessor`` under upstream's loop:
where the release has them, every result is processed by upstream -- its
finish logic, its KV settling and release, its grammar advance -- and the harness only
observes what it committed."""
from __future__ import annotations

import pytest

from seams.faults.plan import FaultPlan
from harness.oracle.model import greedy_continuation
from harness.policies import parse_policy
from harness.runtime import open_runtime
from harness.trials.drive import drive, server_args
from scenarios.registry import get
import targets


@pytest.fixture(scope="module")
def sglang():
    import targets
    target = targets.get("sglang")
    from targets.sglang.engine import result_processor
    if not result_processor.fits():
        pytest.skip(f"sglang {target.version} has not 0.5.23's result processor")
    return target


def _run(sglang, scenario, variant, seed=0, policy="eager", spy=None):
    sc = get(scenario)
    wl = sc.workload(seed)
    args = server_args(wl, sc.variants[variant].args, sglang)
    with open_runtime("sim", parse_policy(policy)) as rt:
        outputs = drive(rt, wl, args, FaultPlan(), target=targets.get("sglang"))
    return wl, outputs


def test_requests_and_results_are_upstreams(sglang, monkeypatch):
    """A run's requests are upstream's ``Req``s, its results go through upstream's
    processor (decode and prefill), and each request ends with upstream's finish reason
    and the greedy continuation as its visible output."""
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH, FINISH_MATCHED_TOKEN, Req
    from sglang.srt.managers.scheduler_components.batch_result_processor import \
        SchedulerBatchResultProcessor as P
    seen = {"decode": 0, "prefill": 0, "reqs": []}
    for mode in ("decode", "prefill"):
        real = getattr(P, f"process_batch_result_{mode}")

        def spy(self, batch, result, _real=real, _mode=mode):
            seen[_mode] += 1
            seen["reqs"].extend(batch.reqs)
            return _real(self, batch, result)
        monkeypatch.setattr(P, f"process_batch_result_{mode}", spy)
    wl, outputs = _run(sglang, "kv-row-reuse", "fixed")
    assert seen["decode"] > 0 and seen["prefill"] > 0
    assert seen["reqs"] and all(isinstance(r, Req) for r in seen["reqs"])
    for spec in wl.requests:
        assert outputs[spec.rid] == greedy_continuation(spec.prompt, spec.max_new_tokens)
    finished = {r.rid: r for r in seen["reqs"]}
    assert all(r.finished() for r in finished.values())
    assert all(isinstance(r.finished_reason, (FINISH_LENGTH, FINISH_MATCHED_TOKEN))
               for r in finished.values())


def test_a_finish_is_upstreams_decision(sglang, monkeypatch):
    """Upstream decides the finish (``Req.update_finish_state``), the harness follows it:
    with upstream's Req granting two tokens more than asked, a request that does not
    meet EOS ends two tokens past its budget (the harness's own commit would have stopped
    it at the budget)."""
    from sglang.srt.managers.schedule_batch import Req
    real = Req.update_finish_state

    def two_more(self, new_accepted_len=1):
        if not getattr(self, "_granted", False):
            self._granted = True
            self.sampling_params.max_new_tokens += 2
        real(self, new_accepted_len)
    monkeypatch.setattr(Req, "update_finish_state", two_more)
    wl, outputs = _run(sglang, "kv-row-reuse", "fixed")
    over = [s.rid for s in wl.requests if len(outputs[s.rid]) == s.max_new_tokens + 2]
    assert over, "no request ran past its budget: the finish is not upstream's"


def test_the_swa_layout_keeps_the_targets_own_commit(sglang):
    """Specrace's SWA allocator is not upstream's: there the finish cannot release through
    upstream's ``release_kv_cache``, and the target's own commit runs (still correct)."""
    from targets.sglang.boundary.server_args import SglangArgs
    args = SglangArgs(req_pool_size=4, kv_pool_size=64, draft_token_num=4, kv_layout="swa")
    with open_runtime("sim", trace=False) as rt, sglang.variant(args, rt.device):
        assert sglang.scheduler(args, rt.device).upstream_processor is None
    wl, outputs = _run(sglang, "kv-row-reuse", "swa")
    for spec in wl.requests:
        assert outputs[spec.rid] == greedy_continuation(spec.prompt, spec.max_new_tokens)


def test_the_target_reports_whose_requests_and_results(sglang):
    info = sglang.describe()
    assert info["requests"] == "upstream" and info["result_processor"] == "upstream"
