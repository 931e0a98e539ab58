"""The Triton-kernel-object stand-ins (``targets/sglang/slices/eagle_launch.py``) against
brute-force walks of the kernels they replace (one program per row, as the Triton
programs of ``cache_locs.py`` walk them), each a single launch of the declared op the
launcher-function stand-in launches; and the seam choice (``boundary/eagle_seams``)
following what a release's source binds, never its version."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from targets.sglang.slices import eagle_kernels as ek
from targets.sglang.slices import eagle_launch as el


class _Ops(TorchDispatchMode):
    """The ops a call dispatches, by name."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def reference_draft_locs(rpi, r2t, seq, out, pool_len, topk, steps, positions, write_pos):
    """``assign_draft_cache_locs_contiguous``: program ``pid`` copies ``topk * steps``
    slots of its row from ``seq[pid]`` on; with WRITE_POSITIONS, ``topk`` positions."""
    flat = r2t.reshape(-1)
    for pid in range(rpi.numel()):
        for k in range(topk * steps):
            out[pid * topk * steps + k] = flat[int(rpi[pid]) * pool_len + int(seq[pid]) + k]
        if write_pos:
            for t in range(topk):
                positions[pid * topk + t] = seq[pid]


def reference_extend_locs(rpi, r2t, start, end, out, pool_len):
    """``assign_extend_cache_locs``: program ``pid`` copies its row's ``[start, end)``
    to the offset the rows before it fill."""
    flat = r2t.reshape(-1)
    for pid in range(rpi.numel()):
        offset = sum(int(end[i]) - int(start[i]) for i in range(pid))
        for j in range(int(end[pid]) - int(start[pid])):
            out[offset + j] = flat[int(rpi[pid]) * pool_len + int(start[pid]) + j]


def _table(data, rows, width):
    return torch.tensor(data.draw(st.lists(st.integers(0, 999), min_size=rows * width,
                                           max_size=rows * width))).view(rows, width)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 5), st.integers(1, 3), st.integers(1, 4), st.booleans(), st.data())
def test_draft_locs_kernel_object_matches_the_kernels_walk(bs, topk, steps, write_pos, data):
    rows, width = 6, 32
    r2t = _table(data, rows, width)
    rpi = torch.tensor(data.draw(st.lists(st.integers(0, rows - 1), min_size=bs,
                                          max_size=bs)))
    seq = torch.tensor(data.draw(st.lists(st.integers(0, width - topk * steps),
                                          min_size=bs, max_size=bs)))
    out, want = (torch.full((bs * topk * steps,), -7, dtype=torch.int64) for _ in "ab")
    pos, want_pos = (torch.full((bs * topk,), -7, dtype=torch.int64) for _ in "ab")
    with _Ops() as ops:
        el.assign_draft_cache_locs_contiguous[(bs,)](
            rpi, r2t, seq, out, width, topk, steps, positions=pos if write_pos else None,
            mrope=None, BS=bs, WRITE_POSITIONS=write_pos, WRITE_MROPE=False)
    reference_draft_locs(rpi, r2t, seq, want, width, topk, steps, want_pos, write_pos)
    assert torch.equal(out, want) and torch.equal(pos, want_pos)
    # one launch of the op the launcher function launches: one read/write set
    assert ops.names == ["specrace.assign_draft_cache_locs.default"]
    func_out = torch.full_like(out, -7)
    ek.assign_draft_cache_locs_contiguous_func(rpi, r2t, seq, func_out, topk, steps)
    assert torch.equal(func_out, want)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 5), st.data())
def test_extend_locs_kernel_object_matches_the_kernels_walk(bs, data):
    rows, width = 5, 16
    r2t = _table(data, rows, width)
    rpi = torch.tensor(data.draw(st.lists(st.integers(0, rows - 1), min_size=bs,
                                          max_size=bs)))
    start = torch.tensor(data.draw(st.lists(st.integers(0, width - 4), min_size=bs,
                                            max_size=bs)))
    # rows of different lengths (the accepted paths'), an empty one allowed
    end = start + torch.tensor(data.draw(st.lists(st.integers(0, 4), min_size=bs,
                                                  max_size=bs)))
    size = bs * 4 + data.draw(st.integers(0, 3))  # the caller's buffer may be larger
    out, want = (torch.full((size,), -7, dtype=torch.int64) for _ in "ab")
    bs_upper = 1 << (bs - 1).bit_length()  # next_power_of_2(bs), as the caller passes
    with _Ops() as ops:
        el.assign_extend_cache_locs[(bs,)](rpi, r2t, start, end, out, width, bs_upper)
    reference_extend_locs(rpi, r2t, start, end, want, width)
    assert torch.equal(out, want)
    assert ops.names == ["specrace.extend_cache_locs.default"]


