"""The memory pools behind the WAR barrier: ``req_to_token`` rows and the KV slots.

As in the server, with a page size of 1:

* ``ReqToTokenPool.req_to_token`` -- ``(rows, max_context_len)`` int32 on the device: row
  ``r`` lists the KV slot of each position of the request in pool row ``r``. Row 0 is
  the padding row. The row numbers themselves are handed out by the scheduler.
* ``TokenToKVPoolAllocator`` -- the free KV slots, a device tensor ``free_pages``: ``alloc``
  slices it, ``free`` concatenates to it. Both run on the *schedule* stream.
* ``ToyKVPool`` -- the KV data: one int64 per slot (the toy's "key/value" is the token
  at that position), slot 0 the padding slot dummy writes land in; and, per pool row,
  the number of positions whose KV is written (``kv_lens``), kept by the forward stream
  alone (the server relays it as ``seq_lens``).

The schedule stream writes ``req_to_token`` (``assign_req_to_token_pool``: a prefill's
prompt positions, a decode step's reserve) and frees slots (``release_kv``) while the
previous forward may still be reading rows: the WAR barrier after each launch is what
orders those writes after the forward's reads (``toys.attention`` gathers them into
private metadata before it records shared-read-done).
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from toys.kernel_op import declare_kernel
from toys.memory import staged
from toys.server_args import ServerArgs


class ReqToTokenPool:
    def __init__(self, rows: int, max_context_len: int, device) -> None:
        self.size = rows
        self.max_context_len = max_context_len
        self.req_to_token = torch.zeros((rows, max_context_len), dtype=torch.int32,
                                        device=device)
        # bumped each time a row is handed out (host memory, as upstream's): readers of
        # relayed per-row state (the DSpark confidence ring) tell row reuse by it
        self.req_generation = torch.zeros((rows,), dtype=torch.int64)


class TokenToKVPoolAllocator:
    """Upstream's page-size-1 allocator, shaped the same way (``mem_cache/allocator``)."""

    def __init__(self, size: int, device) -> None:
        self.size = size
        self.device = device
        # slot 0 is the padding slot: never handed out
        self.free_pages = torch.arange(1, size + 1, dtype=torch.int64, device=device)

    def available_size(self) -> int:
        return len(self.free_pages)  # a shape: the host knows it without a sync

    def alloc(self, need_size: int):
        if need_size > len(self.free_pages):
            return None
        select_index = self.free_pages[:need_size]
        self.free_pages = self.free_pages[need_size:]
        return select_index

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        self.free_pages = torch.cat((self.free_pages, free_index))


class SWATokenToKVPoolAllocator:
    """Upstream's allocator for hybrid sliding-window models (page size 1), mirrored: a
    full slot and an SWA slot per token from two allocators, paired by
    ``full_to_swa_index_mapping`` on the device. ``alloc`` writes the mapping and
    ``free`` reads and clears it (upstream: ``free_swa`` then ``free_full``) -- writes to
    a buffer every forward reads, made on the schedule stream, a finished request's free
    among them during result processing. The KV data lives in SWA slots; attention
    translates its row's full slots through the mapping. (No sliding-window eviction:
    the window is longer than any context here.)"""

    def __init__(self, size: int, size_swa: int, device) -> None:
        self.full = TokenToKVPoolAllocator(size, device)
        self.swa = TokenToKVPoolAllocator(size_swa, device)
        self.full_to_swa_index_mapping = torch.zeros((size + 1,), dtype=torch.int64,
                                                     device=device)

    def available_size(self) -> int:
        return min(self.full.available_size(), self.swa.available_size())

    def alloc(self, need_size: int):
        if need_size > self.available_size():
            return None
        full, swa = self.full.alloc(need_size), self.swa.alloc(need_size)
        self.full_to_swa_index_mapping[full] = swa
        return full

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        swa = self.full_to_swa_index_mapping[free_index]
        self.full_to_swa_index_mapping.index_fill_(0, free_index, 0)
        self.swa.free(swa)
        self.full.free(free_index)


