"""The vLLM target's torch stand-ins for Model Runner V2's later sampling, rejection and
grammar Triton kernels (``targets/vllm/mrv2/spec_kernels_late.py``) against
loop-by-loop references written from each kernel's own per-program code (0.34.0
``vllm/v1/worker/gpu/sample/{gumbel,greedy_argmax}.py``,
``spec_decode/rejection_sampler{,_utils}.py``, ``structured_outputs.py``), on random
batches, in the core environment (no vLLM). ``tl.argmax`` / ``tl.min`` pick the first
of ties, which the references do with ``list.index``.
"""
from __future__ import annotations

import torch
from hypothesis import given, strategies as st

from targets.vllm.mrv2 import spec_kernels_late as SL
from tests.targets.vllm_v1.test_mrv2_input_kernels import (MAX_REQS, SETTINGS, ints,
                                                           launch, logit_layouts)

NAN, NEG = float("nan"), float("-inf")


def floats(data, n, nan=True):
    """Small integer-valued floats (ties likely), now and then a NaN."""
    pool = [-2.0, -1.0, 0.0, 1.0, 2.0] + ([NAN] if nan else [])
    return torch.tensor([data.draw(st.sampled_from(pool)) for _ in range(n)])


def _argmax(vals):
    """``tl.argmax`` of a block with no NaN: the first maximum."""
    return vals.index(max(vals))


@SETTINGS
@given(st.data())
def test_gumbel_combine_matches_the_kernel(data):
    rows, blocks = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 6))
    stride = blocks + data.draw(st.integers(0, 2))
    local_max = floats(data, rows * stride).view(rows, stride)
    local_argmax = ints(data.draw, rows * stride, 0, 999, torch.int64).view(rows, stride)
    sampled = torch.full((rows + 2,), -7, dtype=torch.int64)
    want = sampled.clone()
    launch(SL.gumbel_combine, (rows,))(local_argmax, stride, local_max, stride, sampled,
                                       blocks, PADDED_NUM_BLOCKS=8)
    for row in range(rows):  # _gumbel_combine_kernel, program row
        vals = [float(local_max.view(-1)[row * stride + b]) for b in range(blocks)]
        vals += [NEG] * (8 - blocks)  # the padded blocks: other=-inf
        nans = [b for b, v in enumerate(vals) if v != v]
        if nans:
            winner = nans[0]
        else:
            top = max(vals)
            winner = min(b for b, v in enumerate(vals) if b < blocks and v == top)
        want[row] = local_argmax.view(-1)[row * stride + winner]
    assert torch.equal(sampled, want)


