"""impl/drafter.py: the device drafter (sim == cpu == host reference) and derive_tree_links."""
from __future__ import annotations

from typing import List

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.detect import detect
from harness.policies import Eager, Lazy, Stall
from harness.runtime.sim.runtime import sim_runtime
from harness.runtime.trace import SyncRecord
from toys.drafter import (BRANCHING_PARENTS, CHAIN_PARENTS, MAX_DRAFT, derive_tree_links,
                          draft_tree, reference_draft_tree, tree_parents)
from toys.vocab import VOCAB_SIZE

V = VOCAB_SIZE
ROOTS = [0, 1, 2, 7, 42, V - 2, V - 1, 50]


def parents_from_links(next_token: List[int], next_sibling: List[int]) -> List[int]:
    """Invert the links: walk each node's child list."""
    parents = [-1] * len(next_token)
    for p, child in enumerate(next_token):
        while child != -1:
            parents[child] = p
            child = next_sibling[child]
    return parents


# ---------------------------------------------------------------------------------------
# derive_tree_links

def test_derive_tree_links_example():
    #        0
    #      / | \\
    #     1  2  3
    #    / \\    \\
    #   4   5    6
    nt, ns = derive_tree_links([-1, 0, 0, 0, 1, 1, 3])
    assert nt == [1, 4, -1, 6, -1, -1, -1]
    assert ns == [-1, 2, 3, -1, 5, -1, -1]


def test_derive_tree_links_single_node_and_chain():
    assert derive_tree_links([-1]) == ([-1], [-1])
    assert derive_tree_links([-1, 0, 1]) == ([1, 2, -1], [-1, -1, -1])


@st.composite
def bfs_parents(draw):
    n = draw(st.integers(1, 16))
    parents = [-1]
    for i in range(1, n):
        parents.append(draw(st.integers(parents[-1] if i > 1 else 0, i - 1)))
    return parents


@settings(max_examples=100, deadline=None)
@given(parents=bfs_parents())
def test_derive_tree_links_inverts(parents):
    nt, ns = derive_tree_links(parents)
    assert parents_from_links(nt, ns) == parents
    assert ns[0] == -1
    for i, (c, s) in enumerate(zip(nt, ns)):
        assert c == -1 or c > i  # BFS: children after their parent
        assert s == -1 or (s > i and parents[s] == parents[i])


def test_topologies_are_bfs_prefix_closed():
    for table in (BRANCHING_PARENTS, CHAIN_PARENTS):
        assert len(table) == MAX_DRAFT
        for d in range(1, MAX_DRAFT + 1):
            assert parents_from_links(*derive_tree_links(table[:d])) == list(table[:d])


# ---------------------------------------------------------------------------------------
# the device drafter

def _host(tree):
    bs = tree.retrieve_next_token.shape[0]
    return (tree.draft_token.cpu().reshape(bs, -1).tolist(),
            tree.retrieve_next_token.cpu().tolist(), tree.retrieve_next_sibling.cpu().tolist())


@pytest.mark.parametrize("num_draft", range(2, MAX_DRAFT + 1))
def test_cpu_drafter_matches_reference(num_draft):
    tree = draft_tree(torch.tensor(ROOTS), num_draft, V)
    assert tree.draft_token.shape == (len(ROOTS) * num_draft,)
    assert tree.retrieve_next_token.shape == (len(ROOTS), num_draft)
    assert all(t.dtype == torch.int64 for t in tree)
    toks, nt, ns = _host(tree)
    assert (toks, nt, ns) == tuple(reference_draft_tree(ROOTS, num_draft, V))
    for b, root in enumerate(ROOTS):
        assert toks[b][0] == root
        assert all(0 <= t < V for t in toks[b])
        assert (nt[b], ns[b]) == derive_tree_links(tree_parents(root, num_draft))


@pytest.mark.parametrize("policy", [Eager, Lazy, lambda: Stall(["forward"])],
                         ids=["eager", "lazy", "stall"])
@pytest.mark.parametrize("num_draft", [2, 5, 8])
def test_sim_drafter_matches_cpu(policy, num_draft):
    expect = _host(draft_tree(torch.tensor(ROOTS), num_draft, V))
    with sim_runtime(policy()) as rt:
        fwd = rt.module.Stream()
        rt.label(fwd, "forward")
        with rt.module.stream(fwd):
            last = torch.tensor(ROOTS, device=rt.device)  # blocking H2D: syncs, as on CUDA
            setup = len(rt.trace.log)
            tree = draft_tree(last, num_draft, V)
            assert all(t.device.type == "sim" for t in tree)
            # built entirely on the stream: the host never waited
            assert not any(isinstance(r, SyncRecord) for r in rt.trace.log[setup:])
            ops = {op.stream for op in rt.trace.ops()}
            assert ops == {fwd.sid}
            got = _host(tree)
        assert detect(rt.trace) == []
    assert got == expect


def test_sim_drafter_leaves_work_queued_under_lazy():
    with sim_runtime(Lazy()) as rt:
        tree = draft_tree(torch.tensor(ROOTS, device=rt.device), 4, V)
        assert rt.dev.pending_ops() > 0  # nothing forced the stream
        assert _host(tree) == tuple(reference_draft_tree(ROOTS, 4, V))


@pytest.mark.parametrize("num_draft", [0, 1, MAX_DRAFT + 1])
def test_draft_size_out_of_range(num_draft):
    with pytest.raises(ValueError):
        draft_tree(torch.tensor(ROOTS), num_draft, V)


def test_drafter_accepts_int32_roots():
    a = _host(draft_tree(torch.tensor(ROOTS, dtype=torch.int32), 6, V))
    assert a == tuple(reference_draft_tree(ROOTS, 6, V))
