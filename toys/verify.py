"""Greedy verification of a draft tree on the device: one kernel, ``verify_tree_greedy``.

For each request, walk down from the root: at each depth, take the first child (in
sibling order) whose draft token equals the target's argmax *at its parent*; stop when
none does. The token predicted at the last accepted node is the bonus. Outputs:

* ``predict``       (bs*D,)  the target's token at each accepted node (0 elsewhere);
* ``accept_index``  (bs, D)  flat indices of the accepted path, root first, -1 padded;
* ``accept_lens``   (bs,)    accepted drafts + 1 (the bonus) -- in [1, D].

SGLang verifies with one fused kernel (sgl_kernel's ``verify_tree_greedy``) that fills
buffers its caller allocated -- ``accept_index`` pre-filled with -1, the kernel writing
only the accepted slots. This mirror is shaped the same way: ``verify_tree_greedy``
allocates the outputs and launches ``specrace::verify_tree_greedy``, one device op on the
current stream that reads the target's argmax and the tree links and writes the three
buffers. The op's body (``_verify_kernel``) is ordinary torch code over its arguments --
what a fused kernel does inside is private to it, so a race detector sees one launch, as
it would on the server. Nothing here syncs with the host.

The walk is vectorised over the batch *and* the tree: parents are recovered from the
links in BFS order, a node matches if its draft equals the target at its parent, the
first matching sibling wins, and a node is accepted if it and all its ancestors won.
"""
from __future__ import annotations

from typing import Tuple

import torch

from seams.faults import fault_point

from toys.kernel_op import declare_kernel


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


def _verify_kernel(target_predict: torch.Tensor, draft_token: torch.Tensor,
                   next_token: torch.Tensor, next_sibling: torch.Tensor,
                   predict: torch.Tensor, accept_index: torch.Tensor,
                   accept_lens: torch.Tensor) -> None:
    """The kernel's body: fills ``predict`` and ``accept_lens``, and ``accept_index`` at
    the accepted slots only (the rest keep what the caller put there)."""
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
    accept_lens.copy_(accepted.sum(dim=1))
    # The accepted nodes form one root path, in BFS (= depth) order: sort them first.
    order = torch.where(accepted, node, node + D).sort(dim=1).values
    row0 = (torch.arange(bs, device=device) * D)[:, None]
    accept_index.copy_(torch.where(order < D, row0 + order, accept_index))
    predict.copy_(torch.where(accepted, target_predict, 0).flatten())


declare_kernel("verify_tree_greedy(Tensor target_predict, Tensor draft_token, "
               "Tensor next_token, Tensor next_sibling, Tensor(a!) predict, "
               "Tensor(b!) accept_index, Tensor(c!) accept_lens) -> ()",
               lambda *a: _verify_kernel(*a))


def verify_tree_greedy(target_predict: torch.Tensor, draft_token: torch.Tensor,
                       next_token: torch.Tensor, next_sibling: torch.Tensor
                       ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``target_predict``, ``draft_token``, links: ``(bs, D)`` int64 on the device."""
    bs, D = draft_token.shape
    device = draft_token.device
    predict = torch.empty((bs * D,), dtype=target_predict.dtype, device=device)
    accept_index = torch.full((bs, D), -1, dtype=torch.int64, device=device)
    accept_lens = torch.empty((bs,), dtype=torch.int32, device=device)
    torch.ops.specrace.verify_tree_greedy(target_predict, draft_token, next_token,
                                          next_sibling, predict, accept_index, accept_lens)
    return predict, accept_index, accept_lens


def verify_and_accept(attn, meta, logits, drafts, next_token, next_sibling, bs: int, D: int):
    """A verify's tail, as every toy worker runs it (impl's and the sglang target's): the
    target's greedy choice at every draft node, the tree walk (one fused kernel:
    ``predict``, ``accept_index``, ``accept_lens``), the accepted path's KV moved in the
    pool; the accepted tokens (flat, ``D`` a request) and the accept lengths."""
    target_predict = logits.argmax(dim=-1).view(bs, D)
    fault_point("forward.before_verify")
    predict, accept_index, accept_lens = verify_tree_greedy(
        target_predict, drafts.view(bs, D), next_token, next_sibling)
    attn.commit_accepted(meta, accept_index, accept_lens)
    return predict[accept_index].flatten().to(torch.int32), accept_lens
