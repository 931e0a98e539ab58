"""The EAGLE kernel stand-ins (``targets/sglang/slices/eagle_kernels.py``) against brute-force
references written from the kernels' contracts: loops over requests and nodes, the way
the Triton/CUDA kernels walk them, on generated inputs."""
import torch
from hypothesis import given, settings, strategies as st

from targets.sglang.slices import eagle_kernels as ek


class QLEN_ONLY:  # the tree-mask mode, by name (upstream's enum member is named so)
    name = "QLEN_ONLY"


@st.composite
def drafts(draw):
    """A draft's parent lists and selected scores as upstream's draft organises them:
    ``parent_list (bs, P)`` of flat draft positions (-1: the root), ``top_scores_index
    (bs, N-1)`` sorted distinct draft indices with ``index // topk < P``."""
    bs = draw(st.integers(1, 3))
    topk = draw(st.integers(1, 3))
    steps = draw(st.integers(1, 4))
    P = 1 + (steps - 1) * topk
    space = P * topk
    N = draw(st.integers(2, min(space, 7) + 1))
    parent, sel = [], []
    for _ in range(bs):
        # block j's parent is a draft of an earlier block (its index below j * topk):
        # parents come before children, as in every draft (a cycle would hang the kernel)
        parent.append([-1] + [draw(st.integers(-1, j * topk - 1)) for j in range(1, P)])
        sel.append(sorted(draw(st.sets(st.integers(0, space - 1), min_size=N - 1,
                                       max_size=N - 1))))
    seq = draw(st.lists(st.integers(0, 40), min_size=bs, max_size=bs))
    return (torch.tensor(parent, dtype=torch.int64), torch.tensor(sel, dtype=torch.int64),
            torch.tensor(seq, dtype=torch.int64), topk, N)


def reference_tree(parent_list, sel, seq_lens, topk, N):
    """The tree kernel's walk: links in reverse node order, the mask row and the depth
    by climbing the parents; an unfound parent leaves the node unlinked."""
    bs = sel.shape[0]
    ri = torch.full((bs, N), -1, dtype=torch.int64)
    nt, ns = ri.clone(), ri.clone()
    mask = torch.zeros(bs * N * N, dtype=torch.bool)
    pos = torch.empty(bs * N, dtype=torch.int64)
    for b in range(bs):
        s, par = sel[b].tolist(), parent_list[b].tolist()

        def parent_pos(i):
            block = s[i - 1] // topk
            if block == 0:
                return 0
            return s.index(par[block]) + 1 if par[block] in s[:N - 1] else None
        for i in range(N - 1, 0, -1):
            ri[b, i] = b * N + i
            pp = parent_pos(i)
            if pp is not None:
                if nt[b, pp] != -1:
                    ns[b, i] = nt[b, pp]
                nt[b, pp] = i
        ri[b, 0] = b * N
        for x in range(N):
            base = N * N * b + N * x
            mask[base] = True
            depth, cur = 0, x
            while cur > 0:
                mask[base + cur] = True
                depth += 1
                pp = parent_pos(cur)
                if pp is None:
                    break
                cur = pp
            pos[b * N + x] = int(seq_lens[b]) + depth
    return mask, pos, ri, nt, ns


def built_tree(d):
    """The stand-in's tree for a draft: ``(mask, positions, retrieve_index, next_token,
    next_sibling)``, into buffers made as upstream's caller makes them."""
    parent_list, sel, seq_lens, topk, N = d
    bs = sel.shape[0]
    mask = torch.zeros(bs * N * N, dtype=torch.bool)
    pos = torch.empty(bs * N, dtype=torch.int64)
    ri, nt, ns = (torch.full((bs, N), -1, dtype=torch.int64) for _ in range(3))
    ek.build_tree_kernel_efficient_func(parent_list, sel, seq_lens, mask, pos, ri, nt, ns,
                                        topk, None, N, QLEN_ONLY)
    return mask, pos, ri, nt, ns


@settings(max_examples=150, deadline=None)
@given(drafts())
def test_tree_build_matches_the_kernels_walk(d):
    for got, exp in zip(built_tree(d), reference_tree(*d)):
        assert torch.equal(got, exp)


