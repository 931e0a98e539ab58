"""Chunked prefill: a prefill takes at most ``chunked_prefill_size`` prompt
tokens; the request it cuts short (``chunked_req``) keeps its row, stays out of the
running batch and comes first in the next prefill, its middle chunks' results dropped
(``toys.requests.form_prefill``; variants ``chunked*`` of kv-row-reuse). The
helpers take a target: ``tests/targets/sglang_target/test_sglang_chunked_prefill.py`` runs them under
upstream's loop, with upstream's ``checkpoint_kv_cache``."""
from __future__ import annotations

import collections

import pytest

import targets

import toys.requests as toy_requests
from impl.schedule_batch import Req
from harness.oracle.model import greedy_continuation
from harness.oracle.stale import StaleValueOracle, checksum
from scenarios.kv_reuse import CHUNK
from scenarios.registry import get
from tests.impl.test_retraction import (assert_clean, assert_every_seed_decides, run_retract,
                                        run_to_end)

POLICIES = ["eager", "lazy", "stall(forward)", "random(1)", "pct(2,3)"]
MUTATIONS = ["chunked-req-merged", "middle-chunk-committed", "chunk-prefix-dropped",
             "war-barrier-removed"]


class _Pool:
    """What ``form_prefill`` asks of the KV manager: room, and the extend bookkeeping."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def can_admit(self, req) -> bool:
        return self.rows > 0

    def admit(self, req) -> None:
        self.rows -= 1

    def begin_extend(self, req, end: int) -> None:
        req.extend_end = end


def _req(rid: int, n: int):
    return Req(rid, list(range(1, n + 1)), 4)


def test_a_prefill_takes_at_most_the_budget_and_cuts_the_last_request():
    waiting = collections.deque([_req(0, 3), _req(1, 6), _req(2, 2)])
    reqs, cut = toy_requests.form_prefill(waiting, None, 4, 5, _Pool(8))
    assert [r.rid for r in reqs] == [0, 1] and cut is reqs[1]
    assert [(r.prefix_len, r.extend_end) for r in reqs] == [(0, 3), (0, 2)]
    assert cut.inflight_middle_chunks == 1 and [r.rid for r in waiting] == [2]
    # the next prefill: the request being chunked first, from where it stopped
    cut.prefix_len = cut.extend_end  # (the scheduler's checkpoint between the two)
    reqs, cut2 = toy_requests.form_prefill(waiting, cut, 4, 5, _Pool(8))
    assert [r.rid for r in reqs] == [1, 2] and cut.inflight_middle_chunks == 1
    # the rest of it (4 tokens), and the one token left of the budget to the next request
    assert [(r.prefix_len, r.extend_end) for r in reqs] == [(2, 6), (0, 1)]
    assert cut2 is reqs[1]
    # its chunks are one step: the number it took at admission
    assert reqs[0].launched == 1


def test_without_a_budget_every_context_goes_whole():
    waiting = collections.deque([_req(0, 30), _req(1, 9)])
    reqs, cut = toy_requests.form_prefill(waiting, None, 4, 0, _Pool(8))
    assert cut is None and [r.extend_end for r in reqs] == [30, 9]


def test_a_budget_spent_by_the_chunked_request_admits_nobody():
    waiting = collections.deque([_req(1, 3)])
    long = _req(0, 12)
    long.prefix_len, long.launched = 4, 1
    reqs, cut = toy_requests.form_prefill(waiting, long, 4, 4, _Pool(8))
    assert reqs == [long] and cut is long and long.extend_end == 8
    assert len(waiting) == 1


def run_chunked(target: str, policy: str, seed: int = 0, variant: str = "chunked-retract",
                scenario: str = "kv-row-reuse"):
    return run_retract(target, policy, seed, variant, scenario)


def watch_chunks(monkeypatch, target: str, policy: str = "eager",
                 scenario: str = "kv-row-reuse"):
    """Every prefill the trial (and its reference) formed, as ``(rid, prefix, end,
    context length)`` per request, and the trial's result."""
    formed = []
    real = toy_requests.form_prefill

    def spy(*a, **kw):
        reqs, cut = real(*a, **kw)
        formed.append([(r.rid, r.prefix_len, r.extend_end, len(r.context())) for r in reqs])
        return reqs, cut
    monkeypatch.setattr(toy_requests, "form_prefill", spy)
    # both loops bound the name at import: rebind theirs for the spy
    import impl.scheduler
    monkeypatch.setattr(impl.scheduler, "form_prefill", spy)
    if target == "sglang":
        import targets.sglang.engine.loop as loop
        monkeypatch.setattr(loop, "form_prefill", spy)
    return formed, run_chunked(target, policy, scenario=scenario)


