"""A request's KV lifecycle through upstream's own functions, where the release has them.

``UpstreamKVCache`` is the scheduler's side of the pools (``toys.mem_cache.KVCacheManager``:
the admission reserve and the decode over-allocation stay ours -- upstream's
``PrefillAdder`` needs the whole server) with every touch of the pools made by upstream:

* the row: ``alloc_req_slots`` -> ``ReqToTokenPool.alloc`` binds ``req.kv`` (upstream's
  ``ReqKvInfo``) to a row, bumps its generation, and hands rows back last-freed-first;
* each decode launch: ``ScheduleBatch.prepare_for_decode`` -> ``spec_prepare_for_decode``
  -> ``eagle_prepare_for_decode`` (NGRAM and EAGLE share it) -> ``alloc_for_spec_decode``:
  ``alloc_token_slots`` on the disabled tree a server with ``--disable-radix-cache``
  builds (``disabled_tree_cache``: the release's own factory picks it -- 0.5.23's
  ``UnifiedRadixCache``), then the ``assign_req_to_token_pool`` write of the new
  columns on the schedule stream (the WAR barrier's reason to exist);
* between two chunks of a chunked prefill: ``checkpoint_kv_cache`` (what upstream's
  ``stash_chunked_request`` calls), which sets where the next chunk resumes;
* the finish: ``release_kv_cache(req, tree_cache, checkpoint=True)``, as the decode result
  processor calls it -- the committed range and the over-allocated tail read back from
  the row (``free_kv_row``), the slots freed, the row given back, ``req.kv`` released.

``owned_kv_len`` is upstream's ``Req`` method, run on our request. The prefill goes
through ``alloc_for_spec_decode`` too (columns ``0 ->`` prompt + reserve): upstream's
``alloc_for_extend`` lays out ``prefix_lens`` / ``extend_lens`` from a prefix match and the
real prompt, which the toy prefill (last prompt token only) does not have.

What the release must have for this: ``fits()`` (read off signatures and classes), and
the run upstream's pools in the full layout (the SWA layout's allocator is specrace's
mirror, which has not upstream's segment frees); otherwise ``KVCacheManager`` does the
same on the pools (``Pools.lifecycle`` says which). Upstream's Triton ``assign_req_to_token_pool`` has no simulator
path and is not in a CUDA trace: ``install()`` binds specrace's declared op of the same
effect in its place (``toys.mem_cache``), as ``eagle_kernels`` does for EAGLE's kernels.
"""
from __future__ import annotations

import contextlib
import inspect
import types
from typing import Iterator, List

import torch

from seams import process
from toys.mem_cache import KVCacheManager
from toys.memory import staged

_ALLOC = "sglang.srt.mem_cache.allocation"


def fits() -> bool:
    """Has this release the lifecycle functions with 0.5.23's shapes?"""
    try:
        from sglang.srt.managers.schedule_batch import Req, ReqKvInfo  # noqa: F401
        from sglang.srt.mem_cache.allocation import alloc_for_extend, alloc_for_spec_decode
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: F401
        from sglang.srt.mem_cache.common import checkpoint_kv_cache  # noqa: F401
        from sglang.srt.mem_cache.common import release_kv_cache
        from sglang.srt.mem_cache.registry import (  # noqa: F401
            TreeCacheBuildContext, create_tree_cache)
        from sglang.srt import runtime_context  # noqa: F401
        inspect.signature(release_kv_cache).bind(None, None, checkpoint=True)
        inspect.signature(alloc_for_extend).bind(None)
        inspect.signature(alloc_for_spec_decode).bind(
            None, None, reqs=[], req_pool_indices=None, cur_kv_lens=None,
            cur_kv_lens_cpu=None, nxt_kv_lens=None, nxt_kv_lens_cpu=None,
            num_needed_tokens=0)
        return hasattr(Req, "owned_kv_len")
    except (ImportError, AttributeError, TypeError):
        return False


def assign_req_to_token_pool_func(req_pool_indices, req_to_token, start_offset, end_offset,
                                  out_cache_loc, batch_size) -> None:
    """Upstream's launcher's signature: rows' columns ``[start, end)`` <- the slots."""
    torch.ops.specrace.assign_req_to_token_pool(req_pool_indices, req_to_token,
                                                start_offset, end_offset, out_cache_loc)


def install() -> None:
    """Bind the declared write where ``alloc_for_spec_decode`` looks it up (idempotent)."""
    import importlib
    import toys.mem_cache  # noqa: F401  (declares torch.ops.specrace.assign_req_to_token_pool)
    importlib.import_module(_ALLOC).assign_req_to_token_pool_func = \
        assign_req_to_token_pool_func
    process.note("sglang-kernel-seams")


