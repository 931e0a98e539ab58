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


def test_a_kernel_object_stands_in_only_for_the_kernel_it_models(sglang):
    """The release's own Triton kernels (the installed ``cache_locs``; on a machine
    without triton its ``@triton.jit`` leaves the function) take exactly the modelled
    parameters; one that takes others is refused, never launched with shifted meaning."""
    from sglang.kernels.ops.speculative import cache_locs
    el.assign_draft_cache_locs_contiguous.replaces(cache_locs.assign_draft_cache_locs_contiguous)
    el.assign_extend_cache_locs.replaces(cache_locs.assign_extend_cache_locs)

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
    for need in contract.DRIVER_NEEDS["eagle_v2"][1:]:  # the kernels' needs, as ways
        assert all(len(way) == 1 for way in need)
