"""Greedy verification of a draft tree on the device (``verify_tree_greedy``).

For each request, walk down from the root: at each depth, take the first child (in
sibling order) whose draft token equals the target's argmax *at its parent*; stop when
none does. The token predicted at the last accepted node is the bonus. Outputs:

* ``predict``       (bs*D,)  the target's token at each accepted node (0 elsewhere);
* ``accept_index``  (bs, D)  flat indices of the accepted path, root first, -1 padded;
* ``accept_lens``   (bs,)    accepted drafts + 1 (the bonus) -- in [1, D].

Everything is vectorised over the batch with ordinary tensor ops on the current stream;
nothing here syncs with the host.
"""
from __future__ import annotations

from typing import Tuple

import torch


def verify_tree_greedy(target_predict: torch.Tensor, draft_token: torch.Tensor,
                       next_token: torch.Tensor, next_sibling: torch.Tensor
                       ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``target_predict``, ``draft_token``, links: ``(bs, D)`` int64 on the device."""
    bs, D = draft_token.shape
    device = draft_token.device
    row0 = torch.arange(bs, device=device) * D
    last = torch.zeros(bs, dtype=torch.int64, device=device)  # local index of last accepted
    alive = torch.ones(bs, dtype=torch.bool, device=device)
    n = torch.zeros(bs, dtype=torch.int64, device=device)
    accept_index = torch.full((bs, D), -1, dtype=torch.int64, device=device)
    accept_index[:, 0] = row0
    none = torch.full((bs,), -1, dtype=torch.int64, device=device)
    for _depth in range(1, D):
        target = target_predict.gather(1, last[:, None]).squeeze(1)
        cur = next_token.gather(1, last[:, None]).squeeze(1)
        chosen = last
        found = torch.zeros(bs, dtype=torch.bool, device=device)
        for _sibling in range(D - _depth):
            valid = (cur >= 0) & alive & ~found
            safe = cur.clamp(min=0)
            match = valid & (draft_token.gather(1, safe[:, None]).squeeze(1) == target)
            chosen = torch.where(match, cur, chosen)
            found = found | match
            cur = torch.where(valid & ~match,
                              next_sibling.gather(1, safe[:, None]).squeeze(1), none)
        n = n + found.long()
        accept_index.scatter_(1, n[:, None],
                              torch.where(found, row0 + chosen, accept_index.gather(
                                  1, n[:, None]).squeeze(1))[:, None])
        alive = alive & found
        last = chosen
    # The target's token at every node on the accepted path: drafts it agreed with,
    # then the bonus at the last node.
    on_path = torch.zeros(bs, D, dtype=torch.bool, device=device)
    on_path.scatter_(1, (accept_index - row0[:, None]).clamp(min=0), True)
    predict = torch.where(on_path, target_predict, torch.zeros_like(target_predict)).flatten()
    accept_lens = (n + 1).to(torch.int32)
    return predict, accept_index, accept_lens
