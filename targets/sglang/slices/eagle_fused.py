"""Declared stand-ins for the fused EAGLE kernels upstream launches on a GPU.

sglang 0.5.23 (``sglang/kernels/ops/speculative/eagle.py``) takes a fused Triton path
wherever a tensor says it is on a GPU (``batch.seq_lens.is_cuda``, ``predict.is_cuda``:
``eagle_worker_common`` and ``eagle_worker_v2``), and an inline torch path otherwise.
Simulated tensors answer ``is_cuda`` as the GPU they stand for (``harness/runtime/sim/
tensor.py``), so the simulator runs the GPU path, and a Triton kernel has no simulator
path: each wrapper below keeps upstream's signature and outputs, and launches one
``specrace::`` op whose schema says what it reads and writes (one launch point, as the
fused kernel's). Each body is vectorised torch on the device -- no host synchronisation --
mirroring the kernel's loads and stores line for line, with a brute-force reference in
``tests/targets/sglang_target/test_eagle_fused.py``. Bound by name where upstream's modules have them
(``install``); a release without a wrapper keeps its own path there.

Not modelled (refused, loud): a ``predict`` that is not one-dimensional.
"""
from __future__ import annotations

import importlib
from typing import Optional

import torch

from toys.kernel_op import declare_kernel

# where upstream's modules imported the wrappers by name (eagle_worker_v2 imports
# prepare_draft_extend_inputs at its call, from the kernels module itself)
_KERNELS = "sglang.kernels.ops.speculative.eagle"
SEAMS = {
    _KERNELS: ("build_chain_tree", "prepare_verify_commit_outputs",
               "prepare_draft_extend_inputs", "prepare_draft_extend_lengths",
               "prepare_draft_extend_layout"),
    "sglang.srt.speculative.eagle_worker_common": (
        "build_chain_tree", "prepare_verify_commit_outputs", "prepare_draft_extend_layout",
        "prepare_draft_extend_lengths"),
}


# --- the kernels' bodies (``_build_chain_tree_kernel`` and kin) --------------------------

