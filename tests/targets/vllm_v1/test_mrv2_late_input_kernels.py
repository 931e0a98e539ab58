"""The vLLM target's torch stand-ins for Model Runner V2's input-preparation Triton
kernels as later releases launch them (``targets/vllm/mrv2/kernels_late.py``) against
loop-by-loop references written from each kernel's own per-program code (0.34.0
``vllm/v1/worker/gpu/{buffer_utils,input_batch,block_table}.py``): one program at a
time, flat pointer arithmetic as the kernel does it, on random batches, in the core
environment (no vLLM). The batch strategies are ``test_mrv2_input_kernels.py``'s; the
late sampling / rejection kernels: ``test_mrv2_late_spec_kernels.py``.
"""
from __future__ import annotations

import torch
from hypothesis import given, strategies as st

from targets.vllm.mrv2 import kernels_late as KL
from tests.targets.vllm_v1.test_mrv2_input_kernels import (MAX_REQS, SETTINGS,
                                                           _pointer_table, batches,
                                                           combine_case, ints, launch,
                                                           logit_layouts,
                                                           prefill_progress,
                                                           slot_mapping_case)


def _idx_with_dummies(data, reqs):
    """Distinct request indices, some rows -1 (a dummy / padded row)."""
    idx = data.draw(st.permutations(range(MAX_REQS)))[:reqs]
    return torch.tensor([-1 if data.draw(st.integers(0, 3)) == 0 else r for r in idx],
                        dtype=torch.int32)


# --- buffer_utils -----------------------------------------------------------------------

@SETTINGS
@given(st.booleans(), st.data())
def test_apply_write_matches_the_kernel(multi, data):
    groups = data.draw(st.integers(1, 3)) if multi else 1
    widths = [data.draw(st.integers(4, 9)) for _ in range(groups)]
    outs = [ints(data.draw, MAX_REQS * w, -5, 5).view(MAX_REQS, w) for w in widths]
    want = [o.clone() for o in outs]
    pairs = data.draw(st.permutations([(g, r) for g in range(groups)
                                       for r in range(MAX_REQS)]))[:data.draw(
                                           st.integers(1, 5))]
    n = len(pairs)
    starts = [data.draw(st.integers(0, 3)) for _ in pairs]
    cu, c = [], 0
    for (g, _r), s in zip(pairs, starts):
        c += data.draw(st.integers(1, widths[g] - s))
        cu.append(c)
    contents = ints(data.draw, c, 0, 99)
    rows = torch.tensor([r for _g, r in pairs], dtype=torch.int32)
    gids = torch.tensor([g for g, _r in pairs], dtype=torch.int32)
    if multi:
        out_arg, stride_arg = _pointer_table(outs), torch.tensor(widths, dtype=torch.int64)
    else:
        out_arg, stride_arg = outs[0], widths[0]
    launch(KL.apply_write, (n, 1))(out_arg, stride_arg, rows,
                                   torch.tensor(starts, dtype=torch.int32), contents,
                                   torch.tensor(cu, dtype=torch.int32), gids,
                                   BLOCK_SIZE=1024, MULTI_GROUP=multi)
    for pid in range(n):  # _apply_write_kernel, program (pid, 0)
        g = int(gids[pid]) if multi else 0
        flat = want[g].view(-1)
        base = int(rows[pid]) * widths[g] + starts[pid]
        cu_start = cu[pid - 1] if pid > 0 else 0
        for i in range(cu[pid] - cu_start):
            flat[base + i] = contents[cu_start + i]
    assert all(torch.equal(a, b) for a, b in zip(outs, want))


# --- input_batch ------------------------------------------------------------------------

@SETTINGS
@given(batches(), st.integers(0, 3), st.data())
def test_prepare_prefill_inputs_matches_the_kernel(batch, lookahead, data):
    qlens, qsl, idx = batch
    width = 24
    prefill, done = prefill_progress(data, qlens, idx, width)
    all_ids = ints(data.draw, MAX_REQS * width, 1, 90).view(MAX_REQS, width)
    input_ids = ints(data.draw, 40, -9, -1)
    nxt = ints(data.draw, max(lookahead, 1) * MAX_REQS, -9, -1).view(-1, MAX_REQS)
    want_ids, want_nxt = input_ids.clone(), nxt.clone()
    launch(KL.prepare_prefill_inputs, (len(qlens),))(
        input_ids, nxt, nxt.stride(0), lookahead, idx, qsl, all_ids, all_ids.stride(0),
        prefill, done, BLOCK_SIZE=1024, LOOKAHEAD_BLOCK=4)
    flat, w_nxt = all_ids.view(-1), want_nxt.view(-1)
    for b in range(len(qlens)):  # _prepare_prefill_inputs_kernel, program b
        r = int(idx[b])
        computed, prefill_len = int(done[r]), int(prefill[r])
        if computed >= prefill_len:
            continue
        start, query_len = int(qsl[b]), int(qsl[b + 1] - qsl[b])
        for i in range(query_len):
            want_ids[start + i] = flat[r * width + computed + i]
        for la in range(lookahead):
            p = computed + query_len + la
            w_nxt[la * MAX_REQS + r] = flat[r * width + p] if p < prefill_len else 0
    assert torch.equal(input_ids, want_ids) and torch.equal(nxt, want_nxt)