@SETTINGS
@given(st.data())
def test_greedy_argmax_matches_the_kernels(data):
    rows, n, block = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 30)), 8
    splits = -(-n // block)
    sx = n + data.draw(st.integers(0, 3))
    x = floats(data, rows * sx).view(rows, sx)
    pv, pi = torch.full((rows * splits,), -9.0), torch.full((rows * splits,), -9)
    out = torch.full((rows,), -9, dtype=torch.int64)
    launch(SL.argmax_partial, (rows, splits))(x, pv, pi, n, sx, splits, block)
    want_v, want_i = [0.0] * (rows * splits), [0] * (rows * splits)
    flat = x.view(-1).tolist()
    for row in range(rows):  # _argmax_partial, program (row, part)
        for part in range(splits):
            cols = range(part * block, (part + 1) * block)
            vals = [flat[row * sx + c] if c < n else NEG for c in cols]
            vals = [NEG if v != v else v for v in vals]
            want_v[row * splits + part] = max(vals)
            want_i[row * splits + part] = part * block + _argmax(vals)
    assert pv.tolist() == want_v and pi.tolist() == want_i
    launch(SL.argmax_finish, (rows,))(pv, pi, out, splits, 8)
    for row in range(rows):  # _argmax_finish, program row (BLOCK >= SPLITS)
        vals = want_v[row * splits:(row + 1) * splits] + [NEG] * (8 - splits)
        assert int(out[row]) == want_i[row * splits + _argmax(vals)]


@SETTINGS
@given(st.integers(1, 5).flatmap(lambda reqs: st.tuples(logit_layouts(reqs), st.data())))
def test_flatten_sampled_matches_the_kernel(case):
    cu, data = case
    reqs, width, n = len(cu) - 1, 4, int(cu[-1])
    sampled = ints(data.draw, reqs * width, 0, 90, torch.int64).view(reqs, width)
    num_sampled = torch.tensor([data.draw(st.integers(0, int(cu[b + 1] - cu[b])))
                                for b in range(reqs)], dtype=torch.int32)
    flat = torch.full((n,), -7, dtype=torch.int64)
    want = flat.clone()
    launch(SL.flatten_sampled, (reqs,))(flat, sampled, width, num_sampled, cu)
    for r in range(reqs):  # _flatten_sampled_kernel, program r
        for i in range(int(num_sampled[r])):
            want[int(cu[r]) + i] = sampled.view(-1)[r * width + i]
    assert torch.equal(flat, want)


@SETTINGS
@given(st.integers(1, 5).flatmap(lambda reqs: st.tuples(logit_layouts(reqs), st.data())))
def test_gather_draft_sampled_matches_the_kernel(case):
    cu, data = case
    reqs, n, block = len(cu) - 1, int(cu[-1]), 4
    idx = data.draw(st.permutations(range(MAX_REQS)))[:reqs]
    tokens = n + data.draw(st.integers(0, 6))
    input_ids = ints(data.draw, tokens, 0, 90)
    positions = ints(data.draw, tokens, 0, 30, torch.int64)
    logits_indices = ints(data.draw, n, 0, tokens - 1, torch.int64)
    expanded = torch.tensor([idx[b] for b in range(reqs) for _ in range(int(cu[b + 1] - cu[b]))],
                            dtype=torch.int32)
    local = torch.tensor([i for b in range(reqs) for i in range(int(cu[b + 1] - cu[b]))],
                         dtype=torch.int32)
    prefill = ints(data.draw, MAX_REQS, 1, 30)
    draft = torch.full((n + 1,), -7, dtype=torch.int64)
    pos = torch.full((n + 1,), -7, dtype=torch.int64)
    want_d, want_p = draft.clone(), pos.clone()
    launch(SL.gather_draft_sampled, (-(-n // block),))(
        draft, pos, input_ids, positions, logits_indices, expanded, local, prefill, n,
        BLOCK_SIZE=block)
    for pid in range(-(-n // block)):  # _gather_draft_sampled_kernel, program pid
        for i in range(pid * block, min((pid + 1) * block, n)):
            t = int(logits_indices[i])
            p, lp = int(positions[t]), int(local[i])
            placeholder = lp > 0 and p - lp < int(prefill[int(expanded[i])])
            want_d[i] = -1 if placeholder else int(input_ids[t])
            want_p[i] = p
    assert torch.equal(draft, want_d) and torch.equal(pos, want_p)


@SETTINGS
@given(st.integers(1, 5).flatmap(lambda reqs: st.tuples(logit_layouts(reqs), st.data())))
def test_insert_resampled_matches_the_kernel(case):
    cu, data = case
    reqs, width, n, blocks = len(cu) - 1, 4, int(cu[-1]), data.draw(st.integers(1, 4))
    idx = data.draw(st.permutations(range(MAX_REQS)))[:reqs]
    expanded = torch.tensor([idx[b] for b in range(reqs) for _ in range(int(cu[b + 1] - cu[b]))],
                            dtype=torch.int32)
    temp = torch.tensor([data.draw(st.sampled_from([0.0, 0.0, 0.7])) for _ in range(MAX_REQS)])
    # the accepted count: at most the request's drafts
    num_sampled = torch.tensor([data.draw(st.integers(0, int(cu[b + 1] - cu[b]) - 1))
                                for b in range(reqs)], dtype=torch.int32)
    sampled = torch.full((reqs, width), -7, dtype=torch.int64)
    res_arg = ints(data.draw, reqs * blocks, 0, 999, torch.int64).view(reqs, blocks)
    res_max = floats(data, reqs * blocks).view(reqs, blocks)
    want_s, want_n = sampled.clone(), num_sampled.clone()
    launch(SL.insert_resampled, (reqs,))(
        sampled, width, num_sampled, res_arg, blocks, res_max, blocks, blocks, cu, expanded,
        temp, PADDED_RESAMPLE_NUM_BLOCKS=4)
    for r in range(reqs):  # _insert_resampled_kernel, program r
        ns = int(want_n[r])
        at = int(cu[r]) + ns
        want_n[r] = ns + 1
        if float(temp[int(expanded[at])]) == 0.0 and at != int(cu[r + 1]) - 1:
            continue
        vals = [float(res_max[r, b]) if b < blocks else NEG for b in range(4)]
        vals = [NEG if v != v else v for v in vals]
        want_s.view(-1)[r * width + ns] = res_arg.view(-1)[r * blocks + _argmax(vals)]
    assert torch.equal(sampled, want_s) and torch.equal(num_sampled, want_n)


@SETTINGS
@given(st.integers(1, 4).flatmap(lambda reqs: st.tuples(logit_layouts(reqs), st.data())))
def test_apply_grammar_bitmask_matches_the_kernel(case):
    """Masks name (request, position) pairs, MASK_STRIDE positions a request; a position
    past the request's logits is inactive."""
    cu, data = case
    reqs, mask_stride = len(cu) - 1, 4
    vocab, block = data.draw(st.integers(1, 70)), 32
    words = -(-vocab // 32)
    pairs = data.draw(st.permutations(range(reqs * mask_stride)))
    pairs = pairs[:data.draw(st.integers(1, len(pairs)))]
    logits = torch.randn(int(cu[-1]), vocab + data.draw(st.integers(0, 2)))
    bitmask = ints(data.draw, len(pairs) * words, -2**31, 2**31 - 1).view(len(pairs), words)
    want = logits.clone()
    grid = (len(pairs), -(-vocab // block))
    launch(SL.apply_grammar_bitmask, grid)(
        logits, logits.stride(0), torch.tensor(pairs, dtype=torch.int32), cu, bitmask,
        words, vocab, MASK_STRIDE=mask_stride, BLOCK_SIZE=block)
    flat, bits = want.view(-1), bitmask.view(-1)
    for m in range(grid[0]):  # _apply_grammar_bitmask_kernel, program (m, b)
        req, position = pairs[m] // mask_stride, pairs[m] % mask_stride
        if position >= int(cu[req + 1] - cu[req]):
            continue
        row = int(cu[req]) + position
        for b in range(grid[1]):
            for v in range(b * block, min((b + 1) * block, vocab)):
                if (int(bits[m * words + v // 32]) >> (v % 32)) & 1 == 0:
                    flat[row * logits.stride(0) + v] = NEG
    assert torch.equal(logits, want)


@SETTINGS
@given(st.booleans(), st.sampled_from([torch.float32, torch.float16]), st.data())
def test_gumbel_sample_matches_the_kernel_at_temperature_zero(has_bias, dtype, data):
    """Greedy rows (temperature 0, or a row with no request, index -1: temperature 0 by
    the masked load): each block's first maximum of the (biased, rounded to the logits'
    dtype) logits and that maximum. Other rows draw murmur3 noise, which the stand-in
    does not reproduce: their argmax is ``NOT_GREEDY`` (as in 0.17.0's test)."""
    rows, vocab, block = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 40)), 8
    blocks = -(-vocab // block)
    stride = vocab + data.draw(st.integers(0, 3))
    logits = floats(data, rows * stride, nan=False).to(dtype).view(rows, stride)
    bias = (floats(data, rows * stride, nan=False) / 8).view(rows, stride)
    idx = data.draw(st.permutations(range(MAX_REQS)))[:rows]
    idx = torch.tensor([-1 if data.draw(st.integers(0, 4)) == 0 else r for r in idx],
                       dtype=torch.int32)
    temp = torch.tensor([data.draw(st.sampled_from([0.0, 0.0, 0.7])) for _ in range(MAX_REQS)])
    argmax = torch.full((rows, blocks + 1), -9, dtype=torch.int64)
    best = torch.full((rows, blocks + 1), -9.0)
    launch(SL.gumbel_sample, (rows, blocks))(
        argmax, argmax.stride(0), best, best.stride(0), None, 0, 0, None, None, 0, None,
        logits, logits.stride(0), bias, bias.stride(0), idx,
        torch.zeros(MAX_REQS, dtype=torch.int64), torch.zeros(rows, dtype=torch.int64), temp,
        vocab, BLOCK_SIZE=block, IS_DRAFTING=False, APPLY_TEMPERATURE=False, USE_FP64=False,
        PER_TOKEN_COL=False, HAS_BIAS=has_bias)
    for t in range(rows):  # _gumbel_sample_kernel, program (t, b)
        r = int(idx[t])
        if r >= 0 and float(temp[r]) != 0.0:
            assert (argmax[t, :blocks] == SL.NOT_GREEDY).all()
            continue
        for b in range(blocks):
            vals = []
            for i in range(b * block, (b + 1) * block):
                if i >= vocab:
                    vals.append(NEG)
                    continue
                v = logits[t, i]
                if has_bias:
                    v = (v.to(torch.float32) + bias[t, i]).to(dtype)
                vals.append(float(v))
            assert int(argmax[t, b]) == b * block + _argmax(vals)
            assert float(best[t, b]) == max(vals)
        assert int(argmax[t, blocks]) == -9 and float(best[t, blocks]) == -9.0
