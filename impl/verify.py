"""Greedy verification of a draft tree on the device (``verify_tree_greedy``).

For each request, walk down from the root: at each depth, take the first child (in
sibling order) whose draft token equals the target's argmax *at its parent*; stop when
none does. The token predicted at the last accepted node is the bonus. Outputs:

* ``predict``       (bs*D,)  the target's token at each accepted node (0 elsewhere);
* ``accept_index``  (bs, D)  flat indices of the accepted path, root first, -1 padded;
* ``accept_lens``   (bs,)    accepted drafts + 1 (the bonus) -- in [1, D].

The walk is vectorised over the batch *and* the tree: parents are recovered from the
links in BFS order, a node matches if its draft equals the target at its parent, the
first matching sibling wins, and a node is accepted if it and all its ancestors won.
Ordinary tensor ops on the current stream; nothing here syncs with the host.
"""
from __future__ import annotations

from typing import Tuple

import torch


def _parents(next_token: torch.Tensor, next_sibling: torch.Tensor) -> torch.Tensor:
    """Parent of each node (root: 0) from first-child / next-sibling links."""
    bs, D = next_token.shape
    parent = torch.zeros((bs, D + 1), dtype=torch.int64, device=next_token.device)
    # Column D is a sink for the -1 links, so every scatter is unconditional.
    for i in range(D):  # BFS order: a node's parent is known before its children/siblings
        child = torch.where(next_token[:, i:i + 1] >= 0, next_token[:, i:i + 1], D)
        parent.scatter_(1, child, i)
        sib = torch.where(next_sibling[:, i:i + 1] >= 0, next_sibling[:, i:i + 1], D)
        parent.scatter_(1, sib, parent[:, i:i + 1].clone())
    return parent[:, :D]


def verify_tree_greedy(target_predict: torch.Tensor, draft_token: torch.Tensor,
                       next_token: torch.Tensor, next_sibling: torch.Tensor
                       ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``target_predict``, ``draft_token``, links: ``(bs, D)`` int64 on the device."""
    bs, D = draft_token.shape
    device = draft_token.device
    parent = _parents(next_token, next_sibling)
    node = torch.arange(D, device=device)
    # A node matches if its draft is what the target predicts at its parent.
    match = draft_token == target_predict.gather(1, parent)
    match[:, 0] = True
    # Greedy takes the first matching sibling: a match with an earlier matching sibling
    # (same parent, smaller index; never the root, whose parent slot also reads 0) loses.
    earlier = (node[None, :, None] > node[None, None, :]) & (node > 0)[None, None, :]
    rival = (parent[:, :, None] == parent[:, None, :]) & earlier & match[:, None, :]
    won = match & ~rival.any(dim=2)
    won[:, 0] = True
    accepted = won.clone()
    for j in range(1, D):  # accepted iff it won and its parent was accepted
        accepted[:, j] = won[:, j] & accepted.gather(1, parent[:, j:j + 1]).squeeze(1)
    accept_lens = accepted.sum(dim=1).to(torch.int32)
    # The accepted nodes form one root path, in BFS (= depth) order: sort them first.
    order = torch.where(accepted, node, node + D).sort(dim=1).values
    row0 = (torch.arange(bs, device=device) * D)[:, None]
    accept_index = torch.where(order < D, row0 + order, torch.full_like(order, -1))
    predict = torch.where(accepted, target_predict, torch.zeros_like(target_predict)).flatten()
    return predict, accept_index, accept_lens
