"""The toy world's requests, as every engine over it keeps them: a request's state, how a
prefill is formed from waiting requests (each given a request-pool row and its KV reserve,
``form_prefill``), its extend staged on the device (``stage_extend``), chunked prefill
(``chunked_prefill_size``: the request a prefill cuts short is the scheduler's
``chunked_req`` -- kept out of the running batch, first in the next prefill, its middle
chunks' results dropped), retraction, and the commit of accepted tokens -- as upstream's
``PrefillAdder`` / ``get_next_batch_to_run`` / result processor do it. impl's scheduler
and the sglang target's objects both run these, so the two engines' requests live the
same lives and a trial of one can be judged like a trial of the other.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Deque, List, Optional, Tuple

import torch

from seams.faults import observe

from toys.mem_cache import KVCacheManager
from toys.memory import staged
from toys.vocab import EOS_ID


@dataclass
class RequestState:
    """What a toy engine keeps of a request: impl's ``Req``, and the base of the sglang
    target's (which adds what upstream's batch code reads of sglang's ``Req``)."""
    rid: int
    prompt: List[int]
    max_new_tokens: int
    grammar: Any = None
    output_ids: List[int] = field(default_factory=list)
    pool_idx: int = -1
    launched: int = 0  # forward steps launched for this request (prefill = step 0)
    committed_step: int = -1  # last step whose result the host has committed
    kv_allocated: int = 0  # req_to_token columns holding slots (toys.mem_cache)
    kv_committed: int = 0  # positions whose KV the host knows is written
    kv_reserve: int = 0  # pool slots its admission reserved (KVCacheManager.admit)
    # retracted (row and slots given back) and not yet prefilled again: a result of a
    # step launched before the retraction is dropped (``retract``)
    is_retracted: bool = False
    retractions: int = 0
    # the prefill's extend, in upstream's names: context positions whose KV earlier
    # chunks wrote, where this one ends, and middle chunks launched whose (dropped)
    # results are not yet processed
    prefix_len: int = 0
    extend_end: Optional[int] = None
    inflight_middle_chunks: int = 0

    def needs_splice(self) -> bool:
        """Is the previous step's result still in flight (relayed, not yet committed)?"""
        return self.committed_step < self.launched - 2

    def context(self) -> List[int]:
        """What a prefill reads: the prompt, and after a retraction the tokens it had."""
        return self.prompt + list(self.output_ids)

    def output(self) -> List[int]:
        """What the client gets (a commit stops at the finish: all of ``output_ids``)."""
        return list(self.output_ids)


def form_prefill(waiting: Deque[Any], chunked: Optional[Any], limit: int, budget: int,
                 kv: KVCacheManager) -> Tuple[List[Any], Optional[Any]]:
    """The next prefill's requests and the one it leaves mid-prompt (the new
    ``chunked_req``, or None): the request being chunked first (its next chunk), then
    waiting ones, each given a request-pool row and its KV reserve (``kv.admit``), in
    arrival order, at most ``limit`` -- while ``budget`` prompt tokens last (0: no
    limit). The last request may get only part of its context: it is the one chunked
    (upstream's ``PrefillAdder``). Both targets form their prefills here."""
    left = budget if budget > 0 else None
    reqs: List[Any] = []
    if chunked is not None:
        # all chunks of a prefill are one step (its number taken at admission): a middle
        # chunk's result is dropped, and how many chunks a retracted request's history
        # needs differs between a trial and its reference, whose steps must line up
        reqs.append(chunked)
        left = _take_chunk(chunked, left, kv)
    while waiting and len(reqs) < limit and left != 0 and kv.can_admit(waiting[0]):
        req = waiting.popleft()
        kv.admit(req)
        req.launched += 1  # a retracted request's steps go on counting (``retract``)
        req.is_retracted = False
        reqs.append(req)
        left = _take_chunk(req, left, kv)
    cut = reqs[-1] if reqs and reqs[-1].extend_end < len(reqs[-1].context()) else None
    if cut is not None:
        cut.inflight_middle_chunks += 1  # its result is not a token: dropped
    return reqs, cut


def prefill_due(waiting: Deque[Any], chunked: Optional[Any], kv: KVCacheManager) -> bool:
    """Is a prefill formed at this scheduling point? The request being chunked has its
    next chunk due, or the pool can take the first waiting request."""
    return chunked is not None or (bool(waiting) and kv.can_admit(waiting[0]))


def middle_chunk(req) -> bool:
    """A prefill's result for ``req`` is a middle chunk's (its token is not the
    request's): counted off and dropped (upstream's result processor, by
    ``inflight_middle_chunks``)."""
    if req.inflight_middle_chunks <= 0:
        return False
    req.inflight_middle_chunks -= 1
    return True


def _take_chunk(req, left: Optional[int], kv: KVCacheManager) -> Optional[int]:
    """``req``'s extend: from its prefix to the end of its context, or as far as ``left``
    tokens reach. What is left of the budget after it."""
    end = len(req.context())
    if left is not None:
        end = min(end, req.prefix_len + left)
        left -= end - req.prefix_len
    kv.begin_extend(req, end)
    return left


