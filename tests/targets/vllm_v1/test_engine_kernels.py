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


def _slot_mapping_reference(num_tokens, max_tokens, qsl, positions, table, block_size,
                            kv_block, per_kv_block, pad):
    """One program per request, one context-parallel rank (0.27.1's kernel; 0.19.0's is
    it with ``kv_block == block_size``, ``per_kv_block == 1``), the last program padding."""
    out = torch.full((max_tokens,), 99, dtype=torch.int64)
    for r in range(len(qsl) - 1):
        for i in range(int(qsl[r]), int(qsl[r + 1])):
            pos = int(positions[i])
            offset = pos % kv_block
            index = (pos // kv_block) * per_kv_block + offset // block_size
            out[i] = int(table[r, index]) * block_size + offset % block_size
    for i in range(num_tokens, max_tokens):
        out[i] = pad
    return out


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4).flatmap(lambda reqs: st.tuples(
    st.lists(st.integers(0, 4), min_size=reqs, max_size=reqs),
    st.sampled_from([(4, 4, 1), (8, 4, 2), (8, 2, 4)]),
    st.integers(0, 3), st.randoms())))
def test_compute_slot_mapping_matches_the_kernel(case):
    lens, (kv_block, block_size, per_kv_block), spare, rnd = case
    qsl = torch.tensor([0] + lens).cumsum(0)
    n = int(qsl[-1])
    positions = torch.tensor([rnd.randrange(0, 31) for _ in range(n)], dtype=torch.int64)
    width = (32 // kv_block) * per_kv_block
    table = torch.tensor([[rnd.randrange(1, 50) for _ in range(width)] for _ in lens],
                         dtype=torch.int32)
    out = torch.full((n + spare,), 99, dtype=torch.int64)
    kw = dict(TOTAL_CP_WORLD_SIZE=1, TOTAL_CP_RANK=0, CP_KV_CACHE_INTERLEAVE_SIZE=1,
              PAD_ID=-1, BLOCK_SIZE=1024)
    if (kv_block, per_kv_block) != (block_size, 1):  # 0.27.1 on: kernel blocks
        kw.update(KV_CACHE_BLOCK_SIZE=kv_block, BLOCKS_PER_KV_BLOCK=per_kv_block)
    K.GridKernel("k", K.compute_slot_mapping)[(len(lens) + 1,)](
        n, n + spare, qsl.to(torch.int32), positions, table, width, block_size, out, **kw)
    assert torch.equal(out, _slot_mapping_reference(n, n + spare, qsl, positions, table,
                                                    block_size, kv_block, per_kv_block, -1))


def test_rejection_takes_the_synthetic_parameters_and_refuses_the_mode():
    """0.23.0 on: three trailing parameters, passed positionally; off, the greedy result."""
    cu, draft, target = torch.tensor([2]), torch.tensor([1, 2]), torch.tensor([1, 3])
    out = torch.full((1, 3), -1, dtype=torch.int64)
    launch = K.GridKernel("k", K.rejection_greedy_sample)[(1,)]
    launch(out, cu, draft, target, torch.tensor([9]), None, 2, None, None,
           SYNTHETIC_MODE=False)
    assert out.tolist() == [[1, 3, -1]]
    try:
        launch(out, cu, draft, target, torch.tensor([9]), None, 2, torch.zeros(2),
               torch.ones(2), SYNTHETIC_MODE=True)
    except NotImplementedError:
        pass
    else:
        raise AssertionError("synthetic mode ran")