def _chain_tree_body(bonus, draft, seq, mask, positions, retrieve, tokens, req_indices,
                     req_to_token, out_cache_loc, mrope) -> None:
    bs, depth = draft.shape
    width = depth + 1
    col = torch.arange(width, device=seq.device)
    tokens.copy_(torch.cat([bonus.view(bs, 1).to(tokens.dtype), draft.to(tokens.dtype)],
                           dim=1).reshape(-1))
    pos = seq.to(torch.int64).view(bs, 1) + col  # (bs, width)
    positions.copy_(pos.reshape(-1))
    if out_cache_loc is not None:
        rows = req_indices.to(torch.int64).view(bs, 1)
        out_cache_loc.copy_(req_to_token[rows, pos].reshape(-1).to(out_cache_loc.dtype))
    if mrope is not None:
        mrope.copy_(pos.reshape(1, -1).expand(3, -1))
    offset = torch.arange(bs * width, device=seq.device)
    retrieve[0].copy_(offset.view(bs, width))
    retrieve[1].copy_(torch.where(col + 1 < width, col + 1, -1).expand(bs, width))
    retrieve[2].fill_(-1)
    n = bs * width * width
    flat = torch.arange(n, device=seq.device)
    mask.view(-1)[:n].copy_((flat % width) <= ((flat // width) % width))


def _commit_body(predict, accept_index, accept_lens, seq_lens, new_seq_lens, bonus,
                 last_steps, track_steps, correct, select, ids, draft_width: int,
                 track_interval: int) -> None:
    bs = accept_lens.numel()
    size = predict.numel()
    row = torch.arange(bs, device=seq_lens.device)
    accepted = accept_lens.to(torch.int64)
    length = seq_lens.to(torch.int64)
    idx = accept_index[row, accepted - 1].to(torch.int64)
    if draft_width > 0:
        last_steps.copy_(idx - row * draft_width)
        correct.copy_((accepted - 1).to(correct.dtype))
        select.copy_(row * draft_width + accepted - 1)
        ids.copy_(predict.to(torch.int64))
        if track_interval > 0:
            post = length + accepted
            crossing = length // track_interval != post // track_interval
            at = torch.clamp(post // track_interval * track_interval - length - 1, min=0)
            track = accept_index[row, at].to(torch.int64) - row * draft_width
            track_steps.copy_(torch.where(crossing, track, -1))
    idx = torch.where(idx < 0, idx + size, idx)
    new_seq_lens.copy_((length + accepted).to(new_seq_lens.dtype))
    bonus.copy_(predict[idx].to(bonus.dtype))


def _extend_inputs_body(accept_lens, predict, correct, select, ids, width: int) -> None:
    accepted = accept_lens.to(torch.int64)
    row = torch.arange(accepted.numel(), device=accepted.device)
    correct.copy_((accepted - 1).to(correct.dtype))
    select.copy_(row * width + accepted - 1)
    ids.copy_(predict.to(torch.int64))


def _extend_lengths_body(seq_lens, prefix, extend, post, positions, starts, mrope,
                         width: int, front: int) -> None:
    base = seq_lens.to(torch.int64)
    prefix.copy_(torch.clamp(base - front, min=0).to(prefix.dtype))
    extend.fill_(width + front)
    post.copy_((base + width).to(post.dtype))
    if positions is not None:  # MAKE_POSITIONS (front 0)
        bs = base.numel()
        starts.copy_((torch.arange(bs, device=base.device) * width).to(starts.dtype))
        pos = (torch.clamp(base - front, min=0).view(bs, 1)
               + torch.arange(width, device=base.device)).reshape(-1)
        positions.copy_(pos)
        if mrope is not None:
            mrope.copy_(pos.view(1, -1).expand(3, -1))


declare_kernel("eagle_build_chain_tree(Tensor bonus, Tensor draft, Tensor seq, "
               "Tensor(a!) mask, Tensor(b!) positions, Tensor(c!) retrieve, "
               "Tensor(d!) tokens, Tensor? req_indices, Tensor? req_to_token, "
               "Tensor(e!)? out_cache_loc, Tensor(f!)? mrope) -> ()",
               lambda *a: _chain_tree_body(*a))
declare_kernel("eagle_verify_commit_outputs(Tensor predict, Tensor accept_index, "
               "Tensor accept_lens, Tensor seq_lens, Tensor(a!) new_seq_lens, "
               "Tensor(b!) bonus, Tensor(c!)? last_steps, Tensor(d!)? track_steps, "
               "Tensor(e!)? correct, Tensor(f!)? select, Tensor(g!)? ids, int draft_width, "
               "int track_interval) -> ()", lambda *a: _commit_body(*a))
declare_kernel("eagle_draft_extend_inputs(Tensor accept_lens, Tensor predict, "
               "Tensor(a!) correct, Tensor(b!) select, Tensor(c!) ids, int width) -> ()",
               lambda *a: _extend_inputs_body(*a))
declare_kernel("eagle_draft_extend_lengths(Tensor seq_lens, Tensor(a!) prefix, "
               "Tensor(b!) extend, Tensor(c!) post, Tensor(d!)? positions, "
               "Tensor(e!)? starts, Tensor(f!)? mrope, int width, int front) -> ()",
               lambda *a: _extend_lengths_body(*a))


# --- upstream's signatures (sglang/kernels/ops/speculative/eagle.py) -------------------

def _one_dim(predict: torch.Tensor) -> None:
    if predict.dim() != 1:
        raise NotImplementedError("specrace: the fused commit stand-ins model a "
                                  "one-dimensional predict only")


def build_chain_tree(bonus_tokens, draft_tokens, seq_lens, tree_mask_buf=None,
                     req_pool_indices=None, req_to_token=None, with_mrope=False):
    bs, depth = draft_tokens.shape
    width = depth + 1
    assert bonus_tokens.numel() == seq_lens.numel() == bs
    dev = seq_lens.device
    mask = tree_mask_buf
    if mask is None:
        mask = torch.empty((bs * width * width,), dtype=torch.bool, device=dev)
    assert mask.is_contiguous() and mask.numel() >= bs * width * width
    positions = torch.empty((bs * width,), dtype=torch.int64, device=dev)
    retrieve = torch.empty((3, bs, width), dtype=torch.int64, device=dev)
    tokens = torch.empty((bs * width,), dtype=torch.promote_types(bonus_tokens.dtype,
                                                                  draft_tokens.dtype),
                         device=dev)
    out_cache_loc = torch.empty_like(positions) if req_to_token is not None else None
    mrope = torch.empty((3, bs * width), dtype=torch.int64, device=dev) if with_mrope \
        else None
    if req_to_token is not None:
        assert req_pool_indices is not None and req_pool_indices.numel() == bs
    if bs:
        torch.ops.specrace.eagle_build_chain_tree(
            bonus_tokens, draft_tokens, seq_lens, mask, positions, retrieve, tokens,
            req_pool_indices if req_to_token is not None else None, req_to_token,
            out_cache_loc, mrope)
    return (mask, positions, retrieve[0], retrieve[1], retrieve[2], tokens, out_cache_loc,
            mrope)


def prepare_verify_commit_outputs(predict, accept_index, accept_lens, seq_lens,
                                  num_draft_tokens=0, mamba_track_interval=0):
    _one_dim(predict)
    bs = accept_lens.numel()
    new_seq_lens = torch.empty((bs,), device=seq_lens.device,
                               dtype=torch.promote_types(seq_lens.dtype, accept_lens.dtype))
    bonus = torch.empty((bs,), device=predict.device, dtype=torch.int32)
    last_steps = track_steps = correct = select = ids = None
    if num_draft_tokens:
        last_steps = torch.empty((bs,), device=seq_lens.device, dtype=torch.int64)
        if mamba_track_interval:
            track_steps = torch.empty_like(last_steps)
        correct = torch.empty_like(accept_lens, memory_format=torch.contiguous_format)
        select = torch.empty_like(last_steps)
        ids = torch.empty((predict.numel(),), device=predict.device, dtype=torch.int64)
    if bs:
        torch.ops.specrace.eagle_verify_commit_outputs(
            predict, accept_index, accept_lens, seq_lens, new_seq_lens, bonus, last_steps,
            track_steps, correct, select, ids, int(num_draft_tokens),
            int(mamba_track_interval))
    if num_draft_tokens:
        return new_seq_lens, bonus, (last_steps, track_steps), (correct, select, ids)
    return new_seq_lens, bonus


def prepare_draft_extend_inputs(accept_lens, predict, num_draft_tokens):
    _one_dim(predict)
    bs, tokens = accept_lens.numel(), predict.numel()
    correct = torch.empty((bs,), device=accept_lens.device, dtype=accept_lens.dtype)
    select = torch.empty((bs,), device=accept_lens.device, dtype=torch.int64)
    ids = torch.empty((tokens,), device=predict.device, dtype=torch.int64)
    if max(bs, tokens):
        torch.ops.specrace.eagle_draft_extend_inputs(accept_lens, predict, correct, select,
                                                     ids, int(num_draft_tokens))
    return correct, select, ids


def _lengths(seq_lens):
    bs = seq_lens.numel()
    prefix = torch.empty((bs,), dtype=torch.int32, device=seq_lens.device)
    return bs, prefix, torch.empty_like(prefix), torch.empty((bs,), dtype=seq_lens.dtype,
                                                             device=seq_lens.device)


def prepare_draft_extend_lengths(seq_lens, num_draft_tokens, front_offset):
    bs, prefix, extend, post = _lengths(seq_lens)
    if bs:
        torch.ops.specrace.eagle_draft_extend_lengths(seq_lens, prefix, extend, post, None,
                                                      None, None, int(num_draft_tokens),
                                                      int(front_offset))
    return prefix, extend, post


def prepare_draft_extend_layout(seq_lens, num_draft_tokens, with_mrope):
    bs, prefix, extend, post = _lengths(seq_lens)
    positions = torch.empty((bs * num_draft_tokens,), dtype=torch.int64,
                            device=seq_lens.device)
    starts = torch.empty_like(prefix)
    mrope: Optional[torch.Tensor] = (
        torch.empty((3, bs * num_draft_tokens), dtype=torch.int64, device=seq_lens.device)
        if with_mrope else None)
    if bs:
        torch.ops.specrace.eagle_draft_extend_lengths(seq_lens, prefix, extend, post,
                                                      positions, starts, mrope,
                                                      int(num_draft_tokens), 0)
    return prefix, extend, post, (positions, starts, mrope)


def install() -> None:
    """Bind the stand-ins where upstream's modules have the wrappers (a release without
    one keeps its own path there; idempotent)."""
    for module, names in SEAMS.items():
        try:
            m = importlib.import_module(module)
        except ImportError:  # a release without the fused kernels module
            continue
        for name in names:
            if hasattr(m, name):
                setattr(m, name, globals()[name])
