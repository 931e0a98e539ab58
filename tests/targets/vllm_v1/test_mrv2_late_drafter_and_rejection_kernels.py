"""The vLLM target's torch stand-ins for Model Runner V2's later drafter and rejection
Triton kernels (``targets/vllm/mrv2/draft_kernels_late.py``'s three;
``spec_kernels_late.py``'s statistics, rejection and resample kernels) against
loop-by-loop references written from each kernel's own per-program code (0.34.0
``vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py``,
``spec_decode/rejection_sampler_utils.py``), on random batches, in the core
environment (no vLLM). The target runs greedy requests only: the rejection kernels'
greedy branches are checked exactly; a row at a temperature above 0 is checked for
``NOT_GREEDY`` where the stand-in writes it (as ``test_mrv2_late_spec_kernels.py``
does). ``tl.max`` / ``tl.argmax`` pick the first of ties.
"""
from __future__ import annotations

import torch
from hypothesis import given, strategies as st

from targets.vllm.mrv2 import draft_kernels_late as DL, spec_kernels_late as SL
from targets.vllm.mrv2.spec_kernels import NOT_GREEDY
from tests.targets.vllm_v1.test_mrv2_input_kernels import (MAX_REQS, SETTINGS, batches,
                                                           ints, launch, logit_layouts)
from tests.targets.vllm_v1.test_mrv2_late_spec_kernels import NEG, _argmax, floats
from tests.targets.vllm_v1.test_mrv2_spec_kernels import drafter_query


def _temps(data):
    return torch.tensor([data.draw(st.sampled_from([0.0, 0.0, 0.7]))
                         for _ in range(MAX_REQS)])


def _expanded(data, cu):
    """Each logit row's request-state index and its position within its request."""
    reqs = len(cu) - 1
    idx = data.draw(st.permutations(range(MAX_REQS)))[:reqs]
    lens = [int(cu[b + 1] - cu[b]) for b in range(reqs)]
    expanded = torch.tensor([idx[b] for b in range(reqs) for _ in range(lens[b])],
                            dtype=torch.int32)
    local = torch.tensor([i for b in range(reqs) for i in range(lens[b])],
                         dtype=torch.int32)
    return torch.tensor(idx, dtype=torch.int32), expanded, local


def _block_max(vals, b, block, vocab):
    """A block's (first argmax token, max) as the kernels load it: other=-inf."""
    row = [vals[i] if i < vocab else NEG for i in range(b * block, (b + 1) * block)]
    return b * block + _argmax(row), max(row)


def _block_outputs(rows, blocks):
    """Per row, each vocabulary block's argmax and maximum as the kernels write them, -9
    until written (a column past the last block, which no program may write)."""
    return (torch.full((rows, blocks + 1), -9, dtype=torch.int64),
            torch.full((rows, blocks + 1), -9.0))


# --- spec_decode/target_dependent_ar/speculator.py ------------------------------------

@SETTINGS
@given(batches(), st.data())
def test_prepare_prefill_inputs_matches_the_kernel(batch, data):
    qlens, qsl, idx = batch
    reqs, n = len(qlens), int(qsl[len(qlens)])
    tokens = n + data.draw(st.integers(0, 3))
    target_ids, target_pos = ints(data.draw, tokens, 0, 90), ints(data.draw, tokens, 0, 50,
                                                                  torch.int64)
    seq_lens = ints(data.draw, MAX_REQS, 1, 60)
    num_sampled = ints(data.draw, reqs, 0, 2)
    num_rejected = torch.tensor([data.draw(st.integers(0, q - 1)) for q in qlens],
                                dtype=torch.int32)
    last_sampled = ints(data.draw, MAX_REQS, 100, 190, torch.int64)
    next_prefill = ints(data.draw, MAX_REQS, 200, 290)
    ids, pos = torch.full((tokens,), -7, dtype=torch.int32), torch.full((tokens,), -7,
                                                                        dtype=torch.int64)
    last_idx = torch.full((MAX_REQS,), -7, dtype=torch.int64)
    dqsl, dseq = torch.full((MAX_REQS + 1,), -7, dtype=torch.int32), torch.full(
        (MAX_REQS,), -7, dtype=torch.int32)
    step = torch.full((1,), 5, dtype=torch.int64)
    want = [t.clone() for t in (last_idx, step, ids, pos, dqsl, dseq)]
    launch(DL.prepare_prefill_inputs, (reqs,))(
        last_idx, step, ids, pos, dqsl, dseq, target_ids, target_pos, idx, last_sampled,
        next_prefill, num_sampled, num_rejected, qsl, seq_lens, MAX_REQS, BLOCK_SIZE=4)
    w_last, w_step, w_ids, w_pos, w_qsl, w_seq = want
    for r in range(reqs):  # _prepare_prefill_inputs_kernel, program r
        s, end = int(qsl[r]), int(qsl[r + 1])
        query_len = end - s - int(num_rejected[r])
        state = int(idx[r])
        nxt = (int(last_sampled[state]) if int(num_sampled[r]) > 0
               else int(next_prefill[state]))
        w_last[r] = drafter_query(w_ids, w_pos, target_ids, target_pos, s, query_len, nxt)
        w_qsl[r], w_seq[r] = s, seq_lens[r]
        if r == reqs - 1:
            w_step[0] = 0
            for b in range(reqs, MAX_REQS + 1):
                w_qsl[b] = end
            for b in range(reqs, MAX_REQS):
                w_seq[b], w_last[b] = 0, 0
    got = (last_idx, step, ids, pos, dqsl, dseq)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@SETTINGS