def reference_verify(candidates, ri, nt, ns, target_predict, depth):
    """The greedy kernel: from the root, at each level take the first child (in sibling
    order) whose draft is the target's prediction at the current node."""
    bs, N = candidates.shape
    tp = target_predict.reshape(-1)
    predicts = torch.zeros(bs * N, dtype=torch.int32)
    accept = torch.full((bs, depth), -1, dtype=torch.int32)
    num = torch.zeros(bs, dtype=torch.int32)
    for b in range(bs):
        last = int(ri[b, 0])
        accept[b, 0] = last
        cur = 0
        for _ in range(1, depth):
            cur = int(nt[b, cur])
            target = int(tp[last])
            while cur != -1 and int(candidates[b, cur]) != target:
                cur = int(ns[b, cur])
            if cur == -1:
                break
            predicts[last] = target
            num[b] += 1
            accept[b, num[b]] = int(ri[b, cur])
            last = int(ri[b, cur])
        predicts[last] = int(tp[last])
    return predicts, accept, num


@settings(max_examples=150, deadline=None)
@given(drafts(), st.data())
def test_greedy_verify_matches_the_kernels_walk(d, data):
    parent_list, sel, seq_lens, topk, N = d
    bs = sel.shape[0]
    _, pos, ri, nt, ns = built_tree(d)
    V = 4  # a small vocabulary: many matches, and siblings that compete
    candidates = torch.tensor(data.draw(st.lists(st.integers(0, V - 1), min_size=bs * N,
                                                 max_size=bs * N))).view(bs, N)
    target = torch.tensor(data.draw(st.lists(st.integers(0, V - 1), min_size=bs * N,
                                             max_size=bs * N))).view(bs, N)
    # the accept width is the draft's steps + 1: never fewer levels than the tree has
    levels = int((pos.view(bs, N) - seq_lens.view(-1, 1)).max()) + 1
    depth = levels + data.draw(st.integers(0, 1))
    predicts = torch.zeros(bs * N, dtype=torch.int32)
    accept = torch.full((bs, depth), -1, dtype=torch.int32)
    num = torch.empty(bs, dtype=torch.int32)
    ek.verify_tree_greedy_func(predicts, accept, num, candidates, ri, nt, ns, target)
    want = reference_verify(candidates, ri, nt, ns, target, depth)
    assert torch.equal(predicts, want[0])
    assert torch.equal(accept, want[1])
    assert torch.equal(num, want[2])


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 5), st.integers(1, 4), st.integers(1, 3), st.data())
def test_draft_cache_locs_and_bonus_and_gather(bs, topk, cols, data):
    rows = 6
    r2t = torch.tensor(data.draw(st.lists(st.integers(0, 999), min_size=rows * 32,
                                          max_size=rows * 32))).view(rows, 32)
    rpi = torch.tensor(data.draw(st.lists(st.integers(0, rows - 1), min_size=bs,
                                          max_size=bs)))
    seq = torch.tensor(data.draw(st.lists(st.integers(0, 32 - topk * cols), min_size=bs,
                                          max_size=bs)))
    out = torch.empty(bs * topk * cols, dtype=torch.int64)
    positions = torch.empty(bs * topk, dtype=torch.int64)
    ek.assign_draft_cache_locs_contiguous_func(rpi, r2t, seq, out, topk, cols, positions)
    for b in range(bs):
        for k in range(topk * cols):
            assert out[b * topk * cols + k] == r2t[rpi[b], seq[b] + k]
        for t in range(topk):
            assert positions[b * topk + t] == seq[b]
    stride = data.draw(st.integers(1, 4))
    tokens = torch.tensor(data.draw(st.lists(st.integers(0, 99), min_size=bs * stride,
                                             max_size=bs * stride)))
    lens = torch.tensor(data.draw(st.lists(st.integers(1, stride), min_size=bs,
                                           max_size=bs)), dtype=torch.int32)
    bonus = torch.empty(bs, dtype=torch.int32)
    ek.fill_bonus_tokens_func(tokens, lens, bonus, stride, bs)
    assert bonus.tolist() == [int(tokens[b * stride + lens[b] - 1]) for b in range(bs)]
    bufs = [torch.rand(rows, topk), torch.randint(0, 9, (rows, topk)),
            torch.randint(0, 9, (rows,)), torch.rand(rows, 3)]
    for hidden in (bufs[3], None):
        got = ek.gather_spec_extras(rpi, bufs[0], bufs[1], bufs[2], hidden)
        for g, buf in zip(got, bufs[:3] + [hidden]):
            if buf is None:
                assert g is None
                continue
            assert torch.equal(g, torch.stack([buf[int(i)] for i in rpi]))
    empty = ek.gather_spec_extras(rpi[:0], *bufs)
    assert [tuple(t.shape) for t in empty] == [(0, topk), (0, topk), (0,), (0, 3)]


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.data())
def test_the_tree_paths_kv_move_locations(bs, width, data):
    window = torch.tensor(data.draw(st.lists(st.integers(0, 999), min_size=bs * width,
                                             max_size=bs * width)))
    front = torch.tensor(data.draw(st.lists(st.integers(0, width), min_size=bs,
                                            max_size=bs)))
    out = torch.full((bs * width,), -7, dtype=torch.int64)
    ek.fill_front_out_cache_loc_func(front, window, out)
    want = [int(window[i * width + j]) for i in range(bs) for j in range(int(front[i]))]
    assert out.tolist() == want + [-7] * (bs * width - len(want))
    depth = data.draw(st.integers(1, width))
    accept = torch.tensor(data.draw(st.lists(st.integers(-1, bs * width - 1),
                                             min_size=bs * depth, max_size=bs * depth))
                          ).view(bs, depth)
    size = bs * depth
    got = torch.full((size,), -7, dtype=torch.int64)
    ek.fill_accept_out_cache_loc_func(accept, window, got, size)
    picked = [int(window[a]) for a in accept.reshape(-1).tolist() if a != -1]
    assert got.tolist() == picked + [-7] * (size - len(picked))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.data())