def reference_bonus(accept_tokens, accept_lens, bonus, stride):
    """``eagle.fill_bonus_tokens``: program ``pid`` writes the token at its row's last
    accepted slot."""
    flat = accept_tokens.reshape(-1)
    for pid in range(bonus.numel()):
        bonus[pid] = flat[stride * pid + int(accept_lens[pid]) - 1]


def reference_accept_locs(accept_index, out_cache_loc, accept_out, size):
    """``eagle.fill_accept_out_cache_loc``: program ``pid`` moves ``accept_index[pid]``'s
    slot to the count of accepted (not -1) entries before it."""
    flat = accept_index.reshape(-1)
    for pid in range(size):
        dst = sum(int(flat[i]) != -1 for i in range(pid))
        if int(flat[pid]) > -1:
            accept_out[dst] = out_cache_loc[int(flat[pid])]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(1, 4), st.data())
def test_the_bonus_and_accept_kernel_objects_match_the_kernels_walk(bs, width, data):
    """0.5.15 launches these two kernels itself (later releases through
    ``fill_bonus_tokens_func`` / ``fill_accept_out_cache_loc_func``, which launch the same
    kernels): one launch of the same declared op, the same result."""
    tokens = torch.tensor(data.draw(st.lists(st.integers(0, 99), min_size=bs * width,
                                             max_size=bs * width))).view(bs, width)
    lens = torch.tensor(data.draw(st.lists(st.integers(1, width), min_size=bs,
                                           max_size=bs)), dtype=torch.int32)
    bonus, want = (torch.full((bs,), -7, dtype=torch.int32) for _ in "ab")
    with _Ops() as ops:
        el.fill_bonus_tokens[(bs,)](tokens, lens, bonus, width)
    reference_bonus(tokens, lens, want, width)
    assert torch.equal(bonus, want)
    assert ops.names == ["specrace.fill_bonus_tokens.default"]
    # an accepted tree path per row: its node indices, -1 past the accepted length
    index = torch.tensor([[r * width + k if k < int(lens[r]) else -1 for k in range(width)]
                          for r in range(bs)])
    slots = torch.tensor(data.draw(st.lists(st.integers(0, 999), min_size=bs * width,
                                            max_size=bs * width)))
    size = bs * width
    got, want = (torch.full((size,), -7, dtype=torch.int64) for _ in "ab")
    with _Ops() as ops:
        el.fill_accept_out_cache_loc[(size,)](index, slots, got, 1 << (size - 1).bit_length())
    reference_accept_locs(index, slots, want, size)
    assert torch.equal(got, want)
    assert ops.names == ["specrace.fill_accept_out_cache_loc.default"]


def test_what_a_kernel_object_launch_cannot_model_raises():
    z = torch.zeros(2, dtype=torch.int64)
    r2t = torch.zeros((2, 8), dtype=torch.int64)
    launch = el.assign_draft_cache_locs_contiguous
    with pytest.raises(NotImplementedError, match="mrope"):
        launch[(2,)](z, r2t, z, torch.zeros(2, dtype=torch.int64), 8, 1, 1, positions=z,
                     mrope=torch.zeros((3, 2), dtype=torch.int64), BS=2,
                     WRITE_POSITIONS=True, WRITE_MROPE=True)
    with pytest.raises(NotImplementedError, match="grid of 1 programs over 2 rows"):
        launch[(1,)](z, r2t, z, torch.zeros(2, dtype=torch.int64), 8, 1, 1)
    with pytest.raises(NotImplementedError, match="row stride of 4"):
        launch[(2,)](z, r2t, z, torch.zeros(2, dtype=torch.int64), 4, 1, 1)
    with pytest.raises(NotImplementedError, match="grid"):
        launch[lambda meta: (2,)]
    with pytest.raises(NotImplementedError, match="bs_upper 1 < 2"):
        el.assign_extend_cache_locs[(2,)](z, r2t, z, z + 1, torch.zeros(4, dtype=torch.int64),
                                          8, 1)
    with pytest.raises(NotImplementedError, match="grid of 1 programs over 2 rows"):
        el.fill_bonus_tokens[(1,)](z, z, torch.zeros(2, dtype=torch.int32), 1)
    with pytest.raises(NotImplementedError, match="size_upper 2 < 3"):
        el.fill_accept_out_cache_loc[(3,)](z, z, z, 2)


