"""The host n-gram proposer: a BFS draft tree of ``D`` nodes per request.

Node 0 is the root -- the last committed token. The tree is a trie of the continuations
that followed earlier occurrences of the context's suffix (longest suffix first); nodes
are in BFS order, and unused slots are padding nodes: token 0 hanging off the root, as
in the server's corpus. The tree links are derived on the host (after #32380), so the
grammar path never reads them back from the device (``toys.tree``).
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

MAX_MATCH = 3  # longest suffix looked up


class NgramProposer:
    def __init__(self, draft_token_num: int) -> None:
        if draft_token_num < 1:
            raise ValueError("draft_token_num must be >= 1")
        self.D = draft_token_num

    def propose(self, context: Sequence[int]) -> Tuple[List[int], List[int]]:
        """(tokens, parents) of one request's BFS draft tree; ``parents[0] == -1``."""
        D = self.D
        root = context[-1]
        tokens = [root]
        parents = [-1]
        trie: dict = {}
        for k in range(min(MAX_MATCH, len(context) - 1), 0, -1):
            suffix = list(context[-k:])
            # most recent occurrences first: their continuations are the likeliest
            for p in range(len(context) - 1, k - 1, -1):
                if list(context[p - k:p]) == suffix:
                    node = trie
                    for tok in context[p:p + D - 1]:
                        node = node.setdefault(tok, {})
        # BFS over the trie, capped at D nodes
        frontier = [(0, trie)]
        while frontier and len(tokens) < D:
            nxt = []
            for parent, node in frontier:
                for tok, sub in node.items():
                    if len(tokens) >= D:
                        break
                    tokens.append(tok)
                    parents.append(parent)
                    nxt.append((len(tokens) - 1, sub))
            frontier = nxt
        while len(tokens) < D:  # padding: token 0 under the root
            tokens.append(0)
            parents.append(0)
        return tokens, parents


def propose_host_trees(proposer: NgramProposer, reqs, prev_tokens: List[int],
                       prev_lens: List[int], stride: int, splice: bool = True
                       ) -> Tuple[List[int], List[List[int]], List[List[int]]]:
    """Draft prep on the host: each request's n-gram tree over its context -- with the
    previous step's accepted tokens spliced on while that step is still in flight -- as
    flat draft tokens and per-request next-token / next-sibling links."""
    from toys.tree import derive_tree_links
    drafts: List[int] = []
    next_token: List[List[int]] = []
    next_sibling: List[List[int]] = []
    for i, req in enumerate(reqs):
        context = req.context()
        if splice and req.needs_splice():
            context = context + prev_tokens[i * stride: i * stride + prev_lens[i]]
        tokens, parents = proposer.propose(context)
        nt, ns = derive_tree_links(parents)
        drafts += tokens
        next_token.append(nt)
        next_sibling.append(ns)
    return drafts, next_token, next_sibling
