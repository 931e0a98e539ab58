"""The vLLM target's torch stand-ins for vLLM's spec-decode Triton kernels, against
loop-by-loop references written from the kernels' own per-program code (one request per
program): same outputs, for random batches, without vLLM installed."""
from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from targets.vllm.engine import kernels as K


def _greedy_reference(cu, draft, target, bonus, is_greedy, width):
    out = torch.full((len(cu), width + 1), -1, dtype=torch.int64)
    for r in range(len(cu)):
        if is_greedy is not None and not bool(is_greedy[r]):
            continue
        start = 0 if r == 0 else int(cu[r - 1])
        rejected = False
        for pos in range(int(cu[r]) - start):
            if not rejected:
                out[r, pos] = target[start + pos]
                rejected = int(draft[start + pos]) != int(target[start + pos])
        if not rejected:
            out[r, int(cu[r]) - start] = bonus[r]
    return out


@st.composite
def _batches(draw):
    reqs = draw(st.integers(1, 5))
    width = draw(st.integers(1, 4))
    drafts = [draw(st.integers(0, width)) for _ in range(reqs)]
    cu = torch.tensor(drafts).cumsum(0)
    n = int(cu[-1])
    draft = torch.tensor([draw(st.integers(0, 3)) for _ in range(n)], dtype=torch.int64)
    target = torch.tensor([draw(st.integers(0, 3)) for _ in range(n)], dtype=torch.int64)
    bonus = torch.tensor([draw(st.integers(4, 9)) for _ in range(reqs)], dtype=torch.int64)
    greedy = draw(st.one_of(st.none(), st.lists(st.booleans(), min_size=reqs,
                                                max_size=reqs)))
    return cu, draft, target, bonus, None if greedy is None else torch.tensor(greedy), width


@settings(max_examples=60, deadline=None)
@given(_batches())
def test_rejection_greedy_sample_matches_the_kernel(batch):
    cu, draft, target, bonus, greedy, width = batch
    out = torch.full((len(cu), width + 1), -1, dtype=torch.int64)
    K.GridKernel("k", K.rejection_greedy_sample)[(len(cu),)](
        out, cu, draft, target, bonus, greedy, width)
    assert torch.equal(out, _greedy_reference(cu, draft, target, bonus, greedy, width))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5).flatmap(lambda reqs: st.tuples(
    st.lists(st.lists(st.integers(-1, 12), min_size=3, max_size=3), min_size=reqs,
             max_size=reqs),
    st.lists(st.booleans(), min_size=reqs, max_size=reqs))))
def test_prepare_next_token_padded_matches_the_kernel(case):
    rows, discard = case
    sampled = torch.tensor(rows, dtype=torch.int64)
    reqs, vocab = len(rows), 10
    backup = torch.arange(reqs, dtype=torch.int64) + 50
    nxt = torch.zeros(reqs, dtype=torch.int64)
    count = torch.zeros(reqs, dtype=torch.int64)
    K.GridKernel("k", K.eagle_prepare_next_token_padded)[(reqs,)](
        sampled, torch.tensor(discard), backup, nxt, count, vocab, 3, reqs, 3, 4)
    for r in range(reqs):
        valid = [i for i, t in enumerate(rows[r]) if t != -1 and t < vocab]
        if discard[r]:
            assert (int(nxt[r]), int(count[r])) == (int(backup[r]), 0)
        elif valid:
            assert (int(nxt[r]), int(count[r])) == (rows[r][valid[-1]], len(valid))
        else:
            assert (int(nxt[r]), int(count[r])) == (int(backup[r]), 0)


def test_prepare_inputs_padded_matches_the_kernel():
    cu = torch.tensor([2, 2, 5])          # drafts per request: 2, 0, 3
    valid = torch.tensor([1, 1, 4])       # 1 + accepted
    qsl = torch.tensor([0, 3, 4, 8])
    sample_at = torch.zeros(3, dtype=torch.int64)
    rejected = torch.zeros(3, dtype=torch.int64)
    K.GridKernel("k", K.eagle_prepare_inputs_padded)[(3,)](cu, valid, qsl, sample_at,
                                                             rejected, 3)
    # request 0: 2 drafts, 0 accepted -> 2 rejected, sample at its token 0;
    # request 1: no drafts -> none rejected; request 2: all 3 accepted
    assert rejected.tolist() == [2, 0, 0]
    assert sample_at.tolist() == [0, 3, 7]


def test_a_launch_looks_like_triton():
    """``kernel[grid](...)`` with a bare int grid as well as a tuple."""
    seen = []
    k = K.GridKernel("k", lambda grid, x: seen.append((grid, x)))
    k[3](1)
    k[(2, 5)](2)
    assert seen == [((3,), 1), ((2, 5), 2)]
