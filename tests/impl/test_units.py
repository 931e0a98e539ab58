"""Unit invariants of the engine pieces, on the simulated device (eager: values only)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.policies import Eager, Lazy
from harness.runtime.sim.runtime import sim_runtime
from toys.model import ToyTargetModel, successor
from toys.tree import derive_tree_links as tree_links
from toys.ngram import NgramProposer
from impl.overlap import FutureMap, RelayPayload
from impl.spec_info import NgramVerifyInput
from toys.verify import verify_tree_greedy
from toys.vocab import VOCAB_SIZE


def brute_force_verify(target, draft, parents):
    """Walk the tree per request in plain Python: the reference the kernel is held to."""
    D = len(draft)
    children = {i: [j for j in range(1, D) if parents[j] == i] for i in range(D)}
    path, last = [0], 0
    while True:
        nxt = next((c for c in children[last] if draft[c] == target[last]), None)
        if nxt is None:
            break
        path.append(nxt)
        last = nxt
    return path, target[last]


@st.composite
def trees(draw):
    D = draw(st.integers(1, 8))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, D)]
    parents = [-1] + sorted(parents[1:])  # BFS order: parents non-decreasing
    draft = [draw(st.integers(0, 5)) for _ in range(D)]
    target = [draw(st.integers(0, 5)) for _ in range(D)]
    return parents, draft, target


@settings(max_examples=60, deadline=None)
@given(st.lists(trees(), min_size=1, max_size=3).filter(
    lambda ts: len({len(t[0]) for t in ts}) == 1))
def test_tree_verification_matches_brute_force(batch):
    D = len(batch[0][0])
    with sim_runtime(Lazy()) as rt:
        links = [tree_links(p) for p, _, _ in batch]
        dev = rt.device
        tp = torch.tensor([t for _, _, t in batch], device=dev)
        dr = torch.tensor([d for _, d, _ in batch], device=dev)
        nt = torch.tensor([l[0] for l in links], device=dev)
        ns = torch.tensor([l[1] for l in links], device=dev)
        predict, accept_index, accept_lens = verify_tree_greedy(tp, dr, nt, ns)
        predict, accept_index, accept_lens = predict.tolist(), accept_index.tolist(), accept_lens.tolist()
    for b, (parents, draft, target) in enumerate(batch):
        path, bonus = brute_force_verify(target, draft, parents)
        assert accept_lens[b] == len(path)  # accepted drafts + the bonus
        assert accept_lens[b] >= 1 and accept_lens[b] <= D
        assert accept_index[b][:len(path)] == [b * D + i for i in path]
        assert all(x == -1 for x in accept_index[b][len(path):])
        tokens = [predict[i] for i in accept_index[b][:len(path)]]
        assert tokens == [draft[i] for i in path[1:]] + [bonus]


def test_model_greedy_continuation_is_the_successor_map():
    with sim_runtime(Eager()) as rt:
        m = ToyTargetModel(rt.device)
        ids = torch.arange(VOCAB_SIZE, device=rt.device)
        got = m.forward(ids).argmax(-1).tolist()
    assert got == [successor(t) for t in range(VOCAB_SIZE)]


def test_out_of_range_id_fails_in_the_gather_not_silently():
    from harness.runtime.sim import SimDeviceError
    with sim_runtime(Lazy()) as rt:
        m = ToyTargetModel(rt.device)
        bad = torch.tensor([3, VOCAB_SIZE + 5], device=rt.device)
        logits = m.forward(bad)  # enqueued: no error yet (asynchronous, as on CUDA)
        with pytest.raises(SimDeviceError, match="embedding"):
            logits.cpu()


def test_proposer_tree_is_bfs_with_root_last_token_and_padding():
    p = NgramProposer(6)
    tokens, parents = p.propose([5, 6, 7, 8, 5, 6, 7, 9, 5, 6])
    assert tokens[0] == 6 and parents[0] == -1
    assert all(parents[i] < i for i in range(1, 6))
    assert parents == sorted(parents)  # BFS
    tokens, parents = NgramProposer(4).propose([3])
    assert tokens == [3, 0, 0, 0] and parents == [-1, 0, 0, 0]  # padding under the root


def _payload(rows, D, base):
    toks = torch.arange(base, base + rows * D, dtype=torch.int32).reshape(rows, D)
    lens = torch.arange(1, rows + 1, dtype=torch.int32)
    return toks, lens


def test_future_map_zero_rows_for_unstashed_slots_and_dp_idle_noop():
    with sim_runtime(Eager()) as rt:
        dev = rt.device
        fm = FutureMap(8, dev)
        idle = NgramVerifyInput.create_idle_input(4, dev, "future_map")
        fm.stash(idle.future_indices, RelayPayload.from_ngram(idle))  # DP idle: no-op
        assert fm.accept_tokens_buf is None  # lazy init never peeked at the empty stub
        toks, lens = _payload(2, 4, 10)
        vi = NgramVerifyInput(4, accept_tokens=toks.flatten().to(dev), accept_lens=lens.to(dev))
        fm.stash(torch.tensor([2, 5], device=dev), RelayPayload.from_ngram(vi))
        probe = NgramVerifyInput(4, future_indices=torch.tensor([5, 3, 2], device=dev))
        fm.resolve_spec_extras(probe)
        assert probe.accept_lens.tolist() == [2, 0, 1]  # slot 3 never stashed: length 0
        assert probe.accept_tokens.view(3, 4).tolist() == [
            [14, 15, 16, 17], [0, 0, 0, 0], [10, 11, 12, 13]]
        empty = NgramVerifyInput(4, future_indices=torch.empty(0, dtype=torch.int64, device=dev))
        fm.resolve_spec_extras(empty)  # DP idle resolve: no-op
        assert empty.accept_lens is None


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_filter_merge_never_move_rows_only_indices(data):
    """Row ownership: after any filter/merge sequence, future_indices[j] is request j's
    own pool slot, and resolving gives request j exactly what was stashed for it."""
    n = data.draw(st.integers(1, 6))
    with sim_runtime(Eager()) as rt:
        dev = rt.device
        fm = FutureMap(16, dev)
        slots = list(range(1, n + 1))
        toks, lens = _payload(n, 3, 100)
        vi = NgramVerifyInput(3, accept_tokens=toks.flatten().to(dev), accept_lens=lens.to(dev))
        fm.stash(torch.tensor(slots, device=dev), RelayPayload.from_ngram(vi))
        owner = {s: (toks[i].tolist(), int(lens[i])) for i, s in enumerate(slots)}
        batch = NgramVerifyInput(3, future_indices=torch.tensor(slots[:1], device=dev))
        live = slots[:1]
        for s in slots[1:]:
            other = NgramVerifyInput(3, future_indices=torch.tensor([s], device=dev))
            batch.merge_batch(other)
            live.append(s)
            if data.draw(st.booleans()) and len(live) > 1:
                keep = sorted(data.draw(st.sets(st.integers(0, len(live) - 1), min_size=1)))
                batch.filter_batch(torch.tensor(keep, device=dev))
                live = [live[k] for k in keep]
        assert batch.future_indices.tolist() == live
        fm.resolve_spec_extras(batch)
        got_lens = batch.accept_lens.tolist()
        got_toks = batch.accept_tokens.view(-1, 3).tolist()
    for j, s in enumerate(live):
        assert (got_toks[j], got_lens[j]) == owner[s]
