"""The verify-tree encoding's host side: first-child / next-sibling links from a BFS
parent list, shared by the NGRAM proposer's host tree and the device drafter's topology."""
from __future__ import annotations

from typing import List, Sequence, Tuple


def derive_tree_links(parents: Sequence[int]) -> Tuple[List[int], List[int]]:
    """First child and next sibling of every node of a BFS-ordered parent list.

    next_token[i]   = the smallest j > i with parent j == i, else -1;
    next_sibling[i] = the smallest j > i with parent j == parent i, else -1 (root: -1).
    """
    n = len(parents)
    next_token = [-1] * n
    next_sibling = [-1] * n
    last_child = {}  # parent -> the latest child seen so far
    for j in range(1, n):
        p = parents[j]
        assert 0 <= p < j, f"node {j}: parent {p} is not an earlier node"
        prev = last_child.get(p)
        if prev is None:
            next_token[p] = j
        else:
            next_sibling[prev] = j
        last_child[p] = j
    return next_token, next_sibling
