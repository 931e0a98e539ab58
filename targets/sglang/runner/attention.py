"""The declared stand-in for the attention backend's kernels.

sglang serves speculative decoding with its Triton or FlashInfer backends (GPU kernels, no
simulator path). Upstream's pure-torch ``torch_native`` backend runs on the simulator as
on a GPU, but it has no ``TARGET_VERIFY`` forward (it reads ``extend_prefix_lens``, which
a verify batch does not carry), no graph state, and it syncs the host once per request
(slicing by device lengths): no graph can capture it, and its syncs would order the host
behind the forward stream where the GPU backends it stands for do not (a fence the served
code does not have: the stale-event barrier mutation went unseen through it). The stand-in
is ``torch_native`` -- upstream's class: its construction, metadata and KV write
(``set_kv_buffer`` at ``out_cache_loc``) -- with its extend kernel (prefill and verify)
written as the GPU kernels are: fixed shapes, no host sync. Each query token attends to
its request's ``req_to_token`` row up to its own position (the context, then its step's
tokens up to itself; causal; one head; the toy's logits do not depend on the result):
checked against upstream's ``torch_native`` extend over the same layouts
(``tests/targets/sglang_target/test_sglang_model_runner.py``). Graph state: none beyond the runner's
static buffers (the forward reads the batch the runner loaded); padded rows attend to one
position (``seq_len`` fill value 1).

Registered at run time in place of ``torch_native`` for the runner's backend construction
only (``registered``); the registry is upstream's, left as found.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch


def paged_attention(q, k_cache, v_cache, req_to_token, rows, positions, scaling):
    """``(n, H)``: query ``i`` (one head) attends to the first ``positions[i] + 1``
    slots of pool row ``rows[i]`` -- its context and the tokens of its own step up to
    itself, whose KV is written there first. Fixed shapes, no host sync."""
    cols = req_to_token.shape[1]
    slots = req_to_token[rows.to(torch.int64)].to(torch.int64)  # (n, cols)
    keys, values = k_cache[slots].flatten(2), v_cache[slots].flatten(2)  # (n, cols, H)
    scores = torch.einsum("nh,nch->nc", q, keys) * scaling
    seen = torch.arange(cols, device=q.device).view(1, cols) <= positions.view(-1, 1)
    scores = scores.masked_fill(~seen, float("-inf"))
    return torch.einsum("nc,nch->nh", scores.softmax(dim=-1), values)


def layout(forward_batch, n: int):
    """Each of the step's ``n`` query tokens' pool row and position: a verify's ``D``
    nodes per request after its context (``seq_lens``), an extend's tokens after its
    prefix (``extend_prefix_lens``, ``extend_start_loc``)."""
    fb = forward_batch
    rows = fb.req_pool_indices.to(torch.int64)
    if fb.forward_mode.is_target_verify():
        bs, D = rows.shape[0], n // rows.shape[0]
        node = torch.arange(D, device=rows.device).view(1, D)
        positions = fb.seq_lens.to(torch.int64).view(bs, 1) + node
        return rows.view(bs, 1).expand(bs, D).reshape(-1), positions.reshape(-1)
    which = torch.repeat_interleave(torch.arange(rows.shape[0], device=rows.device),
                                    fb.extend_seq_lens.to(torch.int64), output_size=n)
    offset = torch.arange(n, device=rows.device) - fb.extend_start_loc.to(torch.int64)[which]
    return rows[which], fb.extend_prefix_lens.to(torch.int64)[which] + offset


def stand_in_class():
    """``VerifyingTorchNativeAttnBackend``: the stand-in (module docstring)."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    class VerifyingTorchNativeAttnBackend(TorchNativeAttnBackend):
        def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kw):
            fb = forward_batch
            if save_kv_cache:
                self.token_to_kv_pool.set_kv_buffer(
                    layer, KVWriteLoc(fb.out_cache_loc, self.swa_out_cache_loc), k, v)
            q = q.reshape(q.shape[0], -1)
            rows, positions = layout(fb, q.shape[0])
            return paged_attention(
                q, self.token_to_kv_pool.get_key_buffer(layer.layer_id),
                self.token_to_kv_pool.get_value_buffer(layer.layer_id),
                self.req_to_token_pool.req_to_token, rows, positions, layer.scaling)

        def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
            pass  # the forward reads the runner's static buffers: no state of its own

        def get_cuda_graph_seq_len_fill_value(self) -> int:
            return 1

    return VerifyingTorchNativeAttnBackend


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """``torch_native`` builds the stand-in while the block runs."""
    from sglang.srt.layers.attention import attention_registry as reg
    original = reg.ATTENTION_BACKENDS["torch_native"]
    reg.ATTENTION_BACKENDS["torch_native"] = stand_in_class()
    try:
        yield
    finally:
        reg.ATTENTION_BACKENDS["torch_native"] = original