def disabled_tree_cache(req_to_token_pool, allocator):
    """The tree cache a one-GPU server started with ``--disable-radix-cache`` builds, chosen
    by the release's own factory (``registry.create_tree_cache``, as
    ``kv_cache_builder`` calls it): on 0.5.22 and 0.5.23 a disabled ``UnifiedRadixCache``
    (``RadixCache`` is no longer what a server gets). The build context is a one-rank,
    full-attention, no-HiCache server's; the run's server args are current."""
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache
    from targets.sglang.boundary import upstream
    params = CacheInitParams(disable=True, req_to_token_pool=req_to_token_pool,
                             token_to_kv_pool_allocator=allocator, page_size=1)
    return create_tree_cache(TreeCacheBuildContext(
        server_args=upstream.current_server_args(), params=params, is_hybrid_swa=False,
        is_hybrid_ssm=False, enable_hierarchical_cache=False, disable_radix_cache=True,
        tp_worker=None, model_config=None, tp_size=1, tp_rank=0, tp_group=None))


class UpstreamKVCache(KVCacheManager):
    """``KVCacheManager`` whose pool operations are upstream's (module docstring)."""

    def __init__(self, req_to_token_pool, allocator, draft_token_num: int,
                 admission: str = "lifetime") -> None:
        super().__init__(req_to_token_pool, allocator, draft_token_num, admission)
        self._pending_rows = 0  # admitted into the prefill being formed, no row yet
        install()
        self._tree_cache = None

    @property
    def tree_cache(self):
        """Built when a run first asks (``disabled_tree_cache``): the release's factory
        reads the run's server config, which pools built outside a run do not have."""
        if self._tree_cache is None:
            self._tree_cache = disabled_tree_cache(self.req_to_token_pool, self.allocator)
        return self._tree_cache

    @property
    def free_rows(self) -> List[int]:
        return self.req_to_token_pool.free_slots  # upstream's pool keeps them

    def take_row(self, req) -> int:
        from sglang.srt.managers.schedule_batch import Req, ReqKvInfo
        if not isinstance(req, Req):  # specrace's request (requests.make_request)
            req.kv = ReqKvInfo()
            # upstream's Req methods the release path calls, bound to our request here,
            # not on its class: a mutation patches the method on upstream's class, and a
            # binding made at class creation would keep the original (the data they
            # read: requests.Req)
            req.owned_kv_len = types.MethodType(Req.owned_kv_len, req)
            req.reset_for_retract = types.MethodType(Req.reset_for_retract, req)
        self._pending_rows += 1
        return -1  # the row comes with the extend's allocation (prepare_extend)

    def can_admit(self, req) -> bool:
        """A row not promised to a request admitted into the prefill being formed."""
        return len(self.free_rows) > self._pending_rows and self.fits(req)

    def prepare_extend(self, batch) -> None:
        """Upstream's ``alloc_for_extend`` on the prefill batch, as its
        ``prepare_for_extend`` calls it: rows for the requests not holding one
        (``alloc_req_slots``: a chunk after the first keeps its own), slots for each
        chunk (``alloc_token_slots``), and the row write -- the prefix read back from the
        row and written again with the chunk's slots after it (``write_cache_indices``,
        its host-looped path: ``server_config`` names a backend without Triton). It lays
        out the real extend; the toy forward's batch keeps its one token a request."""
        from sglang.srt.mem_cache.allocation import alloc_for_extend
        toy = batch.prefix_lens, batch.extend_lens, batch.extend_num_tokens
        batch.prefix_lens = [r.prefix_len for r in batch.reqs]
        batch.extend_lens = [r.extend_end - r.prefix_len for r in batch.reqs]
        batch.extend_num_tokens = sum(batch.extend_lens)
        batch.tree_cache = self.tree_cache
        try:
            _, batch.req_pool_indices, batch.req_pool_indices_cpu = alloc_for_extend(batch)
        finally:
            batch.prefix_lens, batch.extend_lens, batch.extend_num_tokens = toy
            self._pending_rows = self._admitting = 0
        for r in batch.reqs:
            r.pool_idx, r.kv_allocated = r.kv.req_pool_idx, r.kv.kv_allocated_len

    def free_row(self, req) -> None:
        pass  # release_kv_cache gave it back

    def checkpoint(self, req) -> None:
        """Upstream's ``checkpoint_kv_cache`` (what ``stash_chunked_request`` calls): the
        disabled tree publishes nothing; the next extend resumes at ``extend_end``."""
        from sglang.srt.mem_cache.common import checkpoint_kv_cache
        checkpoint_kv_cache(req, self.tree_cache)

    def alloc_for_launch(self, reqs, req_pool_indices: torch.Tensor) -> None:
        from sglang.srt.mem_cache.allocation import alloc_for_spec_decode
        cur, nxt = self.launch_columns(reqs)
        need = sum(n - c for c, n in zip(cur, nxt))
        if need > self.allocator.available_size():
            raise RuntimeError("KV pool exhausted despite the admission reserve")
        # the lengths on the device as upstream's callers have them: staged host copies,
        # non_blocking (a blocking copy would sync the fenced schedule stream)
        device = req_pool_indices.device
        cur_cpu = staged(torch.tensor(cur, dtype=torch.int64), device)
        nxt_cpu = staged(torch.tensor(nxt, dtype=torch.int64), device)
        alloc_for_spec_decode(
            self.tree_cache, self.req_to_token_pool, reqs=list(reqs),
            req_pool_indices=req_pool_indices,
            cur_kv_lens=cur_cpu.to(device, non_blocking=True), cur_kv_lens_cpu=cur_cpu,
            nxt_kv_lens=nxt_cpu.to(device, non_blocking=True), nxt_kv_lens_cpu=nxt_cpu,
            num_needed_tokens=need)
        for r in reqs:
            r.kv_allocated = r.kv.kv_allocated_len

    def prepare_decode(self, batch) -> None:
        """Upstream's ``ScheduleBatch.prepare_for_decode`` on the decode batch: for NGRAM
        and EAGLE it routes to ``eagle_prepare_for_decode`` (each row's columns up to its
        committed length plus ``get_alloc_reserve_per_decode()``, through
        ``alloc_for_spec_decode``). DSpark's route is its draft input's, which the toy
        worker does not carry: there the same allocation is made directly."""
        if batch.spec_algorithm.is_dflash_family():
            return super().prepare_decode(batch)
        batch.tree_cache = self.tree_cache
        batch.prepare_for_decode()
        for r in batch.reqs:
            r.kv_allocated = r.kv.kv_allocated_len

    def on_commit(self, req, accept_len: int, prefill: bool) -> None:
        super().on_commit(req, accept_len, prefill)
        req.kv.kv_committed_len = req.kv_committed  # upstream's record follows ours

    def retract(self, req) -> None:
        """Upstream's ``release_req`` (what ``retract_decode`` calls per request): the row
        and slots back through ``release_kv_cache(checkpoint=False)``, then upstream's
        ``Req.reset_for_retract`` on the request."""
        from sglang.srt.managers.schedule_batch import release_req
        release_req(req=req, remaing_req_count=0, req_to_token_pool=self.req_to_token_pool,
                    token_to_kv_pool_allocator=self.allocator, tree_cache=self.tree_cache,
                    hisparse_coordinator=None)
        self.released(req)

    def retract_for_memory(self, batch) -> List:
        """Upstream's ``ScheduleBatch.check_decode_mem`` and ``retract_decode`` (the core of
        its ``update_running_batch``): when the next decode's reserve does not fit, the
        least preferred requests are released through ``release_req`` and filtered out of
        the batch, one kept. Ours after it: the reserve bookkeeping and the scheduler's
        (``toys.requests.note_retracted``). The retracted requests."""
        from toys.requests import note_retracted
        batch.tree_cache = self.tree_cache
        if batch.check_decode_mem():
            return []
        retracted, _, aborted = batch.retract_decode()
        if aborted:  # even the last request does not fit: upstream aborts it
            raise RuntimeError(f"upstream's retract_decode aborted {len(aborted)} "
                               f"request(s): the KV pool cannot hold the last one")
        for req in retracted:
            self.released(req)
            note_retracted(req)
        return retracted

    def release(self, req) -> None:
        from sglang.srt.mem_cache.common import release_kv_cache
        release_kv_cache(req, self.tree_cache, checkpoint=True)
        self.released(req)


@contextlib.contextmanager
def server_context(args, device) -> Iterator[None]:
    """What the lifecycle functions read of the server's config (the decode reserve, the
    page size; an over-allocated tail is freed only under speculative decoding), and
    upstream's model runner (``targets.sglang.runner``: the spec algorithm, the page
    size, the graph config), for an NGRAM run: upstream's runtime context for
    ``speculative_algorithm="NGRAM"`` (``upstream.server_config``), where the release
    runs either. The EAGLE and DSpark slices make their own current."""
    from targets.sglang.runner import build as runner
    if args.spec_algorithm in ("eagle-v2", "dspark") or not (fits() or runner.fits()):
        yield
        return
    from targets.sglang.boundary import upstream
    from targets.sglang.runner import ranks
    with upstream.server_config("NGRAM", device,
                                   speculative_num_draft_tokens=args.draft_token_num), \
            ranks.scope():
        yield
