"""The FutureMap relay (post-#35198): forward-stream state handed to the next iteration.

The forward stream writes a step's accept state into req-pool-indexed buffers (``stash``,
right after the worker returns), and the next iteration's forward gathers it back
(``_resolve_spec_extras``) -- both on the forward stream, so stream order alone puts the
stash of step k before the resolve of step k+1. The schedule stream only ever handles
the indices.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from seams.faults import fault_point

from impl.spec_info import NgramVerifyInput


@dataclass
class RelayPayload:
    bonus_tokens: Optional[torch.Tensor] = None
    accept_tokens: Optional[torch.Tensor] = None  # (bs, D): "ngram delays the draft extend"
    accept_lens: Optional[torch.Tensor] = None  # (bs,)

    @classmethod
    def from_ngram(cls, draft_input: NgramVerifyInput) -> "RelayPayload":
        # Flat (bs*D,) -> (bs, D), so rows scatter straight into pool-indexed buffers.
        return cls(bonus_tokens=None,
                   accept_tokens=draft_input.accept_tokens.reshape(-1, draft_input.draft_token_num),
                   accept_lens=draft_input.accept_lens)


class FutureMap:
    def __init__(self, req_pool_size: int, device) -> None:
        self.req_pool_size = req_pool_size
        self.device = device
        self.accept_tokens_buf: Optional[torch.Tensor] = None
        self.accept_lens_buf: Optional[torch.Tensor] = None

    def _maybe_init_ngram_bufs(self, payload: RelayPayload) -> None:
        if self.accept_tokens_buf is not None:
            return
        # zeros, not empty: a row that was never stashed resolves to accept_len == 0,
        # an empty splice at draft prep, instead of a garbage length.
        self.accept_tokens_buf = torch.zeros(
            (self.req_pool_size, payload.accept_tokens.shape[1]),
            dtype=payload.accept_tokens.dtype, device=self.device)
        self.accept_lens_buf = torch.zeros(
            (self.req_pool_size,), dtype=payload.accept_lens.dtype, device=self.device)

    def stash(self, future_indices: torch.Tensor, payload: RelayPayload) -> None:
        """On the forward stream, after the producing kernels."""
        if future_indices.shape[0] == 0:
            return  # DP idle: the payload is an empty stub; lazy init must not peek at it
        self._maybe_init_ngram_bufs(payload)
        fault_point("future_map.before_stash")
        self.accept_tokens_buf[future_indices] = payload.accept_tokens
        self.accept_lens_buf[future_indices] = payload.accept_lens

    def resolve_spec_extras(self, draft_input: Optional[NgramVerifyInput]) -> None:
        """On the forward stream, next iteration: gather the relayed accept state."""
        if draft_input is None or draft_input.future_indices is None:
            return
        indices = draft_input.future_indices
        if indices.shape[0] == 0:
            return
        # ``indices`` were made on the schedule stream (filter/merge), and the batch drops
        # them when it takes this step's payload, while this gather may still be queued.
        # No record_stream is needed here: the fine WAR fence is recorded after this
        # gather, and the schedule stream waits on it before it allocates anything again.
        draft_input.accept_tokens = self.accept_tokens_buf[indices].flatten()
        draft_input.accept_lens = self.accept_lens_buf[indices]