def test_the_verify_windows_slots(bs, D, data):
    r2t = torch.tensor(data.draw(st.lists(st.integers(0, 999), min_size=5 * 16,
                                          max_size=5 * 16))).view(5, 16)
    rpi = torch.tensor(data.draw(st.lists(st.integers(0, 4), min_size=bs, max_size=bs)))
    start = torch.tensor(data.draw(st.lists(st.integers(0, 16 - D), min_size=bs,
                                            max_size=bs)))
    out = ek.extend_cache_locs(req_pool_indices=rpi, req_to_token=r2t, start_offset=start,
                               end_offset=start + D, batch_size=bs, draft_token_num=D,
                               device="cpu")
    assert out.tolist() == [int(r2t[rpi[b], start[b] + j]) for b in range(bs)
                            for j in range(D)]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=5), st.booleans(), st.data())
def test_the_extend_positions(lens, has_prefix, data):
    """The kernel's walk: request ``b``'s tokens start at the sum of the lengths before
    it and count on from its prefix length (from 0 without a prefix tensor)."""
    bs = len(lens)
    prefix = data.draw(st.lists(st.integers(0, 30), min_size=bs, max_size=bs))
    prefix_t = torch.tensor(prefix if has_prefix else [], dtype=torch.int32)
    positions, start = ek.compute_position_triton(prefix_t, torch.tensor(lens, dtype=torch.int32),
                                                  sum(lens))
    want, at = [], []
    for b, n in enumerate(lens):
        at.append(len(want))
        want += [(prefix[b] if has_prefix else 0) + i for i in range(n)]
    assert positions.dtype == torch.int64 and start.dtype == torch.int32
    assert positions.tolist() == want and start.tolist() == at


def test_the_extend_positions_are_upstreams_torch_paths(sglang):
    """Where upstream has a torch path for the same kernel (the ``torch_native``
    backend's), the stand-in computes what it does."""
    from sglang.srt.model_executor.forward_batch_info import compute_position_torch
    prefix = torch.tensor([14, 0, 7], dtype=torch.int32)
    lens = torch.tensor([3, 1, 4], dtype=torch.int32)
    got = ek.compute_position_triton(prefix, lens, 8)
    ref = compute_position_torch(prefix, lens)
    assert got[0].tolist() == ref[0].tolist() and got[1].tolist() == ref[1].tolist()


def test_unmodelled_modes_refuse_loudly():
    import pytest
    z = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(NotImplementedError, match="QLEN_ONLY"):
        ek.build_tree_kernel_efficient_func(z, z.view(1, 1), z, z, z, z, z, z, 1, 1, 2,
                                            "FULL_MASK")
    with pytest.raises(NotImplementedError, match="mrope"):
        ek.assign_draft_cache_locs_contiguous_func(z, z.view(1, 1), z, z, 1, 1, None, z)
