"""A request's row and slots through upstream's own functions on the sglang target:
``alloc_for_extend`` (rows through ``alloc_req_slots``), ``alloc_for_spec_decode``
over the disabled tree the release's factory builds, ``checkpoint_kv_cache`` between chunks, ``release_kv_cache`` -- what they hand out and take back, under upstream's loop."""
from __future__ import annotations

import contextlib

import pytest

from harness.runtime import open_runtime
from harness.trials.drive import server_args
from scenarios.registry import get


def _pools(layout="full"):
    from targets.sglang.boundary.server_args import SglangArgs
    from targets.sglang.engine.pools import build_pools
    return build_pools(SglangArgs(req_pool_size=4, kv_pool_size=64, draft_token_num=4,
                                  kv_layout=layout), "cpu")


def test_the_release_functions_run_where_the_release_has_them(sglang):
    """Upstream's pool operations, over the tree cache the release's own factory builds
    for a ``--disable-radix-cache`` server: on 0.5.23 a disabled ``UnifiedRadixCache``,
    not the ``RadixCache`` class a server no longer gets."""
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from targets.sglang.boundary.server_args import SglangArgs
    from targets.sglang.engine import kv_lifecycle
    args = SglangArgs(req_pool_size=4, kv_pool_size=64, draft_token_num=4)
    pools = _pools()
    assert kv_lifecycle.fits() and pools.lifecycle == "upstream"
    assert type(pools.manager) is kv_lifecycle.UpstreamKVCache
    with open_runtime("sim", trace=False) as rt, sglang.variant(args, rt.device):
        tree = pools.manager.tree_cache  # built in the run: the factory reads its config
    assert type(tree) is UnifiedRadixCache and tree.disable
    assert sglang.describe()["kv_lifecycle"] == "upstream"
    # the SWA layout's allocator is specrace's mirror: the lifecycle stays specrace's
    assert _pools("swa").lifecycle == "specrace"


@contextlib.contextmanager
def _loop(sglang, **kw):
    """Upstream's loop over tiny pools on the simulator, in the target's run context (its
    prefill formation is used here; the loop is not stepped)."""
    from targets.sglang.boundary.server_args import SglangArgs
    args = SglangArgs(**{"req_pool_size": 4, "kv_pool_size": 64, "draft_token_num": 4, **kw})
    with open_runtime("sim", trace=False) as rt, sglang.variant(args, rt.device):
        yield sglang.scheduler(args, rt.device)


def _prefill(loop, *reqs):
    loop.waiting.extend(reqs)
    return loop.new_prefill_batch()


def test_rows_come_back_last_freed_first_and_slots_all_return(sglang):
    """A prefill's rows and slots through upstream's ``alloc_for_extend``; upstream's
    ReqToTokenPool hands a freed row out again first (impl's mirror hands rows out in
    order): a finished request's row goes to the very next admission."""
    from targets.sglang.engine.requests import Req
    a, b, c = (Req(i, [5, 6, 7], 4) for i in range(3))
    with _loop(sglang) as loop:
        kv = loop.kv_cache
        capacity = kv.allocator.available_size()
        batch = _prefill(loop, a, b)
        assert batch.req_pool_indices_cpu.tolist() == [a.pool_idx, b.pool_idx]
        # alloc_for_extend allocates the prompt exactly (the decode reserve comes with
        # the first decode's prepare_for_decode)
        assert a.kv.kv_allocated_len == a.kv.kv_committed_len == 3 == a.kv_allocated
        row = kv.req_to_token[a.pool_idx, :a.kv_allocated]
        assert len(set(row.tolist())) == 3 and 0 not in row.tolist()
        # a decode's reserve (upstream's alloc_for_spec_decode)
        kv.alloc_for_launch([a], batch.req_pool_indices[:1])
        assert a.kv.kv_allocated_len == 3 + 2 * 4 == a.kv_allocated
        kv.on_commit(a, 2, prefill=False)  # a verify's accepted path: KV past the prompt
        kv.release(a)
        assert not a.kv.holds_kv and a.kv.is_kv_released
        _prefill(loop, c)
        assert c.pool_idx == a.pool_idx != b.pool_idx
        for r in (b, c):
            kv.release(r)
        assert kv.allocator.available_size() == capacity  # committed and reserved tails
        assert sorted(kv.free_rows) == [1, 2, 3] and kv.reserved == 0


def test_a_chunk_keeps_its_row_and_its_prefix(sglang):
    """The next chunk of a chunked prefill: ``alloc_for_extend`` keeps the request's row,
    reads its prefix back from it and writes it again before the new chunk's slots."""
    from targets.sglang.engine.requests import Req
    long = Req(0, list(range(1, 11)), 4)
    with _loop(sglang, chunked_prefill_size=4) as loop:
        kv = loop.kv_cache
        _prefill(loop, long)
        assert loop.chunked_req is long and long.kv_allocated == 4
        first = kv.req_to_token[long.pool_idx, :4].tolist()
        row = long.pool_idx
        kv.checkpoint(long)  # upstream's checkpoint_kv_cache: the next chunk resumes at 4
        assert long.prefix_len == 4
        batch = _prefill(loop)
        assert batch.reqs == [long] and long.pool_idx == row and long.kv_allocated == 8
        slots = kv.req_to_token[row, :8].tolist()
        assert slots[:4] == first and len(set(slots)) == 8 and 0 not in slots


