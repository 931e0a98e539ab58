"""The memory pools of the sglang target: upstream's classes where the release has them.

``ReqToTokenPool`` (the ``req_to_token`` rows the forward gathers and the schedule stream
rewrites; its ``req_generation`` is what the confidence relay tells row reuse by) and
``TokenToKVPoolAllocator`` (page size 1: ``alloc`` slices and ``free`` concatenates the
device tensor ``free_pages``, on the schedule stream) are upstream's, constructed as the
server does. The SWA layout (``kv_layout="swa"``) pairs slots through specrace's mirror
of upstream's ``SWATokenToKVPoolAllocator`` (upstream's needs a hybrid model's SWA KV
pool and GPU kernels), over upstream's rows. Where a release's constructors differ, specrace's mirrors of them
(``toys.mem_cache``) stand in, and ``origin`` says so (``specrace list --target sglang``,
each report's target info).

Ours, as in ``impl/``: the KV data (``ToyKVPool``: one token id per slot, the toy's
attention reads and writes it), the host bookkeeping of what each request holds
(``KVCacheManager``: the admission reserve and the decode over-allocation that
upstream's ``alloc_for_spec_decode`` makes), and the write of new columns
(``assign_req_to_token_pool``: a declared op in place of upstream's Triton kernel of the
same name, which has no simulator path).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Tuple

import torch

from toys import mem_cache

from targets.sglang.engine import kv_lifecycle


def _upstream_pools(args, device) -> Tuple[Any, Any]:
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    # ``size`` rows plus upstream's own padding row 0: the workload's pool has that row
    pool = ReqToTokenPool(size=args.req_pool_size - 1, max_context_len=args.context_len,
                          device=str(device), enable_memory_saver=False)
    if tuple(pool.req_to_token.shape) != (args.req_pool_size, args.context_len):
        raise TypeError(f"ReqToTokenPool made rows {tuple(pool.req_to_token.shape)}")
    if args.kv_layout == "swa":
        # upstream's SWA allocator needs DSV4/GPT-OSS's SWA KV pool and its GPU kernels:
        # specrace's mirror of it, over upstream's rows
        allocator = mem_cache.mirror_allocator("swa", args.kv_pool_size, device)
    else:
        allocator = TokenToKVPoolAllocator(args.kv_pool_size, torch.int64, str(device), None,
                                           need_sort=False)
    return pool, allocator


@dataclass
class Pools:
    req_to_token_pool: Any
    allocator: Any
    manager: mem_cache.KVCacheManager
    kv: mem_cache.ToyKVPool
    origin: str  # "upstream", or "specrace" where the release's constructors differ
    # whose functions allocate, write and release a request's row and slots:
    # "upstream" (targets.sglang.engine.kv_lifecycle) or "specrace" (toys.mem_cache)
    lifecycle: str = "specrace"


def upstream_pools_fit() -> bool:
    """Does this release construct the two pools as ``_upstream_pools`` does? (Read off
    their signatures: the same answer ``build_pools`` gets by constructing them.)"""
    import inspect
    try:
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        inspect.signature(ReqToTokenPool).bind(size=1, max_context_len=1, device="cpu",
                                               enable_memory_saver=False)
        inspect.signature(TokenToKVPoolAllocator).bind(1, torch.int64, "cpu", None,
                                                       need_sort=False)
    except (ImportError, TypeError):
        return False
    return True


def build_pools(args, device) -> Pools:
    dev = torch.device(device)
    try:
        pool, allocator = _upstream_pools(args, dev)
        origin = "upstream"
    except (ImportError, AttributeError, TypeError):
        pool = mem_cache.ReqToTokenPool(args.req_pool_size, args.context_len, dev)
        allocator = mem_cache.mirror_allocator(args.kv_layout, args.kv_pool_size, dev)
        origin = "specrace"
    manager, kv = mem_cache.finish_pools(pool, allocator, args, dev)
    if origin == "upstream" and args.kv_layout != "swa" and kv_lifecycle.fits():
        manager = kv_lifecycle.UpstreamKVCache(pool, allocator, manager.D, args.admission)
        return Pools(pool, allocator, manager, kv, origin, lifecycle="upstream")
    return Pools(pool, allocator, manager, kv, origin)
