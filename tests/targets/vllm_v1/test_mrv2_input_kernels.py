"""The vLLM target's torch stand-ins for Model Runner V2's input-preparation Triton kernels
(``targets/vllm/mrv2/kernels.py``) against loop-by-loop references written from each
kernel's own per-program code (0.17.0 ``vllm/v1/worker/gpu/{buffer_utils,input_batch,
block_table}.py``): one program at a time, flat pointer arithmetic as the kernel does it,
on random batches. The stand-ins need no vLLM: these run in the core environment.
(The sampling, rejection, EAGLE and grammar kernels: ``test_mrv2_spec_kernels.py``.)

Batches are what the runner hands the kernels: distinct request-state indices, query
start locations padded with the last value to ``max_num_reqs + 1``, reads within the
buffers (a prefill chunk within its prompt, positions within the block table).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from targets.vllm.engine.kernels import GridKernel
from targets.vllm.mrv2 import kernels as K

MAX_REQS = 8
SETTINGS = settings(max_examples=50, deadline=None)


def launch(fn, grid):
    return GridKernel("stand-in", fn)[grid]


def ints(draw, n, lo, hi, dtype=torch.int32):
    return torch.tensor([draw(st.integers(lo, hi)) for _ in range(n)], dtype=dtype)


@st.composite
def batches(draw, max_qlen=6):
    """(query lengths, query_start_loc [MAX_REQS + 1], idx_mapping [reqs])."""
    reqs = draw(st.integers(1, 5))
    qlens = [draw(st.integers(1, max_qlen)) for _ in range(reqs)]
    qsl = [0]
    for q in qlens:
        qsl.append(qsl[-1] + q)
    qsl_t = torch.tensor(qsl + [qsl[-1]] * (MAX_REQS - reqs), dtype=torch.int32)
    idx = draw(st.permutations(range(MAX_REQS)))[:reqs]
    return qlens, qsl_t, torch.tensor(idx, dtype=torch.int32)


def prefill_progress(data, qlens, idx, width):
    """Each request state's prompt length (``prefill``, up to ``width``) and tokens
    computed (``done``): the batch's requests either prefilling -- the step's chunk of
    ``qlens[b]`` lying within the prompt -- or past it (decoding)."""
    prefill = ints(data.draw, MAX_REQS, 1, width)
    done = ints(data.draw, MAX_REQS, 0, width)
    for b, r in enumerate(idx.tolist()):
        if data.draw(st.booleans()):  # prefilling: the chunk lies within the prompt
            prefill[r] = data.draw(st.integers(qlens[b], width))
            done[r] = data.draw(st.integers(0, int(prefill[r]) - qlens[b]))
        else:
            done[r] = data.draw(st.integers(int(prefill[r]), width))
    return prefill, done


@st.composite
def logit_layouts(draw, reqs, width=3):
    """cu_num_logits [reqs + 1]: 1 + drafts logits per request, drafts <= width."""
    cu = [0]
    for _ in range(reqs):
        cu.append(cu[-1] + 1 + draw(st.integers(0, width)))
    return torch.tensor(cu, dtype=torch.int32)


# --- buffer_utils: StagedWriteTensor's diffs -----------------------------------------

@SETTINGS
@given(st.data())
def test_apply_write_matches_the_kernel(data):
    cols = 8
    n = data.draw(st.integers(1, 4))
    rows = data.draw(st.permutations(range(MAX_REQS)))[:n]
    starts = [data.draw(st.integers(0, 4)) for _ in rows]
    cu, c = [], 0
    for s in starts:
        c += data.draw(st.integers(1, cols - s))
        cu.append(c)
    contents = ints(data.draw, c, 0, 99)
    out = ints(data.draw, MAX_REQS * cols, -5, 5).view(MAX_REQS, cols)
    expect = out.clone()
    launch(K.apply_write, (n,))(out, out.stride(0), torch.tensor(rows, dtype=torch.int32),
                                torch.tensor(starts, dtype=torch.int32), contents,
                                torch.tensor(cu, dtype=torch.int32), BLOCK_SIZE=1024)
    flat = expect.view(-1)
    for pid in range(n):  # _apply_write_kernel, program pid
        cu_start = cu[pid - 1] if pid > 0 else 0
        for i in range(cu[pid] - cu_start):
            flat[rows[pid] * cols + starts[pid] + i] = contents[cu_start + i]
    assert torch.equal(out, expect)


# --- input_batch ------------------------------------------------------------------------

@SETTINGS
@given(batches(), st.data())
def test_prepare_prefill_inputs_matches_the_kernel(batch, data):
    qlens, qsl, idx = batch
    width = 24
    prefill, done = prefill_progress(data, qlens, idx, width)
    all_ids = ints(data.draw, MAX_REQS * width, 0, 90).view(MAX_REQS, width)
    input_ids = ints(data.draw, 40, -9, -1)
    nxt = ints(data.draw, MAX_REQS, -9, -1)
    want_ids, want_nxt = input_ids.clone(), nxt.clone()
    launch(K.prepare_prefill_inputs, (len(qlens),))(
        input_ids, nxt, idx, qsl, all_ids, all_ids.stride(0), prefill, done)
    flat = all_ids.view(-1)
    for b in range(len(qlens)):  # _prepare_prefill_inputs_kernel, program b
        r = int(idx[b])
        if done[r] >= prefill[r]:
            continue
        start, query_len = int(qsl[b]), int(qsl[b + 1] - qsl[b])
        for i in range(query_len):
            want_ids[start + i] = flat[r * width + int(done[r]) + i]
        if done[r] + query_len < prefill[r]:
            want_nxt[r] = flat[r * width + int(done[r]) + query_len]
    assert torch.equal(input_ids, want_ids) and torch.equal(nxt, want_nxt)


@SETTINGS
@given(batches(), st.data())
def test_prepare_pos_seq_lens_matches_the_kernel(batch, data):
    qlens, qsl, idx = batch
    done = ints(data.draw, MAX_REQS, 0, 30)
    pos = ints(data.draw, 40, -9, -1, torch.int64)
    seq_lens = ints(data.draw, MAX_REQS, -9, -1)
    want_pos, want_lens = pos.clone(), seq_lens.clone()
    reqs = len(qlens)
    launch(K.prepare_pos_seq_lens, (reqs + 1,))(pos, seq_lens, idx, qsl, done, MAX_REQS)
    for b in range(reqs + 1):  # _prepare_pos_seq_lens_kernel, program b
        if b == reqs:
            want_lens[reqs:MAX_REQS] = 0
            continue
        computed = int(done[int(idx[b])])
        start, query_len = int(qsl[b]), int(qsl[b + 1] - qsl[b])
        want_lens[b] = computed + query_len
        for i in range(query_len):
            want_pos[start + i] = computed + i
    assert torch.equal(pos, want_pos) and torch.equal(seq_lens, want_lens)


def combine_case(cu, data, width):
    """A batch for ``_combine_sampled_and_draft_tokens_kernel``: each request's query
    ends with its 1 + drafts logits slots. (idx, qsl, qsl tensor, seq_lens, prefill lens,
    last sampled, drafts, input ids, logits indices)"""
    reqs = len(cu) - 1
    idx = torch.tensor(data.draw(st.permutations(range(MAX_REQS)))[:reqs], dtype=torch.int32)
    qsl = [0]
    for b in range(reqs):
        qsl.append(qsl[-1] + int(cu[b + 1] - cu[b]) + data.draw(st.integers(0, 3)))
    return (idx, qsl, torch.tensor(qsl, dtype=torch.int32), ints(data.draw, reqs, 1, 20),
            ints(data.draw, MAX_REQS, 1, 20),
            ints(data.draw, MAX_REQS, 0, 90, torch.int64).view(MAX_REQS, 1),
            ints(data.draw, MAX_REQS * width, 0, 90, torch.int64).view(MAX_REQS, width),
            ints(data.draw, 40, -9, -1), torch.full((int(cu[-1]),), -1, dtype=torch.int64))


@SETTINGS
@given(st.integers(1, 5).flatmap(lambda reqs: st.tuples(logit_layouts(reqs), st.data())))
def test_combine_sampled_and_draft_tokens_matches_the_kernel(case):
    cu, data = case
    reqs, width = len(cu) - 1, 3
    (idx, qsl, qsl_t, seq_lens, prefill, last, drafts, input_ids,
     logits_indices) = combine_case(cu, data, width)
    want_ids, want_li = input_ids.clone(), logits_indices.clone()
    launch(K.combine_sampled_and_draft_tokens, (reqs,))(
        input_ids, idx, last, qsl_t, seq_lens, prefill, drafts, drafts.stride(0), cu,
        logits_indices, BLOCK_SIZE=4)
    for b in range(reqs):  # _combine_sampled_and_draft_tokens_kernel, program b
        r = int(idx[b])
        num_logits = int(cu[b + 1] - cu[b])
        query_end = qsl[b + 1]
        for i in range(num_logits):
            want_li[int(cu[b]) + i] = query_end - num_logits + i
        if seq_lens[b] <= prefill[r]:
            continue
        want_ids[query_end - num_logits] = last.view(-1)[r]
        for i in range(num_logits - 1):
            want_ids[query_end - (num_logits - 1) + i] = drafts.view(-1)[r * width + i]
    assert torch.equal(input_ids, want_ids) and torch.equal(logits_indices, want_li)


@SETTINGS
@given(st.integers(1, 5).flatmap(lambda reqs: st.tuples(logit_layouts(reqs), st.data())))
def test_get_num_sampled_and_rejected_matches_the_kernel(case):
    cu, data = case
    reqs = len(cu) - 1
    idx = torch.tensor(data.draw(st.permutations(range(MAX_REQS)))[:reqs], dtype=torch.int32)
    seq_lens = ints(data.draw, reqs, 1, 20)
    prefill = ints(data.draw, MAX_REQS, 1, 20)
    sampled = torch.tensor([data.draw(st.integers(1, int(cu[b + 1] - cu[b])))
                            for b in range(reqs)], dtype=torch.int32)
    rejected = ints(data.draw, reqs, -9, -1)
    want_s, want_r = sampled.clone(), rejected.clone()
    launch(K.get_num_sampled_and_rejected, (reqs,))(sampled, rejected, seq_lens, cu, idx,
                                                   prefill)
    for b in range(reqs):  # _get_num_sampled_and_rejected_kernel, program b
        chunked = bool(seq_lens[b] < prefill[int(idx[b])])
        n = 0 if chunked else int(want_s[b])
        want_s[b] = n
        want_r[b] = 0 if chunked else int(cu[b + 1] - cu[b]) - n
    assert torch.equal(sampled, want_s) and torch.equal(rejected, want_r)


@SETTINGS
@given(batches(), st.data())
def test_post_update_matches_the_kernel(batch, data):
    qlens, qsl, idx = batch
    reqs, width, vocab, model_len = len(qlens), 4, 16, 40
    sampled = ints(data.draw, reqs * width, 0, vocab - 1, torch.int64).view(reqs, width)
    num_sampled = ints(data.draw, reqs, 0, width)
    num_rejected = torch.tensor([data.draw(st.integers(0, q)) for q in qlens],
                                dtype=torch.int32)
    state = [ints(data.draw, MAX_REQS, 0, 10),                                 # computed
             ints(data.draw, MAX_REQS, 0, vocab, torch.int64).view(MAX_REQS, 1),  # last
             ints(data.draw, MAX_REQS * vocab, 0, 2).view(MAX_REQS, vocab),       # bins
             ints(data.draw, MAX_REQS * model_len, 0, vocab).view(MAX_REQS, model_len),
             ints(data.draw, MAX_REQS, 0, model_len - width)]                    # total
    want = [t.clone() for t in state]
    computed, last, bins, all_ids, total = state
    launch(K.post_update, (reqs,))(idx, computed, last, bins, bins.stride(0), sampled,
                                   sampled.stride(0), num_sampled, num_rejected, qsl,
                                   all_ids, all_ids.stride(0), total)
    w_computed, w_last, w_bins, w_ids, w_total = (t.view(-1) for t in want)
    for b in range(reqs):  # _post_update_kernel, program b
        r = int(idx[b])
        total_len, n = int(w_total[r]), int(num_sampled[b])
        if n > 0:
            w_last[r] = sampled.view(-1)[b * width + n - 1]
            w_total[r] = total_len + n
        for i in range(n):
            token = int(sampled.view(-1)[b * width + i])
            w_bins[r * vocab + token] += 1
            w_ids[r * model_len + total_len + i] = token
        w_computed[r] += int(qsl[b + 1] - qsl[b]) - int(num_rejected[b])
    assert all(torch.equal(a, b) for a, b in zip(state, want))


@SETTINGS
@given(st.integers(1, 5).flatmap(lambda reqs: st.tuples(logit_layouts(reqs), st.data())))
def test_expand_idx_mapping_matches_the_kernel(case):
    cu, data = case
    reqs, total = len(cu) - 1, int(cu[-1])
    idx = torch.tensor(data.draw(st.permutations(range(MAX_REQS)))[:reqs], dtype=torch.int32)
    expanded = torch.full((total,), -1, dtype=torch.int32)
    local = torch.full((total,), -1, dtype=torch.int32)
    launch(K.expand_idx_mapping, (reqs,))(idx, expanded, local, cu, BLOCK_SIZE=4)
    want_e, want_l = torch.full_like(expanded, -1), torch.full_like(local, -1)
    for b in range(reqs):  # _expand_idx_mapping_kernel, program b
        for i in range(int(cu[b + 1] - cu[b])):
            want_e[int(cu[b]) + i] = idx[b]
            want_l[int(cu[b]) + i] = i
    assert torch.equal(expanded, want_e) and torch.equal(local, want_l)


# --- block_table ------------------------------------------------------------------------

def _pointer_table(tensors):
    """A uint64 table the stand-ins resolve by identity (its addresses are never read)."""
    ptrs = torch.zeros(len(tensors), dtype=torch.uint64)
    K.register_pointer_table(ptrs, tensors)
    return ptrs


@SETTINGS
@given(batches(), st.integers(1, 2), st.data())
def test_gather_block_tables_matches_the_kernel(batch, groups, data):
    _qlens, _qsl, idx = batch
    reqs, cols = len(idx), 8
    src = [ints(data.draw, MAX_REQS * cols, 0, 50).view(MAX_REQS, cols)
           for _ in range(groups)]
    dst = [ints(data.draw, MAX_REQS * cols, -9, -1).view(MAX_REQS, cols)
           for _ in range(groups)]
    want = [d.clone() for d in dst]
    num_blocks = ints(data.draw, groups * MAX_REQS, 0, cols).view(groups, MAX_REQS)
    launch(K.gather_block_tables, (groups, reqs))(
        idx, _pointer_table(src), _pointer_table(dst), None, num_blocks,
        num_blocks.stride(0), BLOCK_SIZE=1024)
    for g in range(groups):  # _gather_block_tables_kernel, program (g, b)
        for b in range(reqs):
            r = int(idx[b])
            for i in range(int(num_blocks.view(-1)[g * MAX_REQS + r])):
                want[g].view(-1)[b * cols + i] = src[g].view(-1)[r * cols + i]
    assert all(torch.equal(d, w) for d, w in zip(dst, want))


def slot_mapping_case(data, groups, cols, tokens, max_tokens):
    """A slot-mapping kernel's inputs and output: per KV-cache group a block table
    (``MAX_REQS`` rows of ``cols`` blocks), ``tokens`` positions within every table, and
    the slot rows of ``max_tokens`` (-9..-2: not written yet)."""
    tables = [ints(data.draw, MAX_REQS * cols, 0, 50).view(MAX_REQS, cols)
              for _ in range(groups)]
    pos = ints(data.draw, tokens, 0, cols - 1, torch.int64)
    slots = ints(data.draw, groups * max_tokens, -9, -2, torch.int64).view(groups, max_tokens)
    return tables, pos, slots


@SETTINGS
@given(batches(), st.integers(1, 2), st.data())
def test_compute_slot_mappings_matches_the_kernel(batch, groups, data):
    qlens, qsl, idx = batch
    reqs, cols, max_tokens = len(qlens), 8, 48
    num_tokens = int(qsl[reqs]) + data.draw(st.integers(0, 3))  # padded tokens after
    block_sizes = ints(data.draw, groups, 1, 4)
    tables, pos, slots = slot_mapping_case(data, groups, cols, num_tokens, max_tokens)
    want = slots.clone()
    launch(K.compute_slot_mappings, (groups, reqs + 1))(
        num_tokens, max_tokens, idx, qsl, pos, _pointer_table(tables), None, block_sizes,
        slots, slots.stride(0), 0, CP_SIZE=1, CP_INTERLEAVE=1, PAD_ID=-1,
        TRITON_BLOCK_SIZE=1024)
    for g in range(groups):  # _compute_slot_mappings_kernel, program (g, b)
        size = int(block_sizes[g])
        for b in range(reqs + 1):
            if b == reqs:
                want[g, num_tokens:max_tokens] = -1
                continue
            r = int(idx[b])
            for t in range(int(qsl[b]), int(qsl[b + 1])):
                p = int(pos[t])
                block = int(tables[g].view(-1)[r * cols + p // size])
                want[g, t] = block * size + p % size
    assert torch.equal(slots, want)


def test_compute_slot_mappings_has_one_context_parallel_rank():
    with pytest.raises(NotImplementedError):
        launch(K.compute_slot_mappings, (1, 2))(
            1, 4, torch.zeros(1, dtype=torch.int32), torch.tensor([0, 1]),
            torch.zeros(1, dtype=torch.int64), _pointer_table([torch.zeros(1, 1)]), None,
            torch.ones(1, dtype=torch.int32), torch.zeros(1, 4, dtype=torch.int64), 4, 0,
            CP_SIZE=2)


def test_a_pointer_table_no_runner_registered_is_refused():
    with pytest.raises(LookupError):
        launch(K.gather_block_tables, (1, 1))(
            torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.uint64),
            torch.zeros(1, dtype=torch.uint64), None, torch.zeros(1, 1, dtype=torch.int32),
            1)