@given(st.integers(1, 6), st.booleans(), st.booleans(), st.data())
def test_prepare_decode_inputs_matches_the_kernel(reqs, advance, column_view, data):
    width, max_len = data.draw(st.integers(1, 4)), data.draw(st.integers(2, 40))
    drafts = ints(data.draw, MAX_REQS * width, 0, 90, torch.int64).view(MAX_REQS, width)
    drafts_arg = drafts[:, 0] if column_view else drafts  # both read row r at r * stride
    target_seq = ints(data.draw, MAX_REQS, 1, max_len)
    num_rejected = torch.tensor([data.draw(st.integers(0, int(target_seq[r]) - 1))
                                 for r in range(MAX_REQS)], dtype=torch.int32)
    ids = torch.full((MAX_REQS + 2,), -7, dtype=torch.int32)
    positions = ints(data.draw, MAX_REQS + 2, 0, max_len - 1, torch.int64)
    sample_pos = ints(data.draw, MAX_REQS + 2, 0, 50, torch.int64)
    qsl = torch.full((MAX_REQS + 2,), -7, dtype=torch.int32)
    seq = torch.full((MAX_REQS + 2,), -7, dtype=torch.int32)
    want = [t.clone() for t in (ids, positions, sample_pos, qsl, seq)]
    launch(DL.prepare_decode_inputs, (reqs + 1,))(
        drafts_arg, width, target_seq, num_rejected, ids, positions, sample_pos, qsl, seq,
        max_len, MAX_REQS, BLOCK_SIZE=4, ADVANCE_DRAFT_POSITIONS=advance)
    w_ids, w_pos, w_sp, w_qsl, w_seq = want
    flat = drafts.view(-1)
    for r in range(reqs + 1):  # _prepare_decode_inputs_kernel, program r
        if r == reqs:
            for b in range(MAX_REQS + 1):
                w_qsl[b] = b if b < reqs else reqs
            for b in range(r, MAX_REQS):
                w_seq[b] = 0
            continue
        w_ids[r] = flat[r * width]
        w_sp[r] = w_sp[r] + 1
        seq_len = int(target_seq[r]) - int(num_rejected[r])
        if advance:
            w_pos[r] = min(int(w_pos[r]) + 1, max_len - 1)
            seq_len = min(seq_len + 1, max_len)
        w_seq[r] = seq_len
    got = (ids, positions, sample_pos, qsl, seq)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@SETTINGS