def test_a_kernel_object_stands_in_only_for_the_kernel_it_models(sglang):
    """The release's own Triton kernels (the installed ``cache_locs``; on a machine
    without triton its ``@triton.jit`` leaves the function) take exactly the modelled
    parameters; one that takes others is refused, never launched with shifted meaning."""
    from sglang.kernels.ops.speculative import cache_locs
    from sglang.kernels.ops.speculative import eagle
    el.assign_draft_cache_locs_contiguous.replaces(cache_locs.assign_draft_cache_locs_contiguous)
    el.assign_extend_cache_locs.replaces(cache_locs.assign_extend_cache_locs)
    # the kernels 0.5.15 launches itself, which the installed launcher functions launch
    el.fill_bonus_tokens.replaces(eagle.fill_bonus_tokens)
    el.fill_accept_out_cache_loc.replaces(eagle.fill_accept_out_cache_loc)

    def older(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk,
              speculative_num_steps):  # 0.5.19-0.5.21's: no positions to write
        pass
    el.assign_draft_cache_locs_contiguous.replaces(older)

    def other(req_pool_indices, req_to_token, seq_lens, out_cache_loc, topk, pool_len,
              speculative_num_steps):
        pass

    def fewer(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk):
        pass
    for kernel in (other, fewer):
        with pytest.raises(TypeError, match="models a kernel taking"):
            el.assign_draft_cache_locs_contiguous.replaces(kernel)


# --- the seam choice ------------------------------------------------------------------

_EWC = "srt/speculative/eagle_worker_common.py"
_EU = "srt/speculative/eagle_utils.py"
_SU = "srt/speculative/spec_utils.py"
_OU = "srt/managers/overlap_utils.py"
_CL = "kernels/ops/speculative/cache_locs.py"
_FBI = "srt/model_executor/forward_batch_info.py"
_K = "sglang.kernels.ops.speculative"


def _release(tmp_path, files):
    root = tmp_path / "sglang"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


# 0.5.19/0.5.20's form: the Triton kernel objects, the tree-build wrapper's platform
# kernel behind its gate, no platform seam for the verify window's slots
OLDER = {
    _CL: "def assign_extend_cache_locs_func(*, req_pool_indices, req_to_token, "
         "start_offset, end_offset, batch_size, draft_token_num, device):\n    pass\n",
    _OU: f"from {_K}.gather_spec_extras import gather_spec_extras\n",
    _EWC: (f"from {_K}.cache_locs import (\n    assign_draft_cache_locs_contiguous,\n)\n"
           f"from {_K}.eagle import fill_bonus_tokens_func\n"),
    _EU: ("_is_cuda = True\n"
          f"if _is_cuda:\n    from {_K}.tree import (\n"
          "        build_tree_kernel_efficient as sgl_build_tree_kernel_efficient,\n    )\n"
          "def verify_tree_greedy_func(*a):\n    pass\n"),
    _SU: (f"from {_K}.cache_locs import assign_extend_cache_locs as assign_extend_cache_locs\n"
          f"from {_K}.cache_locs import fill_accept_out_cache_loc_func\n"),
    _FBI: "from sglang.kernels.ops.attention.position import compute_position_triton\n",
}


def test_the_seams_bound_are_the_ones_the_releases_source_binds(tmp_path):
    from targets.sglang.boundary import eagle_seams
    root = _release(tmp_path, OLDER)
    assert eagle_seams.missing(root) is None
    got = {s.split(":")[1] for s in eagle_seams.seams_in(root)}
    assert got == {"gather_spec_extras", "assign_draft_cache_locs_contiguous",
                   "fill_bonus_tokens_func", "sgl_build_tree_kernel_efficient",
                   "verify_tree_greedy_func", "assign_extend_cache_locs",
                   "fill_accept_out_cache_loc_func", "assign_extend_cache_locs_func",
                   "compute_position_triton"}
    # where the platform answers the verify window's slots (0.5.21 on), nothing is bound
    # for them: the first way is the platform's
    files = dict(OLDER)
    files[_CL] = OLDER[_CL] + "def _get_oot_speculative_cache_locs_fn():\n    pass\n"
    later = _release(tmp_path / "later", files)
    assert eagle_seams.missing(later) is None
    assert set(eagle_seams.seams_in(later)) == set(eagle_seams.seams_in(root)) - {
        "sglang.kernels.ops.speculative.cache_locs:assign_extend_cache_locs_func"}
    # every seam has its stand-in, with the kernel's (or the launcher's) own call shape
    assert isinstance(el.stand_in("assign_draft_cache_locs_contiguous"), el.TritonKernel)
    assert isinstance(el.stand_in("assign_extend_cache_locs"), el.TritonKernel)
    assert el.stand_in("verify_tree_greedy_func") is ek.verify_tree_greedy_func
    assert el.stand_in("assign_extend_cache_locs_func") is ek.extend_cache_locs