def due_for_retraction(reqs: List[Any], retract_at) -> List[Any]:
    """The running requests ``ServerArgs.retract_at`` retracts now: ``(rid, n)`` -- once,
    when ``rid`` holds ``n`` output tokens or more. Counted in committed tokens, it is the
    same point in a trial and in its synchronous reference."""
    if not retract_at:
        return []
    at = dict(retract_at)
    return [r for r in reqs if r.rid in at and r.retractions == 0
            and len(r.output_ids) >= at[r.rid]]


def retract_due(reqs: List[Any], retract_at, kv: KVCacheManager) -> List[Any]:
    """Retract the requests ``retract_at`` names now (``due_for_retraction``): those."""
    due = due_for_retraction(reqs, retract_at)
    for req in due:
        retract(req, kv)
    return due


def retract(req, kv: KVCacheManager) -> None:
    """Memory-pressure retraction (upstream's ``retract_decode`` -> ``release_req``): the
    request's slots and row go back now, on the schedule stream, and it waits to be
    prefilled again from its prompt and the tokens it has. A step launched before this
    (under overlap, the one in flight) is dropped: its number is taken again by the
    re-prefill, as in the synchronous run, where no step is in flight."""
    kv.retract(req)
    note_retracted(req)


def note_retracted(req) -> None:
    """The scheduler's bookkeeping of a retraction whose release is done (``retract``; on
    the sglang target also upstream's ``retract_decode``), and what the oracle is told:
    from which step on the request's steps are numbered anew."""
    # what upstream's ``Req.reset_for_retract`` clears (the sglang target ran it already)
    req.prefix_len, req.extend_end, req.inflight_middle_chunks = 0, None, 0
    req.is_retracted = True
    req.retractions += 1
    req.launched = req.committed_step + 1
    observe("retracted", req=req, from_step=req.launched)


def retraction_order(reqs: List[Any]) -> List[int]:
    """Upstream's ``_get_decode_retraction_order``: indices from most to least preferred
    to keep -- more output tokens first, then the shorter prompt; the last goes first."""
    return sorted(range(len(reqs)), key=lambda i: (len(reqs[i].output_ids),
                                                    -len(reqs[i].prompt)), reverse=True)


def retract_for_memory(reqs: List[Any], kv: KVCacheManager) -> List[Any]:
    """The next decode's reserve does not fit what the pool has free: retract the least
    preferred running requests until it does, keeping one (upstream's
    ``check_decode_mem`` / ``retract_decode``). The retracted requests, in the order they
    went. The one kept always fits: no request's lifetime exceeds the pool (``fits``)."""
    order = retraction_order(reqs)
    due: List[Any] = []
    while len(order) > 1 and kv.decode_need([reqs[i] for i in order]) > \
            kv.allocator.available_size():
        req = reqs[order.pop()]
        retract(req, kv)
        due.append(req)
    if kv.decode_need([reqs[i] for i in order]) > kv.allocator.available_size():
        raise RuntimeError("KV pool exhausted even after retracting all other requests")
    return due


def accept_tokens(req, tokens: List[int], advance_grammar: bool = True) -> bool:
    """Commit a step's accepted tokens to ``req`` (advancing its grammar, unless something
    already did): True when it finished on one of them (EOS or its budget) -- the rest of
    the step is dropped."""
    for tok in tokens:
        req.output_ids.append(tok)
        if advance_grammar and req.grammar is not None and not req.grammar.is_terminated():
            req.grammar.accept_token(tok)
        if tok == EOS_ID or len(req.output_ids) >= req.max_new_tokens:
            return True
    return False


@dataclass
class ExtendInputs:
    """A prefill's extend on the device, made on the schedule stream (as
    ``prepare_for_extend`` makes its inputs): each request's chunk ``context[prefix:end]``
    ``(bs, longest)`` zero-padded, its length, and its prefix length (where the chunk's
    KV goes; 0 unless an earlier chunk wrote some). A retracted request's context holds
    its tokens too."""
    ids: torch.Tensor
    lens: torch.Tensor
    prefix_lens: torch.Tensor

    def tensors(self) -> Tuple[torch.Tensor, ...]:
        return self.ids, self.lens, self.prefix_lens


def stage_extend(reqs: List[Any], device) -> ExtendInputs:
    """Each request's extend (``req.prefix_len -> req.extend_end``): one pinned staging
    buffer, one ``non_blocking`` copy (rows: the chunk, zero-padded, then its length and
    its prefix length), and views of it on the device."""
    chunks = [r.context()[r.prefix_len:r.extend_end] for r in reqs]
    width = max(len(c) for c in chunks)
    rows = [c + [0] * (width - len(c)) + [len(c), r.prefix_len]
            for c, r in zip(chunks, reqs)]
    host = staged(torch.tensor(rows, dtype=torch.int64), device)
    packed = host.to(device, non_blocking=True)
    return ExtendInputs(packed[:, :width], packed[:, width], packed[:, width + 1])


def extend_last_tokens(reqs: List[Any]) -> List[int]:
    """What a toy prefill forwards: each chunk's last token (its hidden row)."""
    return [r.context()[r.extend_end - 1] for r in reqs]
