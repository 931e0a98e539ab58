"""Declared stand-ins for the GPU kernels on upstream's EAGLE v2 path.

Each is one ``specrace::`` op declared as impl's kernels are (``toys.kernel_op``: its
schema says what it writes): the race detector sees one read/write set at one point of
one stream, as for the fused kernel's single launch. Each body is plain
vectorised torch on the device -- no host synchronisation, which would drain the stream
and hide the very races under test -- and each has a brute-force reference in the tests
(``tests/targets/sglang_target/test_eagle_kernels.py``). ``eagle_launch.install()`` binds them
where the release launches each kernel (a launcher function of the same name here, or
the Triton kernel object: ``eagle_launch.TritonKernel``, onto the same op), and
``install_rest()`` the fused kernels of the GPU path (``eagle_fused``: simulated tensors
answer ``is_cuda`` as a GPU's do).

What they model, and what not (docs/sglang-target.md#eagle-v2):

* ``gather_spec_extras``: the FutureMap's fused row gather of the relayed draft state
  (``topk_p``, ``topk_index``, bonus tokens, hidden states) by the future indices --
  upstream's Triton kernel; all four reads at one point.
* ``assign_draft_cache_locs_contiguous_func`` (or the kernel object
  ``assign_draft_cache_locs_contiguous``): each row's draft window of KV slots from
  ``req_to_token`` (and the draft positions). ``mrope`` is not modelled (it raises).
* ``build_tree_kernel_efficient_func`` (or the wrapper's ``sgl_build_tree_kernel_efficient``,
  the same arguments): the verify tree's links, positions, retrieve indices and the
  ``QLEN_ONLY`` mask from the draft's parent lists; ``FULL_MASK`` (the prefix columns) is
  not modelled (it raises).
* ``verify_tree_greedy_func``: greedy tree acceptance (``toys.verify``'s kernel, mapped to
  upstream's outputs: the accepted path's retrieve indices and the number of accepted
  drafts).
* ``fill_bonus_tokens_func``: each request's last accepted token.
* ``extend_cache_locs`` (the simulator platform's ``get_speculative_cache_locs_fn``,
  upstream's seam for out-of-tree devices): the verify window's slots when the draft did
  not plan them (topk > 1); and, as the kernel object ``assign_extend_cache_locs``, the
  accepted tree path's target slots where a release reads them from ``req_to_token``.
* ``fill_front_out_cache_loc_func`` / ``fill_accept_out_cache_loc_func`` (topk > 1): the
  KV slots the accepted tree path moves to (the front of each request's verify window,
  packed) and from (its accepted nodes' slots, compacted in order).
* ``compute_position_triton``: an extend's positions (each request's prefix length on)
  and start offsets, where ``ForwardBatch.init_new`` computes them on a backend that
  supports Triton -- every GPU backend but ``torch_native`` / ``intel_amx``. Upstream's
  torch path for those two reads each length with ``.item()``: a host sync per request
  that drains the forward (and a plan) stream, which a server on FA3 or FlashInfer never
  does. A declared op like the rest: its outputs are sized by the host's token count,
  and its body finds each token's request by searching the lengths' running ends.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from toys.kernel_op import declare_kernel
from toys.verify import _verify_kernel


def _gather_body(indices, topk_p_buf, topk_index_buf, tokens_buf, hidden_buf,
                 topk_p, topk_index, tokens, hidden) -> None:
    idx = indices.to(torch.int64)
    topk_p.copy_(topk_p_buf[idx])
    topk_index.copy_(topk_index_buf[idx])
    tokens.copy_(tokens_buf[idx])
    if hidden_buf is not None:
        hidden.copy_(hidden_buf[idx])


def _draft_locs_body(req_pool_indices, req_to_token, seq_lens, out_cache_loc, topk,
                     num_cols, positions) -> None:
    width = topk * num_cols
    rows = req_pool_indices.to(torch.int64).view(-1, 1)
    cols = seq_lens.to(torch.int64).view(-1, 1) + torch.arange(width, device=seq_lens.device)
    out_cache_loc.copy_(req_to_token[rows, cols].reshape(-1))
    if positions is not None:
        positions.copy_(seq_lens.repeat_interleave(topk))


def tree_parents(parent_list: torch.Tensor, top_scores_index: torch.Tensor, topk: int,
                 num_verify_tokens: int) -> torch.Tensor:
    """``(bs, N)``: the tree position of each node's parent (the root's is -1; a node
    whose parent is not among the selected drafts is -1 too: the kernel leaves it
    unlinked). Node ``i > 0`` is draft ``sel[i-1]``; its parent is the root when the draft
    came from the first step, else the node holding ``parent_list[sel[i-1] // topk]``."""
    N = num_verify_tokens
    sel = top_scores_index[:, :N - 1].to(torch.int64)
    bs = sel.shape[0]
    block = sel // topk
    if parent_list.numel():
        want = parent_list.to(torch.int64).gather(1, block.clamp(max=parent_list.shape[1] - 1))
    else:
        want = torch.full_like(sel, -1)
    eq = sel[:, None, :] == want[:, :, None]  # (bs, node-1, candidate-1)
    found = eq.any(dim=2)
    first = eq.to(torch.int8).argmax(dim=2) + 1
    parent = torch.where(block == 0, torch.zeros_like(sel),
                         torch.where(found, first, torch.full_like(sel, -1)))
    root = torch.full((bs, 1), -1, dtype=torch.int64, device=sel.device)
    return torch.cat([root, parent], dim=1)


def _build_tree_body(parent_list, top_scores_index, seq_lens, tree_mask, positions,
                     retrieve_index, retrieve_next_token, retrieve_next_sibling, topk,
                     num_verify_tokens) -> None:
    N = num_verify_tokens
    device = seq_lens.device
    parent = tree_parents(parent_list, top_scores_index, topk, N)
    bs = parent.shape[0]
    node = torch.arange(N, device=device)
    retrieve_index.copy_(torch.arange(bs, device=device).view(-1, 1) * N + node)
    # the children of p are the nodes whose parent is p: the first child is the smallest,
    # a node's next sibling the next larger one with its parent (the kernel's link order)
    nodes = node.view(1, 1, N).expand(bs, N, N)
    none = torch.full((bs, N, N), N, dtype=torch.int64, device=device)
    child = parent[:, None, :] == node[None, :, None]  # (bs, p, i)
    first_child = torch.where(child, nodes, none).min(dim=2).values
    retrieve_next_token.copy_(torch.where(first_child < N, first_child, -1))
    later = (parent[:, :, None] == parent[:, None, :]) & (parent[:, :, None] >= 0) & \
        (node[None, None, :] > node[None, :, None])  # (bs, i, j): j a later sibling of i
    next_sib = torch.where(later, nodes, none).min(dim=2).values
    retrieve_next_sibling.copy_(torch.where(next_sib < N, next_sib, -1))
    # ancestors-or-self (the root's column always) and depth: walk up at most N-1 times;
    # each step from a non-root node counts one level, and a missing parent ends the walk
    anc = torch.eye(N, dtype=torch.bool, device=device).expand(bs, N, N).clone()
    anc[:, :, 0] = True
    cur = node.view(1, N).expand(bs, N).clone()
    active = cur > 0
    depth = torch.zeros((bs, N), dtype=torch.int64, device=device)
    for _ in range(N - 1):
        depth += active.to(torch.int64)
        up = parent.gather(1, cur)
        step = active & (up >= 0)
        cur = torch.where(step, up, cur)
        anc |= (cur[:, :, None] == node[None, None, :]) & step[:, :, None]
        active = step & (cur > 0)
    positions.copy_((seq_lens.to(torch.int64).view(-1, 1) + depth).reshape(-1))
    tree_mask.view(bs, N, N).copy_(anc)


def _verify_body(predicts, accept_index, accept_token_num, candidates, retrieve_index,
                 retrieve_next_token, retrieve_next_sibling, target_predict) -> None:
    bs, N = candidates.shape
    device = candidates.device
    pred = torch.empty((bs * N,), dtype=torch.int64, device=device)
    path = torch.full((bs, N), -1, dtype=torch.int64, device=device)
    lens = torch.empty((bs,), dtype=torch.int32, device=device)
    nt, ns = retrieve_next_token.to(torch.int64), retrieve_next_sibling.to(torch.int64)
    # a node no link reaches (its parent was not selected) is never walked to: impl's
    # kernel derives parents from the links, so it must not match anything
    linked = torch.zeros((bs, N + 1), dtype=torch.bool, device=device)
    linked.scatter_(1, torch.cat([nt, ns], dim=1).masked_fill(
        torch.cat([nt, ns], dim=1) < 0, N), True)
    linked[:, 0] = True
    drafts = candidates.to(torch.int64).masked_fill(~linked[:, :N], -1)
    _verify_kernel(target_predict.view(bs, N).to(torch.int64), drafts, nt, ns, pred, path,
                   lens)
    predicts.copy_(pred.to(predicts.dtype))
    # impl's kernel gives the path as b * N + tree position: upstream's as the retrieve
    # index of each position (the same numbers in the kernel's layout, mapped anyway)
    width = accept_index.shape[1]  # the draft's steps + 1: may exceed a small tree
    path = torch.nn.functional.pad(path, (0, max(0, width - N)), value=-1)[:, :width]
    flat = retrieve_index.reshape(-1).to(torch.int64)
    accept_index.copy_(torch.where(path >= 0, flat[path.clamp(min=0)], -1)
                       .to(accept_index.dtype))
    accept_token_num.copy_((lens - 1).to(accept_token_num.dtype))


def _bonus_body(accept_tokens, accept_lens, bonus_tokens, accept_stride) -> None:
    bs = bonus_tokens.shape[0]
    at = torch.arange(bs, device=accept_lens.device) * accept_stride + \
        accept_lens.to(torch.int64) - 1
    bonus_tokens.copy_(accept_tokens.reshape(-1)[at].to(bonus_tokens.dtype))


def _front_body(num_front, out_cache_loc, front_out_cache_loc) -> None:
    bs = num_front.numel()
    window = out_cache_loc.view(bs, -1)
    n = num_front.to(torch.int64).view(-1, 1)
    col = torch.arange(window.shape[1], device=window.device).view(1, -1)
    keep = col < n
    # request i's slots land after the ones of the requests before it
    offset = torch.cumsum(num_front.to(torch.int64), 0) - num_front.to(torch.int64)
    dst = (offset.view(-1, 1) + col)[keep]
    front_out_cache_loc.index_copy_(0, dst, window[keep].to(front_out_cache_loc.dtype))


def _extend_locs_body(req_pool_indices, req_to_token, start_offset, end_offset,
                      out_cache_loc) -> None:
    start, end = start_offset.to(torch.int64), end_offset.to(torch.int64)
    n = end - start
    width = out_cache_loc.numel()  # at least the longest row's extension
    col = torch.arange(width, device=start.device).view(1, -1)
    keep = col < n.view(-1, 1)
    offset = torch.cumsum(n, 0) - n
    rows = req_pool_indices.to(torch.int64).view(-1, 1).expand(-1, width)
    cols = (start.view(-1, 1) + col).clamp(max=req_to_token.shape[1] - 1)
    dst = (offset.view(-1, 1) + col)[keep]
    out_cache_loc.index_copy_(0, dst, req_to_token[rows[keep], cols[keep]].to(
        out_cache_loc.dtype))


def _position_body(extend_prefix_lens, extend_seq_lens, has_prefix, positions,
                   extend_start_loc) -> None:
    # each token finds its request by a search of the running ends (a request of no
    # tokens is passed over, as the kernel's loop of zero blocks writes nothing); as the
    # kernel, only the lengths' tokens are written -- a caller whose token count is
    # larger leaves the rest of ``positions`` as allocated
    lens = extend_seq_lens.to(torch.int64)
    ends = torch.cumsum(lens, 0)
    start = ends - lens
    written = int(ends[-1]) if lens.numel() else 0  # (the body runs on the data)
    token = torch.arange(min(written, positions.shape[0]), device=positions.device)
    which = torch.searchsorted(ends, token, right=True)
    offset = token - start[which]
    if has_prefix:
        offset = offset + extend_prefix_lens.to(torch.int64)[which]
    positions[:token.shape[0]].copy_(offset)
    extend_start_loc.copy_(start.to(torch.int32))


def _accept_locs_body(accept_index, out_cache_loc, accept_out_cache_loc, size) -> None:
    flat = accept_index.reshape(-1)[:size].to(torch.int64)
    valid = flat != -1
    # the k-th accepted entry (row-major) goes to slot k: a stable compaction
    dst = torch.cumsum(valid.to(torch.int64), 0) - 1
    accept_out_cache_loc.index_copy_(0, dst[valid], out_cache_loc[flat[valid]].to(
        accept_out_cache_loc.dtype))


declare_kernel("gather_spec_extras(Tensor indices, Tensor topk_p_buf, Tensor topk_index_buf, "
               "Tensor tokens_buf, Tensor? hidden_buf, Tensor(a!) topk_p, "
               "Tensor(b!) topk_index, Tensor(c!) tokens, Tensor(d!)? hidden) -> ()",
               lambda *a: _gather_body(*a))
declare_kernel("assign_draft_cache_locs(Tensor req_pool_indices, Tensor req_to_token, "
               "Tensor seq_lens, Tensor(a!) out_cache_loc, int topk, int num_cols, "
               "Tensor(b!)? positions) -> ()", lambda *a: _draft_locs_body(*a))
declare_kernel("build_tree_efficient(Tensor parent_list, Tensor top_scores_index, "
               "Tensor seq_lens, Tensor(a!) tree_mask, Tensor(b!) positions, "
               "Tensor(c!) retrieve_index, Tensor(d!) retrieve_next_token, "
               "Tensor(e!) retrieve_next_sibling, int topk, int num_verify_tokens) -> ()",
               lambda *a: _build_tree_body(*a))
declare_kernel("eagle_verify_tree_greedy(Tensor(a!) predicts, Tensor(b!) accept_index, "
               "Tensor(c!) accept_token_num, Tensor candidates, Tensor retrieve_index, "
               "Tensor retrieve_next_token, Tensor retrieve_next_sibling, "
               "Tensor target_predict) -> ()", lambda *a: _verify_body(*a))
declare_kernel("fill_bonus_tokens(Tensor accept_tokens, Tensor accept_lens, "
               "Tensor(a!) bonus_tokens, int accept_stride) -> ()",
               lambda *a: _bonus_body(*a))
declare_kernel("extend_cache_locs(Tensor req_pool_indices, Tensor req_to_token, "
               "Tensor start_offset, Tensor end_offset, Tensor(a!) out_cache_loc) -> ()",
               lambda *a: _extend_locs_body(*a))
declare_kernel("fill_front_out_cache_loc(Tensor num_front, Tensor out_cache_loc, "
               "Tensor(a!) front_out_cache_loc) -> ()", lambda *a: _front_body(*a))
declare_kernel("compute_position(Tensor extend_prefix_lens, Tensor extend_seq_lens, "
               "bool has_prefix, Tensor(a!) positions, Tensor(b!) extend_start_loc) -> ()",
               lambda *a: _position_body(*a))
declare_kernel("fill_accept_out_cache_loc(Tensor accept_index, Tensor out_cache_loc, "
               "Tensor(a!) accept_out_cache_loc, int size) -> ()",
               lambda *a: _accept_locs_body(*a))


# --- upstream's signatures ------------------------------------------------------------
def gather_spec_extras(indices, topk_p_buf, topk_index_buf, output_tokens_buf,
                       hidden_states_buf=None) -> Tuple:
    """``gather_spec_extras.py``'s entry point: fresh outputs, one launch (none for an
    empty batch)."""
    m = indices.numel()
    outs = [torch.empty((m, *b.shape[1:]), dtype=b.dtype, device=b.device)
            for b in (topk_p_buf, topk_index_buf, output_tokens_buf)]
    hidden = None
    if hidden_states_buf is not None:
        hidden = torch.empty((m, *hidden_states_buf.shape[1:]), dtype=hidden_states_buf.dtype,
                             device=hidden_states_buf.device)
    if m:
        torch.ops.specrace.gather_spec_extras(indices.contiguous(), topk_p_buf, topk_index_buf,
                                              output_tokens_buf, hidden_states_buf, *outs,
                                              hidden)
    return outs[0], outs[1], outs[2], hidden


def assign_draft_cache_locs_contiguous_func(req_pool_indices, req_to_token, seq_lens,
                                            out_cache_loc, topk: int, num_cols: int,
                                            positions: Optional[torch.Tensor] = None,
                                            mrope: Optional[torch.Tensor] = None) -> None:
    if mrope is not None:
        raise NotImplementedError("specrace: the draft cache-location stand-in does not "
                                  "model mrope positions")
    torch.ops.specrace.assign_draft_cache_locs(req_pool_indices, req_to_token, seq_lens,
                                               out_cache_loc, topk, num_cols, positions)


def build_tree_kernel_efficient_func(parent_list, top_scores_index, seq_lens, tree_mask,
                                     positions, retrieve_index, retrieve_next_token,
                                     retrieve_next_sibling, topk, spec_steps,
                                     num_verify_tokens, tree_mask_mode) -> None:
    if getattr(tree_mask_mode, "name", str(tree_mask_mode)) != "QLEN_ONLY":
        raise NotImplementedError(f"specrace: the tree-build stand-in models the QLEN_ONLY "
                                  f"mask only, not {tree_mask_mode}")
    torch.ops.specrace.build_tree_efficient(parent_list, top_scores_index, seq_lens,
                                            tree_mask, positions, retrieve_index,
                                            retrieve_next_token, retrieve_next_sibling,
                                            topk, num_verify_tokens)


def verify_tree_greedy_func(predicts, accept_index, accept_token_num, candidates,
                            retrieve_index, retrieve_next_token, retrieve_next_sibling,
                            target_predict, topk=-1):
    torch.ops.specrace.eagle_verify_tree_greedy(predicts, accept_index, accept_token_num,
                                                candidates, retrieve_index,
                                                retrieve_next_token, retrieve_next_sibling,
                                                target_predict)
    return predicts, accept_index, accept_token_num


def fill_bonus_tokens_func(accept_tokens, accept_lens, bonus_tokens, accept_stride,
                           batch_size) -> None:
    torch.ops.specrace.fill_bonus_tokens(accept_tokens, accept_lens, bonus_tokens,
                                         accept_stride)


def extend_cache_locs(*, req_pool_indices, req_to_token, start_offset, end_offset,
                      batch_size, draft_token_num, device) -> torch.Tensor:
    """The platform seam's signature (``SRTPlatform.get_speculative_cache_locs_fn``):
    each row's slots ``[start, end)`` from ``req_to_token``, packed in row order."""
    out = torch.empty((batch_size * draft_token_num,), dtype=torch.int64, device=device)
    torch.ops.specrace.extend_cache_locs(req_pool_indices, req_to_token, start_offset,
                                         end_offset, out)
    return out


def fill_front_out_cache_loc_func(num_front, out_cache_loc, front_out_cache_loc) -> None:
    torch.ops.specrace.fill_front_out_cache_loc(num_front, out_cache_loc,
                                                front_out_cache_loc)


def fill_accept_out_cache_loc_func(accept_index, out_cache_loc, accept_out_cache_loc,
                                   size: int) -> None:
    torch.ops.specrace.fill_accept_out_cache_loc(accept_index, out_cache_loc,
                                                 accept_out_cache_loc, size)


def compute_position_triton(extend_prefix_lens: torch.Tensor, extend_seq_lens: torch.Tensor,
                            extend_seq_lens_sum: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``kernels/ops/attention/position.py``'s launcher: ``positions`` (int64, one per
    extend token: the request's prefix length, then on by one) and ``extend_start_loc``
    (int32, each request's first token), sized by the host-known token count. A prefix
    tensor shorter than the batch means no prefix, as the kernel's ``has_prefix`` says."""
    bs = extend_seq_lens.shape[0]
    positions = torch.empty(extend_seq_lens_sum, dtype=torch.int64,
                            device=extend_seq_lens.device)
    extend_start_loc = torch.empty(bs, dtype=torch.int32, device=extend_seq_lens.device)
    torch.ops.specrace.compute_position(extend_prefix_lens, extend_seq_lens,
                                        extend_prefix_lens.shape[0] == bs, positions,
                                        extend_start_loc)
    return positions, extend_start_loc


def support_triton_by_name(backend: str) -> bool:
    """A CUDA server's answer to ``support_triton`` (0.5.22 on also asks the platform,
    which on the simulator answers no Triton): by the backend's name alone."""
    return backend not in ("torch_native", "intel_amx")


def install_rest() -> None:
    """What the slice replaces beside the kernel seams (``eagle_launch.install`` binds
    those, then calls this; idempotent, run-time patches only)."""
    import importlib
    # the verify's grammar mask: xgrammar's bitmask kernel has no simulator path; impl's
    # plain-torch apply, on the grammar classes that define it
    from toys.bitmask import apply_vocab_mask
    xgb = importlib.import_module("sglang.srt.constrained.xgrammar_backend")
    for cls in vars(xgb).values():
        if isinstance(cls, type) and "apply_vocab_mask" in vars(cls):
            cls.apply_vocab_mask = staticmethod(apply_vocab_mask)
    # the draft's later-step top-k selection is torch.compile'd (an optimisation: the
    # function is plain torch); inductor has no simulator backend, so it runs as written
    spec_utils = importlib.import_module("sglang.srt.speculative.spec_utils")
    later = spec_utils._select_top_k_tokens_later
    spec_utils._select_top_k_tokens_later = getattr(later, "_torchdynamo_orig_callable", later)
    # an extend's positions: ForwardBatch.init_new launches the Triton kernel (its
    # stand-in is bound as a seam) where the runner's backend supports Triton, asked as
    # a CUDA server answers -- only this module's name, whose one use is that choice
    fbi = importlib.import_module("sglang.srt.model_executor.forward_batch_info")
    fbi.support_triton = support_triton_by_name
    # the fused kernels of the GPU path (simulated tensors say is_cuda: eagle_fused)
    from targets.sglang.slices import eagle_fused
    eagle_fused.install()