def check_chunks(formed, res, scenario: str = "kv-row-reuse") -> None:
    assert_clean(res, judged=None)
    rows = [r for batch in formed for r in batch]
    assert all(end - prefix <= CHUNK for _, prefix, end, _ in rows)
    assert all(sum(end - prefix for _, prefix, end, _ in b) <= CHUNK for b in formed)
    middle = [r for r in rows if r[2] < r[3]]
    later = [r for r in rows if r[1] > 0]
    assert middle and later  # prompts were cut, and resumed where they stopped
    # a retracted request's history (prompt + its tokens) prefilled again in chunks
    prompts = {s.rid: s.prompt for s in get(scenario).workload(0).requests}
    assert any(prefix > 0 and ctx > len(prompts[rid]) for rid, prefix, _, ctx in rows)


def test_prompts_and_retracted_histories_go_in_chunks(monkeypatch):
    formed, res = watch_chunks(monkeypatch, "impl")
    check_chunks(formed, res)


def test_chunked_outputs_are_the_models_continuation(target="impl"):
    """Chunking changes how a context reaches the KV, not what is generated."""
    for rid, (r, spec) in run_to_end(target, "chunked-retract", seed=1).items():
        assert r.output() == greedy_continuation(spec.prompt, spec.max_new_tokens), rid
        assert r.inflight_middle_chunks == 0


def test_the_kv_oracle_judges_a_chunk_up_to_its_end():
    class Ref:
        results, hidden, seq_lens, confidence, outputs = {}, {}, {}, {}, {}
    oracle = StaleValueOracle(Ref(), stop_early=False)
    req = Req(3, [5, 6, 7, 8, 9], 4)
    ok = {"req": req, "step": 0, "n": 3, "checksum": checksum([5, 6, 7]), "prefill": True,
          "extend_end": 3}
    oracle("kv_context", ok)
    assert oracle.first is None
    # a chunk that attended to its own tokens only (its prefix lost)
    oracle("kv_context", {**ok, "n": 2, "checksum": checksum([8, 9]), "extend_end": 5})
    assert oracle.first is not None and oracle.first.kind == "kv_context"


def test_chunked_prefill_is_refused_where_it_is_not_modelled():
    from targets.sglang.boundary.server_args import SglangArgs
    from toys.server_args import ServerArgs
    with pytest.raises(ValueError, match="chunked prefill"):
        SglangArgs(chunked_prefill_size=4, spec_algorithm="dspark").validate()
    SglangArgs(chunked_prefill_size=4, spec_algorithm="eagle-v2").validate()
    with pytest.raises(ValueError, match="chunked_prefill_size"):
        ServerArgs(chunked_prefill_size=-1).validate()
    # the sglang target's slices are not the mirror's
    with pytest.raises(ValueError, match="spec_algorithm"):
        ServerArgs(spec_algorithm="dspark").validate()


@pytest.mark.parametrize("name", MUTATIONS)
def test_chunking_bugs_are_killed_on_every_seed(name, target="impl"):
    assert_every_seed_decides(("kv-chunked", "kv-chunked-lazy"),
                              targets.get(target).mutation(name), target)
