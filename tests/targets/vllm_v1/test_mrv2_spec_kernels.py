"""The vLLM target's torch stand-ins for Model Runner V2's sampling, rejection, EAGLE and
grammar Triton kernels (``targets/vllm/mrv2/spec_kernels.py``) against loop-by-loop
references written from each kernel's own per-program code (0.17.0
``vllm/v1/worker/gpu/sample/gumbel.py``, ``spec_decode/rejection_sample.py``,
``spec_decode/eagle/speculator.py``, ``structured_outputs.py``), on random batches, in
the core environment (no vLLM). The input-preparation kernels:
``test_mrv2_input_kernels.py``, whose batch strategies these share.
"""
from __future__ import annotations

import torch
from hypothesis import given, strategies as st

from targets.vllm.mrv2 import spec_kernels as S
from tests.targets.vllm_v1.test_mrv2_input_kernels import (MAX_REQS, SETTINGS, batches,
                                                           ints, launch, logit_layouts)


@SETTINGS
@given(st.data())
def test_gumbel_sample_matches_the_kernel_at_temperature_zero(data):
    """Greedy rows: each vocabulary block's argmax (the first of ties, as ``tl.max``'s
    default tie-break) and its value. Rows at another temperature draw Gumbel noise from
    Triton's Philox stream, which the stand-in does not reproduce: they get
    ``NOT_GREEDY`` (the target runs greedy requests only)."""
    rows, vocab, block = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 40)), 8
    blocks = -(-vocab // block)
    stride = vocab + data.draw(st.integers(0, 3))  # a logits row may be padded
    logits = ints(data.draw, rows * stride, -3, 3).to(torch.float32).view(rows, stride)
    idx = torch.tensor(data.draw(st.permutations(range(MAX_REQS)))[:rows], dtype=torch.int32)
    temp = torch.tensor([data.draw(st.sampled_from([0.0, 0.0, 0.7])) for _ in range(MAX_REQS)])
    argmax = torch.full((rows, blocks), -9, dtype=torch.int64)
    best = torch.full((rows, blocks), -9.0)
    launch(S.gumbel_sample, (rows, blocks))(
        argmax, argmax.stride(0), best, best.stride(0), logits, logits.stride(0), idx,
        torch.zeros(MAX_REQS, dtype=torch.int64), torch.zeros(rows, dtype=torch.int64), temp,
        vocab, BLOCK_SIZE=block, APPLY_TEMPERATURE=False)
    for t in range(rows):  # _gumbel_sample_kernel, program (t, b)
        if temp[int(idx[t])] != 0.0:
            assert (argmax[t] == S.NOT_GREEDY).all()
            continue
        for b in range(blocks):
            vals = [float(logits[t, i]) if i < vocab else float("-inf")
                    for i in range(b * block, (b + 1) * block)]
            top = max(vals)
            assert int(argmax[t, b]) == b * block + vals.index(top)
            assert float(best[t, b]) == top


@SETTINGS
@given(st.integers(1, 5).flatmap(lambda reqs: st.tuples(logit_layouts(reqs), st.data())))
def test_rejection_sample_matches_the_kernel(case):
    cu, data = case
    reqs, width, n = len(cu) - 1, 4, int(cu[-1])
    target = ints(data.draw, n, 0, 3, torch.int64).view(n, 1)  # the sampler's [n, 1]
    input_ids = ints(data.draw, n, 0, 3)
    sampled = torch.full((reqs, width), -7, dtype=torch.int64)
    num_sampled = torch.full((reqs,), -7, dtype=torch.int32)
    want, want_n = sampled.clone(), num_sampled.clone()
    launch(S.rejection_sample, (reqs,))(sampled, sampled.stride(0), num_sampled, target,
                                        input_ids, cu)
    flat_t = target.view(-1)
    for r in range(reqs):  # _rejection_sample_kernel, program r
        start, num_tokens = int(cu[r]), int(cu[r + 1] - cu[r])
        count, rejected = 0, False
        for i in range(num_tokens - 1):
            if not rejected:
                want[r, i] = flat_t[start + i]
                count += 1
                rejected = int(flat_t[start + i]) != int(input_ids[start + i + 1])
        if not rejected:
            want[r, num_tokens - 1] = flat_t[start + num_tokens - 1]
            count += 1
        want_n[r] = count
    assert torch.equal(sampled, want) and torch.equal(num_sampled, want_n)


def drafter_query(want_ids, want_pos, target_ids, target_pos, start, query_len, nxt):
    """A request's program in the drafter's first-step input kernel (0.17.0's
    _prepare_eagle_inputs, 0.34.0's _prepare_prefill_inputs), from ``start``: the target's
    accepted tokens shifted one to the left, then ``nxt`` (the last sampled token, or the
    next prefill token); the target's positions. Returns its last token's index."""
    for i in range(1, query_len):
        want_ids[start + i - 1] = target_ids[start + i]
    want_ids[start + query_len - 1] = nxt
    for i in range(query_len):
        want_pos[start + i] = target_pos[start + i]
    return start + query_len - 1


@SETTINGS
@given(batches(), st.data())
def test_prepare_eagle_inputs_matches_the_kernel(batch, data):
    qlens, qsl, idx = batch
    reqs, n = len(qlens), int(qsl[len(qlens)]) + data.draw(st.integers(0, 3))
    target_ids, target_pos = ints(data.draw, n, 0, 90), ints(data.draw, n, 0, 90, torch.int64)
    num_sampled = ints(data.draw, reqs, 0, 2)
    num_rejected = torch.tensor([data.draw(st.integers(0, q - 1)) for q in qlens],
                                dtype=torch.int32)
    last = ints(data.draw, MAX_REQS, 0, 90, torch.int64).view(MAX_REQS, 1)
    next_prefill = ints(data.draw, MAX_REQS, 0, 90)
    ids, pos = ints(data.draw, 40, -9, -1), ints(data.draw, 40, -9, -1, torch.int64)
    last_idx = torch.full((reqs,), -1, dtype=torch.int64)
    want_ids, want_pos, want_last = ids.clone(), pos.clone(), last_idx.clone()
    launch(S.prepare_eagle_inputs, (reqs,))(last_idx, ids, pos, target_ids, target_pos,
                                            idx, last, next_prefill, num_sampled,
                                            num_rejected, qsl, BLOCK_SIZE=1024)
    for b in range(reqs):  # _prepare_eagle_inputs_kernel, program b
        r, start = int(idx[b]), int(qsl[b])
        query_len = int(qsl[b + 1] - qsl[b]) - int(num_rejected[b])
        nxt = int(last.view(-1)[r]) if num_sampled[b] > 0 else int(next_prefill[r])
        want_last[b] = drafter_query(want_ids, want_pos, target_ids, target_pos, start,
                                     query_len, nxt)
    assert torch.equal(ids, want_ids) and torch.equal(pos, want_pos)
    assert torch.equal(last_idx, want_last)


@SETTINGS
@given(st.data())
def test_prepare_eagle_decode_matches_the_kernel(data):
    reqs, hidden, model_len = data.draw(st.integers(1, 5)), 6, 30
    tokens = data.draw(st.integers(reqs, 20))  # the target pass's token slots
    drafts = ints(data.draw, reqs, 0, 90, torch.int64)
    out_hidden = torch.randn(tokens, hidden + 2)  # a row may be wider than the hidden size
    last_idx = ints(data.draw, reqs, 0, tokens - 1, torch.int64)
    target_lens = ints(data.draw, reqs, 1, model_len + 2)
    num_rejected = torch.tensor([data.draw(st.integers(0, int(n) - 1)) for n in target_lens],
                                dtype=torch.int32)
    ids, pos = ints(data.draw, 40, -9, -1), ints(data.draw, 40, 0, model_len - 1, torch.int64)
    in_hidden = torch.full((MAX_REQS, hidden + 1), -9.0)
    qsl = ints(data.draw, MAX_REQS + 1, -9, -1)
    seq_lens = ints(data.draw, MAX_REQS, -9, -1)
    want = [t.clone() for t in (ids, pos, in_hidden, qsl, seq_lens)]
    launch(S.prepare_eagle_decode, (reqs + 1,))(
        drafts, out_hidden, out_hidden.stride(0), last_idx, target_lens, num_rejected, ids,
        pos, in_hidden, in_hidden.stride(0), qsl, seq_lens, hidden, model_len, MAX_REQS,
        BLOCK_SIZE=1024)
    w_ids, w_pos, w_hidden, w_qsl, w_lens = want
    for r in range(reqs + 1):  # _prepare_eagle_docode_kernel, program r
        if r == reqs:
            for i in range(MAX_REQS + 1):
                w_qsl[i] = i if i < reqs else reqs
            w_lens[reqs:MAX_REQS] = 0
            continue
        w_ids[r] = drafts[r]
        w_hidden[r, :hidden] = out_hidden[int(last_idx[r]), :hidden]
        w_pos[r] = min(int(w_pos[r]) + 1, model_len - 1)
        w_lens[r] = min(int(target_lens[r]) - int(num_rejected[r]) + 1, model_len)
    assert all(torch.equal(a, b) for a, b in zip((ids, pos, in_hidden, qsl, seq_lens), want))


@SETTINGS
@given(st.data())
def test_update_eagle_inputs_matches_the_kernel(data):
    reqs, hidden, model_len = data.draw(st.integers(1, 5)), 6, 30
    drafts = ints(data.draw, reqs, 0, 90, torch.int64)
    out_hidden = torch.randn(reqs, hidden)
    ids, pos = ints(data.draw, 40, -9, -1), ints(data.draw, 40, 0, model_len - 1, torch.int64)
    in_hidden = torch.full((MAX_REQS, hidden + 1), -9.0)
    seq_lens = ints(data.draw, MAX_REQS, 1, model_len)
    want = [t.clone() for t in (ids, pos, in_hidden, seq_lens)]
    launch(S.update_eagle_inputs, (reqs,))(ids, pos, in_hidden, in_hidden.stride(0),
                                           seq_lens, model_len, drafts, out_hidden,
                                           out_hidden.stride(0), hidden, BLOCK_SIZE=1024)
    w_ids, w_pos, w_hidden, w_lens = want
    for r in range(reqs):  # _update_eagle_inputs_kernel, program r
        w_ids[r] = drafts[r]
        w_hidden[r, :hidden] = out_hidden[r, :hidden]
        w_pos[r] = min(int(w_pos[r]) + 1, model_len - 1)
        w_lens[r] = min(int(w_lens[r]) + 1, model_len)
    assert all(torch.equal(a, b) for a, b in zip((ids, pos, in_hidden, seq_lens), want))


@SETTINGS
@given(st.data())
def test_apply_grammar_bitmask_matches_the_kernel(data):
    """Distinct logits rows per mask, as the worker's mapping makes them (one row per
    logit of a structured-output request)."""
    vocab, rows = data.draw(st.integers(1, 70)), 6
    masks = data.draw(st.integers(1, 4))
    words = -(-vocab // 32)
    logits = torch.randn(rows, vocab + data.draw(st.integers(0, 2)))
    indices = torch.tensor(data.draw(st.permutations(range(rows)))[:masks], dtype=torch.int32)
    bitmask = ints(data.draw, masks * (words + 1), -2**31, 2**31 - 1).view(masks, words + 1)
    want = logits.clone()
    block = 32
    grid = (masks, -(-vocab // block))
    launch(S.apply_grammar_bitmask, grid)(logits, logits.stride(0), indices, bitmask,
                                          bitmask.stride(0), vocab, BLOCK_SIZE=block)
    for m in range(grid[0]):  # _apply_grammar_bitmask_kernel, program (m, b)
        row = int(indices[m])
        for b in range(grid[1]):
            for v in range(b * block, min((b + 1) * block, vocab)):
                if (int(bitmask[m, v // 32]) >> (v % 32)) & 1 == 0:
                    want[row, v] = float("-inf")
    assert torch.equal(logits, want)