class ToyKVPool:
    """The KV data: one token id per slot (an SWA slot where the allocator pairs them,
    whose ``full_to_swa_index_mapping`` the attention translates through)."""

    def __init__(self, size: int, rows: int, device, full_to_swa=None) -> None:
        self.kv_buffer = torch.zeros((size + 1,), dtype=torch.int64, device=device)
        self.kv_lens = torch.zeros((rows,), dtype=torch.int64, device=device)
        self.full_to_swa = full_to_swa

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """The KV pool's move (upstream's ``move_kv_cache``): an EAGLE tree draft's
        accepted path to the front of its window, on the current stream."""
        self.kv_buffer[tgt_loc] = self.kv_buffer[src_loc]


def mirror_allocator(layout: str, size: int, device):
    """specrace's allocator for a KV layout: "full" (page size 1) or "swa" (full slots
    paired with as many SWA slots)."""
    if layout == "swa":
        return SWATokenToKVPoolAllocator(size, size, device)
    return TokenToKVPoolAllocator(size, device)


def finish_pools(req_to_token_pool, allocator, args, device):
    """What every server's pools get around the rows and the allocator: the KV data (in
    SWA slots where the allocator pairs them), the scheduler's bookkeeping -- and a sync:
    they were made on the loading stream, and every stream uses them from now on (as the
    weights). ``(KVCacheManager, ToyKVPool)``."""
    kv = ToyKVPool(args.kv_pool_size, args.req_pool_size, device,
                   getattr(allocator, "full_to_swa_index_mapping", None))
    torch.get_device_module(device).synchronize()
    # the columns one step writes past its sequence: its D verify positions, or a tree
    # draft's topk x steps (the sglang target's EAGLE v2 slice with topk > 1)
    return KVCacheManager(req_to_token_pool, allocator, args.draft_span(), args.admission), kv


# --- the schedule stream's write: one kernel, as upstream's ``assign_req_to_token_pool``

def _assign_kernel(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                   start: torch.Tensor, end: torch.Tensor, out_cache_loc: torch.Tensor
                   ) -> None:
    """Row ``req_pool_indices[i]``, columns ``start[i]:end[i]`` <- the next ``end[i] -
    start[i]`` entries of ``out_cache_loc`` (requests in order)."""
    width = req_to_token.shape[1]
    n = end - start
    offset = torch.cumsum(n, 0) - n  # where each request's slots begin in out_cache_loc
    col = torch.arange(width, device=req_to_token.device)[None, :]
    inside = (col >= start[:, None]) & (col < end[:, None])
    src = (offset[:, None] + col - start[:, None]).clamp(0, max(out_cache_loc.numel() - 1, 0))
    rows = req_to_token[req_pool_indices]
    vals = out_cache_loc[src] if out_cache_loc.numel() else torch.zeros_like(rows)
    req_to_token[req_pool_indices] = torch.where(inside, vals.to(req_to_token.dtype), rows)


declare_kernel("assign_req_to_token_pool(Tensor req_pool_indices, Tensor(a!) req_to_token, "
               "Tensor start, Tensor end, Tensor out_cache_loc) -> ()",
               lambda *a: _assign_kernel(*a))


def assign_req_to_token_pool(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                             start: Sequence[int], end: Sequence[int],
                             out_cache_loc: torch.Tensor) -> None:
    """On the current (schedule) stream: one launch writing the new columns of each row.
    ``start`` / ``end`` are host lists, staged and copied ``non_blocking`` as upstream
    does (a blocking copy would sync the schedule stream, which the WAR barrier has
    chained to the previous forward)."""
    device = req_to_token.device
    se = staged(torch.tensor([list(start), list(end)], dtype=torch.int64), device)
    se = se.to(device, non_blocking=True)
    torch.ops.specrace.assign_req_to_token_pool(req_pool_indices, req_to_token, se[0], se[1],
                                                out_cache_loc)