@SETTINGS
@given(st.integers(1, 5).flatmap(lambda reqs: st.tuples(logit_layouts(reqs), st.data())),
       st.sampled_from([0, 1]))
def test_combine_sampled_and_draft_tokens_matches_the_kernel(case, new_sampled):
    cu, data = case
    reqs, width = len(cu) - 1, 4
    (idx, qsl, qsl_t, seq_lens, prefill, last, drafts, input_ids,
     logits_indices) = combine_case(cu, data, width)
    want_ids, want_li = input_ids.clone(), logits_indices.clone()
    launch(KL.combine_sampled_and_draft_tokens, (reqs,))(
        input_ids, idx, last, qsl_t, seq_lens, prefill, drafts, drafts.stride(0), cu,
        logits_indices, BLOCK_SIZE=4, NUM_NEW_SAMPLED_TOKENS=new_sampled)
    for b in range(reqs):  # _combine_sampled_and_draft_tokens_kernel, program b
        r = int(idx[b])
        num_logits = int(cu[b + 1] - cu[b])
        num_drafts = num_logits - new_sampled
        query_end = int(qsl_t[b + 1])
        logits_start = query_end - num_logits
        for i in range(num_logits):
            want_li[int(cu[b]) + i] = logits_start + i
        seq_len, prefill_len = int(seq_lens[b]), int(prefill[r])
        if seq_len <= prefill_len:
            continue
        if new_sampled > 0 and seq_len - num_logits >= prefill_len:
            want_ids[logits_start] = last.view(-1)[r]
        for i in range(num_drafts):
            want_ids[query_end - num_drafts + i] = drafts.view(-1)[r * width + i]
    assert torch.equal(input_ids, want_ids) and torch.equal(logits_indices, want_li)


@SETTINGS
@given(batches(), st.booleans(), st.booleans(), st.integers(0, 3), st.data())
def test_post_update_matches_the_kernel(batch, with_bins, with_qsl, num_drafts, data):
    qlens, qsl, _idx = batch
    reqs, width, vocab, model_len = len(qlens), 4, 16, 40
    idx = _idx_with_dummies(data, reqs)
    sampled = ints(data.draw, reqs * width, 0, vocab - 1, torch.int64).view(reqs, width)
    num_sampled = ints(data.draw, reqs, 0, width)
    num_rejected = torch.tensor([data.draw(st.integers(0, q)) for q in qlens],
                                dtype=torch.int32)
    drafts = ints(data.draw, reqs * num_drafts, 0, 90, torch.int64)
    state = [ints(data.draw, MAX_REQS, 0, 10),                                 # computed
             ints(data.draw, MAX_REQS, 0, vocab, torch.int64).view(MAX_REQS, 1),  # last
             ints(data.draw, MAX_REQS * vocab, 0, 2).view(MAX_REQS, vocab),       # bins
             ints(data.draw, MAX_REQS * model_len, 0, vocab).view(MAX_REQS, model_len),
             ints(data.draw, MAX_REQS, 0, model_len - width),                   # total
             ints(data.draw, MAX_REQS * max(num_drafts, 1), -9, -1, torch.int64)]  # out
    want = [t.clone() for t in state]
    computed, last, bins, all_ids, total, drafts_out = state
    launch(KL.post_update, (reqs,))(
        idx, computed, last, bins if with_bins else None, bins.stride(0), sampled,
        sampled.stride(0), num_sampled, num_rejected, qsl if with_qsl else None, all_ids,
        all_ids.stride(0), total, drafts if num_drafts else None, drafts_out, num_drafts)
    w_computed, w_last, w_bins, w_ids, w_total, w_out = (t.view(-1) for t in want)
    flat_s = sampled.view(-1)
    for b in range(reqs):  # _post_update_kernel, program b
        r = int(idx[b])
        if r < 0:
            continue
        for i in range(num_drafts):
            w_out[r * num_drafts + i] = drafts[b * num_drafts + i]
        total_len, n = int(w_total[r]), int(num_sampled[b])
        if n > 0:
            w_last[r] = flat_s[b * width + n - 1]
            w_total[r] = total_len + n
        for i in range(n):
            token = int(flat_s[b * width + i])
            w_ids[r * model_len + total_len + i] = token
            if with_bins:
                w_bins[r * vocab + token] += 1
        query_len = int(qsl[b + 1] - qsl[b]) if with_qsl else 0
        delta = query_len - int(num_rejected[b])
        if delta != 0:
            w_computed[r] += delta
    assert all(torch.equal(a, b) for a, b in zip(state, want))