@given(st.integers(1, 6), st.booleans(), st.booleans(), st.data())
def test_update_draft_inputs_matches_the_kernel(reqs, advance, cap_as_int, data):
    steps = data.draw(st.integers(1, 4))
    step_now = data.draw(st.integers(0, steps - 1))
    hidden, max_len = data.draw(st.integers(1, 5)), data.draw(st.integers(2, 40))
    out_stride = steps + data.draw(st.integers(0, 2))
    out = torch.full((MAX_REQS, out_stride), -7, dtype=torch.int64)
    next_hidden = torch.full((MAX_REQS, hidden + data.draw(st.integers(0, 2))), -7.0)
    src_hidden = torch.randn(MAX_REQS, hidden + data.draw(st.integers(0, 2)))
    ids = torch.full((MAX_REQS,), -7, dtype=torch.int32)
    positions = ints(data.draw, MAX_REQS, 0, max_len - 1, torch.int64)
    seq = ints(data.draw, MAX_REQS, 1, max_len)
    sample_pos = ints(data.draw, MAX_REQS, 0, 50, torch.int64)
    drafts = ints(data.draw, MAX_REQS, 0, 90, torch.int64)
    step = torch.tensor([step_now], dtype=torch.int64)
    cap = max_len if cap_as_int else torch.tensor([max_len], dtype=torch.int32)
    want = [t.clone() for t in (out, next_hidden, ids, positions, sample_pos, seq)]
    launch(DL.update_draft_inputs, (reqs,))(
        out, out.stride(0), next_hidden, next_hidden.stride(0), ids, positions, sample_pos,
        seq, drafts, step, src_hidden, src_hidden.stride(0), hidden, cap, steps,
        BLOCK_SIZE=2, ADVANCE_DRAFT_POSITIONS=advance)
    w_out, w_hid, w_ids, w_pos, w_sp, w_seq = want
    for r in range(reqs):  # _update_draft_inputs_kernel, program r
        w_out.view(-1)[r * out_stride + step_now] = drafts[r]
        if step_now >= steps - 1:
            continue
        w_sp[r] = w_sp[r] + 1
        w_ids[r] = drafts[r]
        for i in range(hidden):
            w_hid.view(-1)[r * next_hidden.stride(0) + i] = src_hidden.view(-1)[
                r * src_hidden.stride(0) + i]
        if advance:
            w_pos[r] = min(int(w_pos[r]) + 1, max_len - 1)
            w_seq[r] = min(int(w_seq[r]) + 1, max_len)
    got = (out, next_hidden, ids, positions, sample_pos, seq)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert int(step) == step_now  # the kernel only reads the step


# --- spec_decode/rejection_sampler_utils.py -------------------------------------------