def alloc_kv(allocator, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
             start: List[int], end: List[int]) -> bool:
    """Schedule stream: slots for columns ``start[i]:end[i]`` of each row (a prefill's
    prompt, a decode step's reserve), written into ``req_to_token``. False when the pool
    cannot hold them (nothing is taken then)."""
    need = sum(e - s for s, e in zip(start, end))
    if need == 0:
        return True
    out_cache_loc = allocator.alloc(need)
    if out_cache_loc is None:
        return False
    assign_req_to_token_pool(req_pool_indices, req_to_token, start, end, out_cache_loc)
    return True


def release_kv(allocator, req_to_token: torch.Tensor, row: int, allocated: int) -> None:
    """Schedule stream, when a request finishes: its slots back to the allocator (read
    from its row, as upstream's ``release_kv_cache`` does)."""
    if allocated > 0:
        allocator.free(req_to_token[row, :allocated].to(torch.int64))


class KVCacheManager:
    """The scheduler's side of the pools, on the schedule stream: what each request
    holds (host bookkeeping, never a device read) and the allocations that follow it.

    Admission (``ServerArgs.admission``): under "lifetime" a request is admitted only
    when its whole lifetime fits the pool (prompt, budget and the over-allocation below),
    so an allocation never fails mid-run; under "optimistic" when its prefill and first
    decode reserve fit what is free now -- decode steps then run the pool short, and the
    scheduler retracts running requests under that pressure (upstream's
    ``retract_decode``; ``toys.requests.retract_for_memory``). Finished and
    retracted requests give their slots back at once, and waiting ones take them --
    slots are reused within a run whenever the pool is small.

    Under overlap the host commits a step one iteration late, so a decode launch
    reserves ``2*D`` columns past the last committed KV length: the step in flight may
    accept up to ``D``, and this step writes ``D`` draft positions after that."""

    def __init__(self, req_to_token_pool, allocator, draft_token_num: int,
                 admission: str = "lifetime") -> None:
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.D = draft_token_num
        self.admission = admission
        self.capacity = allocator.available_size()
        self.reserved = 0  # lifetimes reserved ("lifetime" admission)
        self._admitting = 0  # slots the prefill being formed will take ("optimistic")
        # the request pool's free rows (row 0 is the padding row), handed out in order
        self._free_rows = list(range(1, req_to_token_pool.req_to_token.shape[0]))
        # each row's hand-out count, where the pool keeps one (upstream's from 0.5.16, when
        # the DSpark relay that reads it came in; before that nothing reads one)
        self._generation = getattr(req_to_token_pool, "req_generation", None)

    @property
    def free_rows(self) -> List[int]:
        return self._free_rows

    @property
    def req_to_token(self) -> torch.Tensor:
        return self.req_to_token_pool.req_to_token

    def lifetime(self, req) -> int:
        """The most columns ``req`` can hold: its prompt, its budget (the last step may
        accept up to ``D`` past it), and the decode reserve."""
        return len(req.prompt) + req.max_new_tokens + 3 * self.D

    def prefill_need(self, req) -> int:
        """The slots ``req``'s prefill takes: its context and the first decode reserve."""
        return len(req.context()) + 2 * self.D

    def fits(self, req) -> bool:
        need = self.lifetime(req)
        if need > min(self.req_to_token.shape[1], self.capacity):
            raise ValueError(f"request {req.rid} needs {need} KV positions: more than the "
                             f"context length ({self.req_to_token.shape[1]}) or the KV "
                             f"pool ({self.capacity}) holds")
        if self.admission == "optimistic":
            return self._admitting + self.prefill_need(req) <= self.allocator.available_size()
        return self.reserved + need <= self.capacity

    def can_admit(self, req) -> bool:
        """A free row, and room in the pool for ``req`` (``fits``)."""
        return bool(self.free_rows) and self.fits(req)

    def admit(self, req) -> None:
        """``req`` gets a row (``req.pool_idx``) and its reserve: its lifetime's, or
        nothing beyond its prefill's slots (optimistic admission)."""
        req.pool_idx = self.take_row(req)
        if self.admission == "optimistic":
            req.kv_reserve = 0
            self._admitting += self.prefill_need(req)
        else:
            req.kv_reserve = self.lifetime(req)
        self.reserved += req.kv_reserve
        req.kv_allocated = 0

    def begin_extend(self, req, end: int) -> None:
        """A prefill (or a chunk of one) writes ``req``'s KV up to ``end``."""
        req.extend_end = req.kv_committed = end

    def checkpoint(self, req) -> None:
        """Between two chunks (``chunked_req`` at the next scheduling point): the next
        extend resumes where the last one ended (upstream's ``checkpoint_kv_cache``)."""
        req.prefix_len = req.extend_end

    def take_row(self, req) -> int:
        row = self._free_rows.pop(0)
        if self._generation is not None:
            self._generation[row] += 1
        return row

    def free_row(self, req) -> None:
        self._free_rows.append(req.pool_idx)

    def launch_columns(self, reqs) -> Tuple[List[int], List[int]]:
        """Before a launch (prefill or decode): each row's columns ``start -> end``, from
        what it holds up to its last committed KV length + ``2*D``."""
        start = [r.kv_allocated for r in reqs]
        return start, [max(s, r.kv_committed + 2 * self.D) for s, r in zip(start, reqs)]

    def decode_need(self, reqs) -> int:
        """The slots the next decode launch of ``reqs`` takes (``launch_columns``)."""
        start, end = self.launch_columns(reqs)
        return sum(e - s for s, e in zip(start, end))

    def alloc_for_launch(self, reqs, req_pool_indices: torch.Tensor) -> None:
        start, end = self.launch_columns(reqs)
        if not alloc_kv(self.allocator, self.req_to_token, req_pool_indices, start, end):
            raise RuntimeError("KV pool exhausted despite the admission reserve")
        for r, e in zip(reqs, end):
            r.kv_allocated = e

    def prepare_extend(self, batch) -> None:
        """A prefill's rows and columns, as ``prepare_for_extend`` allocates them: the
        batch's ``req_pool_indices`` (and their host copy) from the rows its requests
        were admitted with, and each row's columns up to its chunk's end + ``2*D``."""
        pool = [r.pool_idx for r in batch.reqs]
        batch.req_pool_indices_cpu = torch.tensor(pool, dtype=torch.int64)
        batch.req_pool_indices = torch.tensor(pool, dtype=torch.int64,
                                              device=self.req_to_token.device)
        self._admitting = 0
        self.alloc_for_launch(batch.reqs, batch.req_pool_indices)

    def prepare_decode(self, batch) -> None:
        """A decode launch's reserve (``prepare_for_decode``)."""
        self.alloc_for_launch(batch.reqs, batch.req_pool_indices)

    def on_commit(self, req, accept_len: int, prefill: bool) -> None:
        """A step's result reached the host: a verify's accepted path now has KV (a
        prefill's output token does not, until the next step writes it)."""
        if not prefill:
            req.kv_committed += accept_len

    def retract(self, req) -> None:
        """A retraction gives back what a finish does (``release_req``)."""
        self.release(req)

    def release(self, req) -> None:
        """Its slots back to the allocator, then its row (``release_kv_cache``).
        ``kv_allocated`` keeps what the row held: a
        step already formed -- the one a request runs past its finish -- still sizes its
        metadata from it."""
        release_kv(self.allocator, self.req_to_token, req.pool_idx, req.kv_allocated)
        self.free_row(req)
        self.released(req)

    def released(self, req) -> None:
        """``req`` gave its row and slots back: its reserve is free again."""
        self.reserved -= req.kv_reserve
        req.kv_reserve = 0


def build_kv_cache(args: ServerArgs, device) -> Tuple[KVCacheManager, ToyKVPool]:
    """The pools of a server (impl's own classes; the sglang target builds upstream's
    where its release has them): ``kv_layout`` "full", or "swa" (slots paired with SWA
    slots through a mapping, as a hybrid sliding-window model's)."""
    pool = ReqToTokenPool(args.req_pool_size, args.context_len, device)
    return finish_pools(pool, mirror_allocator(args.kv_layout, args.kv_pool_size, device),
                        args, device)
