"""The draft-token slice: upstream's ``DraftTokensHandler`` (Model Runner V2's
``vllm/v1/worker/gpu/spec_decode/utils.py``) under a step loop shaped like vLLM's async
scheduling -- the closest relative of the sglang seed.

With structured outputs and spec decode, MRv2 copies each step's draft tokens to the host
for grammar validation: ``set_draft_tokens`` queues a device-to-host copy of the
speculator's output on a side stream (after ``wait_stream`` on the main stream), and the
engine takes them (``get_draft_tokens``: the copy's event synchronised) only after it has
launched the next step. The draft tensor is a temporary of the main stream; up to 0.23.0
nothing tells the caching allocator it is read on the side stream (no ``record_stream``),
so once the speculator drops it, the next step's main-stream allocation of the same size
can take its block before the copy has read it -- and the grammar check gets the next
step's drafts. 0.24.0 adds ``draft_tokens.record_stream(self.copy_stream)``.

The slice reports on a release only where upstream hands the handler a temporary too
(the contract reads it from the release's source: ``boundary/handover.py``): 0.16.0-0.19.1
with one speculative token, and 0.24.0 on. 0.20.0-0.23.0 hand over the speculator's
persistent buffer -- no block to give away -- and the slice is *not driven* there: its
race would be its own speculator's, not vLLM's.

Upstream's, unmodified: ``DraftTokensHandler`` (``set_draft_tokens`` /
``get_draft_tokens``) and ``async_copy_to_np``. Ours, named so: the step loop, the
speculator (each request's next tokens by the toy model's successor -- a perfect drafter
-- a fresh main-stream temporary each step, as the EAGLE speculator's output is), the
batch (``req_ids``; ``has_structured_output_reqs`` True: the only case with a copy), and
the requests' outputs -- the drafts the host got, which must be the model's greedy
continuation (the model oracle) and the synchronous reference's (taken right after
each copy). The side stream is stalled before each copy
(fault point ``vllm.before_draft_copy``): a copy engine busy with earlier transfers.
"""
from __future__ import annotations

import types
from typing import Any, Dict, List, Optional

import torch

from seams.faults import fault_point
from toys.engine import EngineLoop
from toys.vocab import EOS_ID
from targets.vllm.engine.model import _succ_table

DRAFT_STEPS = 2  # draft tokens a step proposes per request


class DraftTokensEngine(EngineLoop):
    """The scheduler object the harness drives (``step`` / ``has_work`` / ...)."""

    def __init__(self, args, device) -> None:
        from vllm.v1.worker.gpu.spec_decode.utils import DraftTokensHandler
        self.device = torch.device(device)
        self.overlap = bool(args.overlap)
        self.handler = DraftTokensHandler(self.device)
        self.running: List[Any] = []
        self.state: Dict[str, torch.Tensor] = {}  # per request: its speculator state
        self.pending: Optional[List[Any]] = None  # the batch whose drafts are in flight
        self.iteration = 0

    @property
    def streams(self) -> Dict[str, Any]:
        return {"main": torch.cuda.current_stream(), "draft copy": self.handler.copy_stream}

    def add_request(self, req) -> None:
        self.state[str(req.rid)] = torch.tensor(req.prompt[-1:], dtype=torch.int64,
                                                device=self.device)
        self.running.append(req)

    def has_work(self) -> bool:
        return bool(self.running or self.pending)

    def _speculate(self, reqs) -> torch.Tensor:
        """The speculator's output for the batch: a fresh (bs, DRAFT_STEPS) temporary on
        the main stream -- each request's next tokens by the toy model's successor (a
        perfect drafter, so the drafts the host gets are the greedy continuation the
        model oracle knows) -- and each request's state moves to its last draft."""
        table = _succ_table(self.device)
        last = torch.cat([self.state[str(r.rid)] for r in reqs])
        cols = [table[last]]
        for _ in range(DRAFT_STEPS - 1):
            cols.append(table[cols[-1]])
        drafts = torch.stack(cols, dim=1)
        for i, r in enumerate(reqs):
            self.state[str(r.rid)].copy_(drafts[i, -1:])
        return drafts

    def _take(self) -> None:
        """The engine takes the in-flight drafts (``take_draft_token_ids``)."""
        if self.pending is None:
            return
        got = self.handler.get_draft_tokens()
        # by request id: from 0.33.0 the handler keeps every live request's latest drafts
        # and hands them all out
        by_rid = dict(zip(got.req_ids, got.draft_token_ids))
        for req in self.pending:
            drafts = by_rid[str(req.rid)]
            for t in drafts:  # as the grammar check consumes them: up to EOS or budget
                if req.finished is not None:
                    break
                req.tokens.append(int(t))
                if int(t) == EOS_ID:
                    req.finished = "stop"
                elif len(req.tokens) >= req.max_new_tokens:
                    req.finished = "length"
            if req.finished is not None and hasattr(self.handler, "discard"):
                self.handler.discard(str(req.rid))  # as the runner does for a finished one
        self.pending = None

    def step(self) -> None:
        batch = [r for r in self.running if r.finished is None]
        # this step's speculator runs on the main stream first; with async scheduling the
        # engine takes the previous step's drafts only after it (take_draft_token_ids
        # after the next launch), synchronously right after their copy
        drafts = self._speculate(batch) if batch else None
        self._take()
        if batch:
            view = types.SimpleNamespace(req_ids=[str(r.rid) for r in batch],
                                         has_structured_output_reqs=True)
            with torch.cuda.stream(self.handler.copy_stream):
                fault_point("vllm.before_draft_copy")  # a busy copy engine
            self.handler.set_draft_tokens(view, drafts)
            del drafts  # the speculator's temporary goes out of scope, as upstream's does
            self.pending = batch
            if not self.overlap:
                self._take()
        self.running = [r for r in self.running if r.finished is None]
        self.iteration += 1

    def close(self) -> None:
        pass