@SETTINGS
@given(batches(), st.data())
def test_post_update_num_computed_tokens_matches_the_kernel(batch, data):
    qlens, qsl, idx = batch
    done = ints(data.draw, MAX_REQS, 0, 30)
    want = done.clone()
    launch(KL.post_update_num_computed_tokens, (len(qlens),))(idx, done, qsl)
    for b in range(len(qlens)):  # _post_update_num_computed_tokens_kernel, program b
        r = int(idx[b])
        want[r] = int(want[r]) + int(qsl[b + 1] - qsl[b])
    assert torch.equal(done, want)


# --- block_table ------------------------------------------------------------------------

@SETTINGS
@given(batches(), st.integers(1, 2), st.booleans(), st.data())
def test_gather_block_tables_matches_the_kernel(batch, groups, window, data):
    _qlens, _qsl, idx = batch
    reqs = len(idx)
    rows = data.draw(st.integers(reqs, MAX_REQS))  # the grid's (padded) batch rows
    cols = [data.draw(st.integers(2, 8)) for _ in range(groups)]
    src = [ints(data.draw, MAX_REQS * c, 1, 50).view(MAX_REQS, c) for c in cols]
    dst = [ints(data.draw, MAX_REQS * c, -9, -1).view(MAX_REQS, c) for c in cols]
    want = [d.clone() for d in dst]
    num_blocks = torch.stack([ints(data.draw, MAX_REQS, 0, c) for c in cols])
    first_pos = ints(data.draw, MAX_REQS, 0, 40)
    reach = ints(data.draw, groups, 0, 12)
    block_sizes = ints(data.draw, groups, 1, 4)
    launch(KL.gather_block_tables, (groups, rows))(
        idx, _pointer_table(src), _pointer_table(dst), torch.tensor(cols), num_blocks,
        num_blocks.stride(0), reqs, first_pos, reach, block_sizes,
        MASK_SLIDING_WINDOW=window, BLOCK_SIZE=1024)
    for g in range(groups):  # _gather_block_tables_kernel, program (g, b)
        stride, w_flat, s_flat = cols[g], want[g].view(-1), src[g].view(-1)
        for b in range(rows):
            if b >= reqs:
                w_flat[b * stride:(b + 1) * stride] = 0
                continue
            r = int(idx[b])
            num_null = 0
            if window and int(reach[g]) > 0:
                num_null = max(int(first_pos[r]) - int(reach[g]), 0) // int(block_sizes[g])
            for i in range(int(num_blocks.view(-1)[g * MAX_REQS + r])):
                w_flat[b * stride + i] = s_flat[r * stride + i] if i >= num_null else 0
    assert all(torch.equal(d, w) for d, w in zip(dst, want))


@SETTINGS
@given(batches(), st.integers(1, 2), st.data())
def test_compute_slot_mappings_matches_the_kernel(batch, groups, data):
    qlens, qsl, _idx = batch
    reqs, cols, max_tokens = len(qlens), 8, 48
    idx = _idx_with_dummies(data, reqs)
    block_sizes = ints(data.draw, groups, 1, 4)
    enabled = torch.tensor([data.draw(st.booleans()) for _ in range(groups)])
    tables, pos, slots = slot_mapping_case(data, groups, cols, max_tokens, max_tokens)
    want = slots.clone()
    launch(KL.compute_slot_mappings, (groups, reqs + 1))(
        max_tokens, idx, qsl, pos, _pointer_table(tables), torch.full((groups,), cols),
        block_sizes, enabled, None, slots, slots.stride(0), 0, CP_SIZE=1, CP_INTERLEAVE=1,
        PAD_ID=-1, TRITON_BLOCK_SIZE=1024)
    flat = want.view(-1)
    for g in range(groups):  # _compute_slot_mappings_kernel, program (g, b)
        size, on = int(block_sizes[g]), bool(enabled[g])
        for b in range(reqs + 1):
            if b == reqs:  # the last program: pad from the batch's token count
                for t in range(int(qsl[b]), max_tokens):
                    flat[g * max_tokens + t] = -1
                continue
            r = int(idx[b])
            for t in range(int(qsl[b]), int(qsl[b + 1])):
                p = int(pos[t])
                block = int(tables[g].view(-1)[r * cols + (p // size if on else 0)]) \
                    if r >= 0 else 0
                flat[g * max_tokens + t] = block * size + p % size if on and r >= 0 else -1
    assert torch.equal(slots, want)