@SETTINGS
@given(st.integers(1, 5).flatmap(lambda reqs: st.tuples(logit_layouts(reqs), st.data())))
def test_compute_local_logits_stats_matches_the_kernel_on_greedy_rows(case):
    """A bonus row (the next row starts a request, or none follows) writes nothing; a
    greedy row each block's first maximum and that maximum. (A row at a temperature
    above 0 gets max and sum-exp from the kernel, nothing from the stand-in: the
    target never samples so; not checked.)"""
    cu, data = case
    n, vocab, block = int(cu[-1]), data.draw(st.integers(1, 30)), 8
    blocks = -(-vocab // block)
    _idx, expanded, local = _expanded(data, cu)
    temp = _temps(data)
    stride = vocab + data.draw(st.integers(0, 3))
    logits = floats(data, n * stride, nan=False).view(n, stride)
    argmax, best = _block_outputs(n, blocks)
    sumexp = torch.full((n, blocks + 1), -9.0)
    want_a, want_m = argmax.clone(), best.clone()
    launch(SL.compute_local_logits_stats, (n, blocks))(
        target_local_argmax_ptr=argmax, target_local_argmax_stride=argmax.stride(0),
        target_local_max_ptr=best, target_local_max_stride=best.stride(0),
        target_local_sumexp_ptr=sumexp, target_local_sumexp_stride=sumexp.stride(0),
        draft_local_max_ptr=None, draft_local_max_stride=0, draft_local_sumexp_ptr=None,
        draft_local_sumexp_stride=0, target_logits_ptr=logits,
        target_logits_stride=logits.stride(0), draft_logits_ptr=None,
        draft_logits_stride_0=0, draft_logits_stride_1=0, draft_logits_row_mapping_ptr=None,
        expanded_idx_mapping_ptr=expanded, expanded_local_pos_ptr=local, temp_ptr=temp,
        vocab_size=vocab, num_logits=n, BLOCK_SIZE=block, HAS_DRAFT_LOGITS=False)
    flat = logits.view(-1).tolist()
    greedy = []
    for t in range(n):  # _compute_local_logits_stats_kernel, program (t, b)
        next_local = int(local[t + 1]) if t + 1 < n else 0
        if next_local == 0:
            continue
        if float(temp[int(expanded[t])]) != 0.0:
            continue
        greedy.append(t)
        row = flat[t * stride:t * stride + vocab]
        for b in range(blocks):
            want_a[t, b], want_m[t, b] = _block_max(row, b, block, vocab)
    rows = [t for t in range(n) if t in greedy
            or (int(local[t + 1]) if t + 1 < n else 0) == 0]
    assert torch.equal(argmax[rows], want_a[rows]) and torch.equal(best[rows], want_m[rows])
    assert (sumexp == -9.0).all()  # the greedy branch writes no sum-exp


@SETTINGS
@given(st.integers(1, 5).flatmap(lambda reqs: st.tuples(logit_layouts(reqs), st.data())))
def test_rejection_matches_the_kernel_on_greedy_requests(case):
    cu, data = case
    reqs, n, width = len(cu) - 1, int(cu[-1]), 4
    blocks = data.draw(st.integers(1, 4))
    lstride = blocks + data.draw(st.integers(0, 2))
    idx, _expanded_idx, _local = _expanded(data, cu)
    temp = _temps(data)
    local_argmax = ints(data.draw, n * lstride, 0, 5, torch.int64).view(n, lstride)
    local_max = floats(data, n * lstride).view(n, lstride)
    # drafts: often the target's own choice, now and then a -1 placeholder
    draft_sampled = ints(data.draw, n + 1, -1, 5, torch.int64)
    sampled = torch.full((reqs, width), -7, dtype=torch.int64)
    steps = torch.full((reqs,), -7, dtype=torch.int32)
    t_lse, d_lse = torch.full((reqs,), -7.0), torch.full((reqs,), -7.0)
    want_s, want_steps = sampled.clone(), steps.clone()
    launch(SL.rejection, (reqs,))(
        sampled_ptr=sampled, sampled_stride=width, rejected_steps_ptr=steps,
        target_rejected_logsumexp_ptr=t_lse, draft_rejected_logsumexp_ptr=d_lse,
        target_logits_ptr=None, target_logits_stride=0,
        target_local_argmax_ptr=local_argmax, target_local_argmax_stride=lstride,
        target_local_max_ptr=local_max, target_local_max_stride=lstride,
        target_local_sumexp_ptr=None, target_local_sumexp_stride=0,
        draft_sampled_ptr=draft_sampled, draft_logits_ptr=None, draft_logits_stride_0=0,
        draft_logits_stride_1=0, draft_logits_row_mapping_ptr=None,
        draft_local_max_ptr=None, draft_local_max_stride=0, draft_local_sumexp_ptr=None,
        draft_local_sumexp_stride=0, cu_num_logits_ptr=cu, idx_mapping_ptr=idx,
        temp_ptr=temp, seed_ptr=torch.zeros(MAX_REQS, dtype=torch.int64),
        pos_ptr=torch.zeros(n, dtype=torch.int64), synthetic_conditional_rates_ptr=None,
        cumulative_log_p_ptr=None, local_residual_mass_ptr=None,
        local_residual_mass_stride=0, fly_entropy_ptr=None, fly_entropy_threshold=0.0,
        vocab_num_blocks=blocks, PADDED_VOCAB_NUM_BLOCKS=4, HAS_DRAFT_LOGITS=False,
        SYNTHETIC_MODE=False, USE_BLOCK_VERIFICATION=False, FLY_WINDOW_SIZE=0)
    lmax, larg = local_max.view(-1).tolist(), local_argmax.view(-1).tolist()
    for r in range(reqs):  # _rejection_kernel, program r (greedy, FLY_WINDOW_SIZE 0)
        start, end = int(cu[r]), int(cu[r + 1])
        if float(temp[int(idx[r])]) != 0.0:
            assert int(sampled[r, 0]) == NOT_GREEDY
            continue
        accepted_length, verifying = 0, True
        for i in range(end - start - 1):
            logit = start + i
            draft = int(draft_sampled[logit + 1])
            valid, draft = draft >= 0, max(0, draft)
            if not verifying:
                continue
            # _compute_global_target_argmax: padded blocks -inf, NaN as -inf
            vals = [lmax[logit * lstride + b] if b < blocks else NEG for b in range(4)]
            vals = [NEG if v != v else v for v in vals]
            target = larg[logit * lstride + _argmax(vals)]
            accepted = target == draft and valid
            verifying = accepted
            accepted_length += accepted
            want_s[r, i] = draft if accepted else target
        want_steps[r] = accepted_length
        assert float(t_lse[r]) == 0.0 and float(d_lse[r]) == 0.0
    greedy = [r for r in range(reqs) if float(temp[int(idx[r])]) == 0.0]
    assert torch.equal(sampled[greedy], want_s[greedy])
    assert torch.equal(steps[greedy], want_steps[greedy])


@SETTINGS
@given(st.integers(1, 5).flatmap(lambda reqs: st.tuples(logit_layouts(reqs), st.data())),
       st.sampled_from([torch.float32, torch.float16]))
def test_resample_matches_the_kernel_on_greedy_requests(case, dtype):
    """A greedy request resamples only its bonus position (all drafts accepted): each
    block's first maximum of the target logits there, and that maximum."""
    cu, data = case
    reqs, n, vocab, block = len(cu) - 1, int(cu[-1]), data.draw(st.integers(1, 30)), 8
    blocks = -(-vocab // block)
    _idx, expanded, _local = _expanded(data, cu)
    temp = _temps(data)
    stride = vocab + data.draw(st.integers(0, 3))
    logits = floats(data, n * stride, nan=False).to(dtype).view(n, stride)
    rejected = torch.tensor([data.draw(st.integers(0, int(cu[b + 1] - cu[b]) - 1))
                             for b in range(reqs)], dtype=torch.int32)
    draft_sampled = ints(data.draw, n + 1, -1, 30, torch.int64)
    argmax, best = _block_outputs(reqs, blocks)
    want_a, want_m = argmax.clone(), best.clone()
    launch(SL.resample, (reqs, blocks))(
        resampled_local_argmax_ptr=argmax, resampled_local_argmax_stride=argmax.stride(0),
        resampled_local_max_ptr=best, resampled_local_max_stride=best.stride(0),
        target_logits_ptr=logits, target_logits_stride=logits.stride(0),
        target_rejected_logsumexp_ptr=torch.zeros(reqs), draft_logits_ptr=None,
        draft_logits_stride_0=0, draft_logits_stride_1=0, draft_logits_row_mapping_ptr=None,
        draft_rejected_logsumexp_ptr=torch.zeros(reqs), rejected_step_ptr=rejected,
        cu_num_logits_ptr=cu, expanded_idx_mapping_ptr=expanded,
        draft_sampled_ptr=draft_sampled, temp_ptr=temp,
        seed_ptr=torch.zeros(MAX_REQS, dtype=torch.int64),
        pos_ptr=torch.zeros(n, dtype=torch.int64), cumulative_log_p_ptr=None,
        contexts_ptr=None, contexts_stride=0, watermarking_ptr=None,
        watermarking_skip_mask_ptr=None, watermark_key_0=0, watermark_key_1=0,
        vocab_size=vocab, BLOCK_SIZE=block, HAS_DRAFT_LOGITS=False, USE_FP64=False,
        USE_BLOCK_VERIFICATION=False, CONTEXT_WIDTH=1, WATERMARK=False,
        DEDUPLICATE_CONTEXTS=False, SKIP_MASKED_BLOCKS=False)
    flat = logits.to(torch.float32).view(-1).tolist()
    for r in range(reqs):  # _resample_kernel, program (r, b)
        at = int(cu[r]) + int(rejected[r])
        is_bonus = at == int(cu[r + 1]) - 1
        if float(temp[int(expanded[at])]) != 0.0:
            assert (argmax[r, :blocks] == NOT_GREEDY).all()
            continue
        if not is_bonus:
            continue  # greedy, rejected: the target's argmax is already in place
        row = flat[at * stride:at * stride + vocab]  # the bonus: the target's logits
        for b in range(blocks):
            want_a[r, b], want_m[r, b] = _block_max(row, b, block, vocab)
    greedy = [r for r in range(reqs)
              if float(temp[int(expanded[int(cu[r]) + int(rejected[r])])]) == 0.0]
    assert torch.equal(argmax[greedy], want_a[greedy])
    assert torch.equal(best[greedy], want_m[greedy])
