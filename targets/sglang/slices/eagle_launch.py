"""The EAGLE kernel stand-ins bound where the installed release launches each kernel.

A release launches a kernel through a launcher function (0.5.23:
``assign_draft_cache_locs_contiguous_func(...)``) or the Triton kernel object itself
(0.5.19-0.5.22: ``assign_draft_cache_locs_contiguous[(bs,)](...)``); which one is read
from its source (``boundary/eagle_seams``), never from its version. A function seam gets
``eagle_kernels``' function of that name; a kernel-object seam gets a ``TritonKernel``
here, whose ``[grid]`` gives a callable with the kernel's own parameters and launches
the same declared ``specrace::`` op as the function does -- the same read/write set at
one point of one stream, so the race detector sees one launch either way. What a
kernel-object launch can say that the op does not model (another grid than one program
per row, a row stride other than the table's, mrope positions) raises.
"""
from __future__ import annotations

import functools
import importlib
import inspect

import torch

from seams import process
from targets import static
from targets.sglang.boundary import eagle_seams
from targets.sglang.slices import eagle_kernels


class TritonKernel:
    """A Triton kernel object as its call sites use it: ``kernel[grid](*args, **kw)``.
    ``launch(rows, *args, **kw)`` takes the kernel's parameters after the grid's rows."""

    def __init__(self, launch) -> None:
        self.launch = launch
        params = list(inspect.signature(launch).parameters.values())[1:]
        self.params = tuple(p.name for p in params)
        # the parameters a kernel may lack: each defaults to "not done" (older kernels
        # write no draft positions: 0.5.19-0.5.21's takes the first seven only)
        self.optional = sum(1 for p in params if p.default is not p.empty)

    def __getitem__(self, grid):
        # the kernels stood in for run one program per row: any other grid is a launch
        # the op does not model
        if not (isinstance(grid, tuple) and len(grid) == 1 and isinstance(grid[0], int)):
            raise NotImplementedError(f"specrace: {self.launch.__name__} models a (rows,) "
                                      f"grid, not {grid!r}")
        return functools.partial(self.launch, grid[0])

    def replaces(self, kernel) -> None:
        """Refuse to stand in for a kernel whose parameters are not the ones modelled
        (a positional argument would silently mean something else)."""
        fn = getattr(kernel, "fn", kernel)  # triton's JITFunction keeps the function
        got = tuple(inspect.signature(fn).parameters)
        if got != self.params[:len(got)] or len(got) < len(self.params) - self.optional:
            raise TypeError(f"specrace: {self.launch.__name__} models a kernel taking "
                            f"{self.params}; the release's takes {got}")


def _rows(rows: int, req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
          pool_len: int) -> None:
    if rows != req_pool_indices.numel():
        raise NotImplementedError(f"specrace: a grid of {rows} programs over "
                                  f"{req_pool_indices.numel()} rows is not modelled")
    if pool_len != req_to_token.shape[1]:
        raise NotImplementedError(f"specrace: a row stride of {pool_len} over a "
                                  f"req_to_token of width {req_to_token.shape[1]} is not "
                                  f"modelled")


def _draft_locs(rows, req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len,
                topk, speculative_num_steps, positions=None, mrope=None, BS=0,
                WRITE_POSITIONS=False, WRITE_MROPE=False) -> None:
    """``cache_locs.assign_draft_cache_locs_contiguous``: program ``pid`` copies its
    row's ``topk * speculative_num_steps`` slots from ``seq_lens[pid]`` on, and writes
    the draft positions when ``WRITE_POSITIONS`` (the launcher function's op)."""
    _rows(rows, req_pool_indices, req_to_token, pool_len)
    if WRITE_MROPE:
        raise NotImplementedError("specrace: the draft cache-location stand-in does not "
                                  "model mrope positions")
    if WRITE_POSITIONS and positions is None:
        raise NotImplementedError("specrace: WRITE_POSITIONS without a positions tensor")
    torch.ops.specrace.assign_draft_cache_locs(
        req_pool_indices, req_to_token, seq_lens, out_cache_loc, topk,
        speculative_num_steps, positions if WRITE_POSITIONS else None)


