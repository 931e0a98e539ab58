"""The fused EAGLE stand-ins (``targets/sglang/slices/eagle_fused.py``) against
brute-force references that walk each Triton kernel's program the way it does: one
element (``offset``) or row at a time, each load and store as the kernel masks it
(sglang 0.5.23, ``sglang/kernels/ops/speculative/eagle.py``); on generated inputs. And
the one rule they exist for: on the simulator upstream takes its GPU paths -- a trace
shows records from inside ``record_stream_each`` and the fused ops' launches."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from targets.sglang.slices import eagle_fused as ef


@st.composite
def chains(draw):
    bs = draw(st.integers(1, 4))
    depth = draw(st.integers(1, 4))
    width = depth + 1
    seq = draw(st.lists(st.integers(0, 20), min_size=bs, max_size=bs))
    bonus = draw(st.lists(st.integers(0, 90), min_size=bs, max_size=bs))
    draft = draw(st.lists(st.lists(st.integers(0, 90), min_size=depth, max_size=depth),
                          min_size=bs, max_size=bs))
    pool = draw(st.lists(st.integers(0, bs + 2), min_size=bs, max_size=bs, unique=True))
    cols = max(seq) + width + 1
    table = torch.arange((bs + 3) * cols, dtype=torch.int32).view(bs + 3, cols) * 7 % 1000
    return (torch.tensor(bonus, dtype=torch.int32), torch.tensor(draft, dtype=torch.int64),
            torch.tensor(seq, dtype=torch.int64), torch.tensor(pool, dtype=torch.int64),
            table, draw(st.booleans()), draw(st.booleans()))


def reference_chain(bonus, draft, seq, pool, table, cache, mrope):
    """``_build_chain_tree_kernel``: one program element per ``offset`` of bs*width
    (tokens, positions, cache locations, mrope, retrieve), and the mask over
    bs*width*width."""
    bs, depth = draft.shape
    width = depth + 1
    tokens = torch.zeros(bs * width, dtype=torch.int64)
    positions = torch.zeros(bs * width, dtype=torch.int64)
    retrieve = torch.zeros(3 * bs * width, dtype=torch.int64)
    out = torch.zeros(bs * width, dtype=torch.int64)
    mr = torch.zeros(3 * bs * width, dtype=torch.int64)
    for offset in range(bs * width):
        row, col = offset // width, offset % width
        tokens[offset] = bonus[row] if col == 0 else draft[row, col - 1]
        length = int(seq[row])
        positions[offset] = length + col
        if cache:
            out[offset] = table[int(pool[row]), length + col]
        if mrope:
            for axis in range(3):
                mr[axis * bs * width + offset] = length + col
        retrieve[offset] = offset
        retrieve[bs * width + offset] = col + 1 if col + 1 < width else -1
        retrieve[2 * bs * width + offset] = -1
    mask = torch.zeros(bs * width * width, dtype=torch.bool)
    for offset in range(bs * width * width):
        mask[offset] = offset % width <= (offset // width) % width
    return mask, positions, retrieve.view(3, bs, width), tokens, out, mr.view(3, -1)


@settings(max_examples=120, deadline=None)
@given(chains())
def test_the_chain_tree_matches_the_kernels_program(c):
    bonus, draft, seq, pool, table, cache, mrope = c
    mask, pos, r0, r1, r2, tokens, out, mr = ef.build_chain_tree(
        bonus, draft, seq, None, req_pool_indices=pool if cache else None,
        req_to_token=table if cache else None, with_mrope=mrope)
    e_mask, e_pos, e_ret, e_tokens, e_out, e_mr = reference_chain(*c)
    assert torch.equal(mask, e_mask) and torch.equal(pos, e_pos)
    assert torch.equal(torch.stack([r0, r1, r2]), e_ret)
    assert torch.equal(tokens.to(torch.int64), e_tokens)
    assert (out is None) != cache and (mr is None) != mrope
    if cache:
        assert torch.equal(out, e_out)
    if mrope:
        assert torch.equal(mr, e_mr)


def test_the_chain_tree_writes_only_its_part_of_a_larger_mask_buffer():
    buf = torch.ones(64, dtype=torch.bool)
    ef.build_chain_tree(torch.tensor([1, 2]), torch.tensor([[3], [4]]), torch.tensor([5, 6]),
                        buf)
    assert buf[:8].tolist() == [True, False, True, True] * 2 and buf[8:].all()


@st.composite
def commits(draw):
    bs = draw(st.integers(1, 4))
    width = draw(st.integers(1, 4))  # the draft width (0: the plain form)
    draft_width = draw(st.sampled_from([0, width]))
    predict = torch.tensor(draw(st.lists(st.integers(0, 90), min_size=bs * width,
                                         max_size=bs * width)), dtype=torch.int64)
    accepted = draw(st.lists(st.integers(1, width), min_size=bs, max_size=bs))
    # accept_index: the flat predict indices of each row's accepted path (-1 past it);
    # a negative index counts from the end, as the kernel wraps it
    index = torch.full((bs, width), -1, dtype=torch.int64)
    for r, n in enumerate(accepted):
        index[r, :n] = torch.tensor([r * width + k for k in range(n)])
        if draw(st.booleans()):
            index[r, n - 1] -= bs * width  # the same node, wrapped
    seq = draw(st.lists(st.integers(0, 30), min_size=bs, max_size=bs))
    interval = draw(st.sampled_from([0, 3, 4])) if draft_width else 0
    return (predict, index, torch.tensor(accepted, dtype=torch.int32),
            torch.tensor(seq, dtype=torch.int64), draft_width, interval)


def reference_commit(predict, index, accept_lens, seq, draft_width, interval):
    """``_verify_commit_outputs_kernel``, one row at a time (``ids`` over every predict
    element, as the grid covers max(bs, predict size))."""
    bs, size = accept_lens.numel(), predict.numel()
    new, bonus = [], []
    last, track, correct, select = [], [], [], []
    for row in range(bs):
        accepted, length = int(accept_lens[row]), int(seq[row])
        idx = int(index[row, accepted - 1])
        if draft_width:
            last.append(idx - row * draft_width)
            correct.append(accepted - 1)
            select.append(row * draft_width + accepted - 1)
            if interval:
                post = length + accepted
                crossing = length // interval != post // interval
                at = max(post // interval * interval - length - 1, 0)
                track.append(int(index[row, at]) - row * draft_width if crossing else -1)
        if idx < 0:
            idx += size
        new.append(length + accepted)
        bonus.append(int(predict[idx]))
    return new, bonus, last, track, correct, select, predict.tolist()


@settings(max_examples=150, deadline=None)
@given(commits())
def test_the_commit_outputs_match_the_kernels_program(c):
    predict, index, accept_lens, seq, draft_width, interval = c
    got = ef.prepare_verify_commit_outputs(predict, index, accept_lens, seq, draft_width,
                                           interval)
    new, bonus, last, track, correct, select, ids = reference_commit(*c)
    assert got[0].tolist() == new and got[1].tolist() == bonus
    assert got[0].dtype == torch.int64 and got[1].dtype == torch.int32
    if not draft_width:
        assert len(got) == 2
        return
    (g_last, g_track), (g_correct, g_select, g_ids) = got[2], got[3]
    assert g_last.tolist() == last and g_correct.tolist() == correct
    assert g_select.tolist() == select and g_ids.tolist() == ids
    assert (g_track is None) == (not interval)
    if interval:
        assert g_track.tolist() == track


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=5), st.integers(1, 4),
       st.lists(st.integers(0, 50), min_size=1, max_size=12))
def test_the_draft_extend_inputs_match_the_kernels_program(accepted, width, predict):
    a = torch.tensor(accepted, dtype=torch.int32)
    p = torch.tensor(predict, dtype=torch.int32)
    correct, select, ids = ef.prepare_draft_extend_inputs(a, p, width)
    assert correct.tolist() == [n - 1 for n in accepted] and correct.dtype == torch.int32
    assert select.tolist() == [r * width + n - 1 for r, n in enumerate(accepted)]
    assert ids.tolist() == predict and ids.dtype == torch.int64


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=5), st.integers(1, 4),
       st.integers(0, 3), st.booleans())
def test_the_draft_extend_lengths_and_layout_match_the_kernels_program(seq, width, front,
                                                                         mrope):
    s = torch.tensor(seq, dtype=torch.int64)
    prefix, extend, post = ef.prepare_draft_extend_lengths(s, width, front)
    assert prefix.tolist() == [max(n - front, 0) for n in seq]
    assert extend.tolist() == [width + front] * len(seq) and prefix.dtype == torch.int32
    assert post.tolist() == [n + width for n in seq] and post.dtype == s.dtype
    prefix, extend, post, (positions, starts, mr) = ef.prepare_draft_extend_layout(
        s, width, mrope)
    expect = [n + col for n in seq for col in range(width)]  # the kernel's front is 0
    assert prefix.tolist() == seq and extend.tolist() == [width] * len(seq)
    assert positions.tolist() == expect
    assert starts.tolist() == [r * width for r in range(len(seq))]
    assert (mr is None) != mrope
    if mrope:
        assert mr.tolist() == [expect] * 3


def test_a_predict_that_is_not_one_dimensional_is_refused():
    with pytest.raises(NotImplementedError, match="one-dimensional"):
        ef.prepare_verify_commit_outputs(torch.zeros(2, 2, dtype=torch.int64),
                                         torch.zeros(2, 2, dtype=torch.int64),
                                         torch.ones(2, dtype=torch.int32),
                                         torch.zeros(2, dtype=torch.int64))


# --- the one rule: upstream's GPU paths run on the simulator ----------------------------

def test_on_the_simulator_upstream_takes_its_gpu_paths():
    """Simulated tensors answer ``is_cuda`` as a GPU's: an EAGLE v2 plan-stream run's trace
    has record_stream records from inside upstream's ``record_stream_each`` (via
    ``record_stream_for_v2_verify``) and from ``async_d2h``, and the fused kernels of the
    GPU path launched (their stand-ins) -- paths the simulator never ran before."""
    import targets
    from harness.policies import parse_policy
    from harness.runtime import open_runtime
    from harness.runtime.trace import OpRecord, RecordStreamRecord
    from harness.trials.drive import drive, server_args
    from scenarios.registry import get
    from seams.faults.plan import FaultPlan
    target = targets.get("sglang")
    sc = get("eagle-v2")
    variant = sc.variants["plan-stream"]
    wl = sc.workload(0)
    with open_runtime("sim", parse_policy("lazy")) as rt:
        drive(rt, wl, server_args(wl, variant.args, target), FaultPlan(), target)
    marked = {r.frame[2] for r in rt.trace.log
              if isinstance(r, RecordStreamRecord) and r.frame}
    assert {"record_stream_each", "async_d2h"} <= marked, marked
    launched = {r.name.split(".")[0] for r in rt.trace.log if isinstance(r, OpRecord)}
    assert {"eagle_build_chain_tree", "eagle_verify_commit_outputs"} <= launched