@pytest.mark.parametrize("policy", ["eager", "lazy"])
def test_a_run_under_upstreams_loop_gives_every_row_and_slot_back(sglang, policy):
    from harness.policies import parse_policy
    from targets.sglang.engine import kv_lifecycle
    sc = get("kv-row-reuse")
    wl = sc.workload(0)
    args = server_args(wl, {}, sglang)
    with open_runtime("sim", parse_policy(policy), trace=False) as rt, \
            sglang.variant(args, rt.device):
        sched = sglang.scheduler(args, rt.device)
        kv = sched.kv_cache
        assert isinstance(kv, kv_lifecycle.UpstreamKVCache)
        capacity = kv.allocator.available_size()
        decodes = []
        prepare = kv.prepare_decode

        def prepare_decode(batch):  # upstream's reserve is the one the admission sized
            before = [r.kv.kv_allocated_len for r in batch.reqs]
            prepare(batch)
            decodes.append(len(batch.reqs))
            for r, b in zip(batch.reqs, before):
                assert r.kv_allocated == max(b, r.kv_committed + 2 * kv.D), r.rid
        kv.prepare_decode = prepare_decode
        reqs = [sglang.request(s.rid, s.prompt, s.max_new_tokens) for s in wl.requests]
        for r in reqs:
            sched.add_request(r)
        rows = set()
        while sched.has_work() and sched.iteration < 400:
            sched.step()
            rows.update(r.pool_idx for r in reqs if r.launched)
        sched.close()
        assert not sched.has_work()
        assert all(r.kv.is_kv_released and not r.kv.holds_kv for r in reqs)
        assert kv.allocator.available_size() == capacity and kv.reserved == 0
        assert sorted(kv.free_rows) == list(range(1, wl.req_pool_size))
    # more requests than rows: rows were reused within the run
    assert len(reqs) > len(rows) and len(decodes) > 10


def test_one_prefill_admits_no_more_requests_than_free_rows(sglang):
    """Upstream's rows are taken by ``alloc_for_extend``, after the whole prefill is
    formed: the admissions of one prefill count the rows they have promised."""
    from targets.sglang.engine.requests import Req
    reqs = [Req(i, [5, 6, 7], 2) for i in range(5)]
    with _loop(sglang, kv_pool_size=512) as loop:  # room for all five: rows bound it
        batch = _prefill(loop, *reqs)
        assert [r.rid for r in batch.reqs] == [0, 1, 2]  # the pool's three rows
        assert sorted(r.pool_idx for r in batch.reqs) == [1, 2, 3]
        assert [r.rid for r in loop.waiting] == [3, 4] and not loop.kv_cache.free_rows


def test_the_older_releases_request_has_upstreams_extend_range(monkeypatch):
    """0.5.17-0.5.21's run_batch reads ``req.extend_range.length`` for a batch returning
    hidden states: specrace's request for releases before 0.5.22 answers it from its own
    extend (``ngram-hidden-readback`` crashed in its reference run on 0.5.19 without it)."""
    import collections
    from targets.sglang.boundary import upstream
    from targets.sglang.engine.requests import Req
    Range = collections.namedtuple("Range", "start end")
    monkeypatch.setattr(upstream, "Range", Range)
    req = Req(1, [3, 4, 5, 6], 4)
    req.prefix_len, req.extend_end = 1, 4
    assert req.extend_range == Range(1, 4)
    req.extend_end = None  # as a retraction leaves it
    assert req.extend_range is None


def test_a_batch_samples_through_upstreams_sampling_batch_info(sglang):
    """Where the requests are upstream's ``Req``, a batch's sampling state is upstream's
    ``SamplingBatchInfo`` (built from the requests' greedy ``SamplingParams``) and the
    loop's merge and filter run upstream's on it: its per-request tensors follow the rows."""
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from targets.sglang.engine.requests import make_request
    a, b, c = (make_request(i, [5, 6, 7], 4) for i in range(3))
    with _loop(sglang) as loop:
        first = _prefill(loop, a, b)
        info = first.sampling_info
        assert type(info) is SamplingBatchInfo and info.is_all_greedy
        assert info.top_ks.tolist() == [1, 1]
        first.merge_batch(_prefill(loop, c))
        assert first.sampling_info.top_ks.tolist() == [1, 1, 1]  # upstream's merge ran
        first.filter_batch(keep_indices=[0, 2])
        assert first.sampling_info.temperatures.shape == (2, 1)  # and its filter
