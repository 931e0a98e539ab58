"""The schedule side of a batch, as the server's ``managers/schedule_batch.py``: the
request (the toy world's ``RequestState``, ``toys.requests``, which forms prefills, chunks
and retracts) and the batch the scheduler hands the forward.

``ScheduleBatch.filter_batch`` / ``merge_batch`` run on the schedule stream: they slice
and concatenate index tensors the schedule stream made itself, and hand the relay's
``filter_batch`` / ``merge_batch`` the same (``impl.spec_info``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import torch

from toys.memory import staged
from toys.requests import ExtendInputs, RequestState

from impl.spec_info import NgramVerifyInput


@dataclass
class Req(RequestState):
    finished: bool = False


@dataclass
class SamplingBatchInfo:
    vocab_size: int
    vocab_mask: Optional[torch.Tensor] = None


class ScheduleBatch:
    def __init__(self, reqs: List[Req], req_pool_indices: Optional[torch.Tensor],
                 forward_mode: str, vocab_size: int) -> None:
        self.reqs = reqs
        self.req_pool_indices = req_pool_indices  # an extend's: KVCacheManager.prepare_extend
        self.forward_mode = forward_mode  # extend | decode | idle
        self.spec_info: Optional[NgramVerifyInput] = None
        self.sampling_info = SamplingBatchInfo(vocab_size)
        self.sync_processed = False  # previous result already committed (grammar sync)
        self.staging: Any = None
        self.input_ids: Optional[torch.Tensor] = None  # extend: made on the schedule stream
        self.extend: Optional[ExtendInputs] = None  # extend: the chunks (stage_extend)

    @property
    def has_grammar(self) -> bool:
        return any(r.grammar is not None for r in self.reqs)

    def filter_batch(self, keep: List[int], device) -> None:
        """Schedule stream. ``keep`` are positions of the requests that stay."""
        self.reqs = [self.reqs[i] for i in keep]
        keep_host = staged(torch.tensor(keep, dtype=torch.int64), device)
        keep_dev = keep_host.to(device, non_blocking=True)
        self.req_pool_indices = self.req_pool_indices[keep_dev]
        if self.spec_info is not None:
            self.spec_info.filter_batch(keep_dev)

    def merge_batch(self, other: "ScheduleBatch") -> None:
        """Schedule stream: append ``other`` (a finished prefill) to this running batch."""
        self.reqs = self.reqs + other.reqs
        self.req_pool_indices = torch.cat((self.req_pool_indices, other.req_pool_indices))
        if self.spec_info is not None and other.spec_info is not None:
            self.spec_info.merge_batch(other.spec_info)