def test_a_release_with_neither_way_is_not_driven_and_the_first_way_is_named(tmp_path):
    from targets.sglang.boundary import contract, eagle_seams
    files = dict(OLDER)
    files[_EWC] = f"from {_K}.eagle import fill_bonus_tokens_func\n"  # no draft-locs launch
    root = _release(tmp_path, files)
    assert eagle_seams.missing(root) == (
        "sglang.srt.speculative.eagle_worker_common:assign_draft_cache_locs_contiguous_func")
    # the tree build's platform kernel counts only as a module-level import: one
    # imported inside a function binds no name the wrapper looks up
    files = dict(OLDER)
    files[_EU] = (f"def build():\n    from {_K}.tree import build_tree_kernel_efficient as "
                  "sgl_build_tree_kernel_efficient\n"
                  "def verify_tree_greedy_func(*a):\n    pass\n")
    root = _release(tmp_path / "b", files)
    assert eagle_seams.missing(root) == (
        "sglang.srt.speculative.eagle_utils:build_tree_kernel_efficient_func")
    # the kernels' needs, as ways (after the server config's and the ranks' ways)
    for need in contract.DRIVER_NEEDS["eagle_v2"][2:]:
        assert all(len(way) == 1 for way in need)


# 0.5.15's form: the kernels in srt/speculative/triton_ops, the draft's slots and the
# verify window's launcher imported inside the functions that call them (so bound in the
# kernels' own module), the bonus and the accepted path's source slots launched as kernel
# objects by the modules that import them
_TCL = "srt/speculative/triton_ops/cache_locs.py"
_T = "sglang.srt.speculative.triton_ops"
OLDEST = {
    _TCL: ("def assign_draft_cache_locs_contiguous(req_pool_indices):\n    pass\n"
           "def assign_extend_cache_locs_func(*, req_pool_indices):\n    pass\n"),
    _OU: f"from {_T}.gather_spec_extras import gather_spec_extras\n",
    "srt/speculative/base_spec_worker.py": (
        f"def prepare_for_draft():\n    from {_T}.cache_locs import (\n"
        "        assign_draft_cache_locs_contiguous,\n    )\n"),
    "srt/speculative/eagle_worker_v2.py": f"from {_T}.eagle import fill_bonus_tokens\n",
    _EU: OLDER[_EU],
    _SU: (f"from {_T}.cache_locs import assign_extend_cache_locs as assign_extend_cache_locs\n"
          f"from {_T}.eagle import fill_accept_out_cache_loc as fill_accept_out_cache_loc\n"),
    _FBI: ("from sglang.srt.model_executor.triton_ops.position import "
           "compute_position_triton\n"),
}


def test_the_oldest_layout_binds_its_kernels_where_they_are_looked_up(tmp_path):
    from targets.sglang.boundary import eagle_seams
    root = _release(tmp_path, OLDEST)
    assert eagle_seams.missing(root) is None
    assert set(eagle_seams.seams_in(root)) == {
        "sglang.srt.managers.overlap_utils:gather_spec_extras",
        f"{_T}.cache_locs:assign_draft_cache_locs_contiguous",
        "sglang.srt.speculative.eagle_worker_v2:fill_bonus_tokens",
        "sglang.srt.speculative.eagle_utils:sgl_build_tree_kernel_efficient",
        "sglang.srt.speculative.eagle_utils:verify_tree_greedy_func",
        "sglang.srt.speculative.spec_utils:assign_extend_cache_locs",
        "sglang.srt.speculative.spec_utils:fill_accept_out_cache_loc",
        f"{_T}.cache_locs:assign_extend_cache_locs_func",
        "sglang.srt.model_executor.forward_batch_info:compute_position_triton"}
    assert isinstance(el.stand_in("fill_bonus_tokens"), el.TritonKernel)
    assert isinstance(el.stand_in("fill_accept_out_cache_loc"), el.TritonKernel)
    # without the bonus kernel's import there is no way left for it: named, the first way
    files = dict(OLDEST)
    files["srt/speculative/eagle_worker_v2.py"] = "\n"
    assert eagle_seams.missing(_release(tmp_path / "b", files)) == (
        "sglang.srt.speculative.eagle_worker_common:fill_bonus_tokens_func")