def _extend_locs(rows, req_pool_indices, req_to_token, start_offset, end_offset,
                 out_cache_loc, pool_len, bs_upper) -> None:
    """``cache_locs.assign_extend_cache_locs``: program ``pid`` copies its row's slots
    ``[start, end)`` of ``req_to_token`` to the packed offset of the rows before it,
    which it sums over ``bs_upper`` lanes (the ``extend_cache_locs`` op)."""
    _rows(rows, req_pool_indices, req_to_token, pool_len)
    if bs_upper < rows:  # the offsets would miss rows: not the packing modelled
        raise NotImplementedError(f"specrace: bs_upper {bs_upper} < {rows} rows")
    torch.ops.specrace.extend_cache_locs(req_pool_indices, req_to_token, start_offset,
                                         end_offset, out_cache_loc)


def _bonus(rows, accept_tokens, accept_lens, bonus_tokens_ptr, accept_stride) -> None:
    """``eagle.fill_bonus_tokens``: program ``pid`` writes row ``pid``'s last accepted
    token (the ``fill_bonus_tokens`` op, which the launcher function launches)."""
    if rows != bonus_tokens_ptr.numel():
        raise NotImplementedError(f"specrace: a grid of {rows} programs over "
                                  f"{bonus_tokens_ptr.numel()} rows is not modelled")
    torch.ops.specrace.fill_bonus_tokens(accept_tokens, accept_lens, bonus_tokens_ptr,
                                         accept_stride)


def _accept_locs(rows, accept_index, out_cache_loc, accept_out_cache_loc,
                 size_upper) -> None:
    """``eagle.fill_accept_out_cache_loc``: program ``pid`` moves ``accept_index[pid]``'s
    slot to the count of accepted entries before it, which it sums over ``size_upper``
    lanes (the ``fill_accept_out_cache_loc`` op over the grid's ``size`` entries)."""
    if size_upper < rows:  # the counts would miss entries: not the packing modelled
        raise NotImplementedError(f"specrace: size_upper {size_upper} < {rows} entries")
    torch.ops.specrace.fill_accept_out_cache_loc(accept_index, out_cache_loc,
                                                 accept_out_cache_loc, rows)


assign_draft_cache_locs_contiguous = TritonKernel(_draft_locs)
assign_extend_cache_locs = TritonKernel(_extend_locs)
# the kernels 0.5.15 launches itself where later releases call their launcher functions
# (fill_bonus_tokens_func, fill_accept_out_cache_loc_func launch these same kernels)
fill_bonus_tokens = TritonKernel(_bonus)
fill_accept_out_cache_loc = TritonKernel(_accept_locs)
# the tree-build wrapper's platform kernel (``tree.build_tree_kernel_efficient``, imported
# as ``sgl_build_tree_kernel_efficient``): the launcher function's call, argument for
# argument
sgl_build_tree_kernel_efficient = eagle_kernels.build_tree_kernel_efficient_func
# the verify window's slots, where the verify's uniform launcher falls back to this
# launcher off a GPU and no platform seam answers there (0.5.19, 0.5.20): the platform
# seam's stand-in, whose keyword signature is this launcher's
assign_extend_cache_locs_func = eagle_kernels.extend_cache_locs


def stand_in(name: str):
    """The stand-in bound at a seam named ``name``: ``eagle_kernels``' launcher function
    of that name, or the kernel object here."""
    return getattr(eagle_kernels, name) if hasattr(eagle_kernels, name) else globals()[name]


def install() -> None:
    """Bind a stand-in at the seam the installed release launches each kernel through
    (idempotent; a run-time patch of the names upstream's modules imported, never of
    their source), then the grammar mask, the torch.compile'd top-k and the fused
    GPU-path kernels (``eagle_kernels.install_rest``)."""
    root = static.package_root("sglang")
    lacks = eagle_seams.missing(root)
    if lacks:  # the contract's eagle_v2 driver needs name it first: "not driven"
        raise TypeError(f"this sglang release launches no EAGLE kernel where specrace "
                        f"binds a stand-in: {lacks} is missing")
    for seam in eagle_seams.seams_in(root):
        module, _, name = seam.partition(":")
        m = importlib.import_module(module)
        ours = stand_in(name)
        current = getattr(m, name, None)  # absent where the import is platform-gated
        if isinstance(ours, TritonKernel) and current is not None and current is not ours:
            ours.replaces(current)
        setattr(m, name, ours)
    eagle_kernels.install_rest()
    process.note("sglang-kernel-seams")
