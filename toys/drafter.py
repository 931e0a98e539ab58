"""A small deterministic device drafter for the EAGLE-style path.

It stands in for the draft model: from the last committed token of each request it
builds, with ordinary torch ops on the *current stream* (no host sync), a draft tree of
``D`` nodes in the verify-tree encoding (node 0 = root = the last committed token):

* ``draft_token``           ``(bs*D,)`` int64, node ``i`` of request ``b`` at ``b*D + i``;
* ``retrieve_next_token``   ``(bs, D)`` int64, first child of each node, -1 for a leaf;
* ``retrieve_next_sibling`` ``(bs, D)`` int64, next sibling (same parent), -1 for none.

The tree is a function of the root token alone, so a host reference can recompute it:

* topology: an even root token gets the branching tree ``BRANCHING_PARENTS[:D]``, an odd
  one the chain ``CHAIN_PARENTS[:D]`` (both in BFS order, so any prefix is a tree);
* tokens: the k-th child of a node with token ``p`` gets ``CHILD_FNS[k](p) % V``.
"""
from __future__ import annotations

from typing import List, NamedTuple, Sequence, Tuple

import torch

from toys.tree import derive_tree_links  # noqa: F401  (the NGRAM path shares it)

MAX_DRAFT = 8

# BFS parent lists (node 0 is the root, parent -1). Parents are non-decreasing, so every
# prefix of length D is itself a BFS-ordered tree.
BRANCHING_PARENTS: Tuple[int, ...] = (-1, 0, 0, 1, 1, 2, 3, 5)
CHAIN_PARENTS: Tuple[int, ...] = tuple(range(-1, MAX_DRAFT - 1))

# Token of the k-th child (k = index among its siblings) from its parent's token p.
CHILD_MUL = (7, 11)
CHILD_ADD = (1, 3)


class DraftTree(NamedTuple):
    draft_token: torch.Tensor  # (bs*D,) int64
    retrieve_next_token: torch.Tensor  # (bs, D) int64
    retrieve_next_sibling: torch.Tensor  # (bs, D) int64


def sibling_rank(parents: Sequence[int]) -> List[int]:
    """Index of each node among its parent's children (root: 0)."""
    count: dict = {}
    rank = [0] * len(parents)
    for j in range(1, len(parents)):
        rank[j] = count.get(parents[j], 0)
        count[parents[j]] = rank[j] + 1
    return rank


def tree_parents(root_token: int, num_draft: int) -> List[int]:
    """The topology the drafter uses for a root token (host reference)."""
    return list((BRANCHING_PARENTS if root_token % 2 == 0 else CHAIN_PARENTS)[:num_draft])


def _check(num_draft: int) -> None:
    if not 2 <= num_draft <= MAX_DRAFT:
        raise ValueError(f"draft_token_num must be in 2..{MAX_DRAFT}, got {num_draft}")


def draft_tree(last_tokens: torch.Tensor, num_draft: int, vocab_size: int) -> DraftTree:
    """Build the draft tree on ``last_tokens.device``, on the current stream.

    Every op is an ordinary elementwise/select op with a host-known shape: nothing here
    makes the host wait for the device.
    """
    _check(num_draft)
    device = last_tokens.device
    bs = last_tokens.shape[0]
    root = last_tokens.to(torch.int64)
    branching = (root % 2) == 0  # (bs,) bool: which topology each request gets

    par_a, par_b = BRANCHING_PARENTS[:num_draft], CHAIN_PARENTS[:num_draft]
    rank_a, rank_b = sibling_rank(par_a), sibling_rank(par_b)

    tokens = torch.empty((bs, num_draft), dtype=torch.int64, device=device)
    tokens[:, 0] = root
    # BFS order: a node's parent is always an earlier column, already written.
    for i in range(1, num_draft):
        child_a = (tokens[:, par_a[i]] * CHILD_MUL[rank_a[i]] + CHILD_ADD[rank_a[i]]) % vocab_size
        child_b = (tokens[:, par_b[i]] * CHILD_MUL[rank_b[i]] + CHILD_ADD[rank_b[i]]) % vocab_size
        tokens[:, i] = torch.where(branching, child_a, child_b)

    # The links are constants per topology; a pageable host source is fine (the copy is
    # staged at launch and no host wait follows).
    links = []
    for a, b in zip(derive_tree_links(par_a), derive_tree_links(par_b)):
        la = torch.tensor(a, dtype=torch.int64).to(device, non_blocking=True)
        lb = torch.tensor(b, dtype=torch.int64).to(device, non_blocking=True)
        links.append(torch.where(branching.unsqueeze(1), la.unsqueeze(0), lb.unsqueeze(0)))
    return DraftTree(tokens.reshape(-1), links[0], links[1])


def reference_draft_tree(last_tokens: Sequence[int], num_draft: int,
                         vocab_size: int) -> Tuple[List[List[int]], List[List[int]],
                                                   List[List[int]]]:
    """Pure-Python twin of ``draft_tree``: (tokens, next_token, next_sibling), each bs x D."""
    _check(num_draft)
    toks, nts, nss = [], [], []
    for root in last_tokens:
        parents = tree_parents(root, num_draft)
        rank = sibling_rank(parents)
        row = [root]
        for i in range(1, num_draft):
            row.append((row[parents[i]] * CHILD_MUL[rank[i]] + CHILD_ADD[rank[i]]) % vocab_size)
        nt, ns = derive_tree_links(parents)
        toks.append(row)
        nts.append(nt)
        nss.append(ns)
    return toks, nts, nss
