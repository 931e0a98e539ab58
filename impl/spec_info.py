"""``NgramVerifyInput``: the verify input of an NGRAM step, and the relay of its result.

In the *verify* role it carries the draft tree. In the *relay* role (the V2 overlap
worker) it carries the previous step's ``accept_tokens`` (flat ``(bs*D,)`` int32) and
``accept_lens`` (``(bs,)`` int32) to the next draft prep, plus ``future_indices``.

``filter_batch`` / ``merge_batch`` run on the **schedule stream**. How they treat the
accept state is the whole of PR #35198:

* ``relay="future_map"`` (fixed): the accept state lives in FutureMap rows keyed by
  ``req_pool_idx``; filter/merge only slice / concatenate ``future_indices`` -- an index
  tensor the schedule stream produced itself -- and never touch forward-stream data.
* ``relay="spec_info"`` (pre-fix): filter/merge gather ``accept_tokens`` /
  ``accept_lens`` right here, on the schedule stream, while the forward stream may still
  be writing them: a cross-stream RAW that only the coarse WAR fence hid.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from seams.vocab import Relay



@dataclass
class NgramVerifyInput:
    draft_token_num: int
    relay: str = "future_map"
    # verify role
    draft_token: Optional[torch.Tensor] = None
    retrieve_next_token: Optional[torch.Tensor] = None
    retrieve_next_sibling: Optional[torch.Tensor] = None
    grammar: Optional[object] = None
    # relay role ("inputs for the V2 overlap worker")
    future_indices: Optional[torch.Tensor] = None
    accept_tokens: Optional[torch.Tensor] = None
    accept_lens: Optional[torch.Tensor] = None

    @classmethod
    def create_idle_input(cls, draft_token_num: int, device, relay: str) -> "NgramVerifyInput":
        """A DP-idle rank's input: zero rows everywhere."""
        return cls(
            draft_token_num=draft_token_num, relay=relay,
            future_indices=torch.empty((0,), dtype=torch.int64, device=device),
            accept_tokens=torch.empty((0,), dtype=torch.int32, device=device),
            accept_lens=torch.empty((0,), dtype=torch.int32, device=device))

    def filter_batch(self, new_indices: torch.Tensor) -> None:
        if self.relay == Relay.FUTURE_MAP and self.future_indices is not None:
            # The accept state is not sliced here: the forward stream writes it, and the
            # next verify's resolve gathers it again from the FutureMap by these indices.
            self.future_indices = self.future_indices[new_indices]
            return
        if self.future_indices is not None:
            self.future_indices = self.future_indices[new_indices]
        D = self.draft_token_num
        self.accept_tokens = self.accept_tokens.reshape(-1, D)[new_indices, :].flatten()
        self.accept_lens = self.accept_lens[new_indices]

    def merge_batch(self, other: "NgramVerifyInput") -> None:
        if self.relay == Relay.FUTURE_MAP and self.future_indices is not None:
            assert other.future_indices is not None
            self.future_indices = torch.cat((self.future_indices, other.future_indices))
            return
        if self.future_indices is not None:
            self.future_indices = torch.cat((self.future_indices, other.future_indices))
        self.accept_tokens = torch.cat((self.accept_tokens, other.accept_tokens))
        self.accept_lens = torch.cat((self.accept_lens, other.accept_lens))
