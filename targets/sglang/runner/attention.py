"""The declared stand-in for the attention backend's verify kernel.

sglang serves speculative verifies with its Triton or FlashInfer backends (GPU kernels,
no simulator path); upstream's pure-torch ``torch_native`` backend runs on the simulator
as on a GPU but has no ``TARGET_VERIFY`` forward (it reads ``extend_prefix_lens``, which
a verify batch does not carry), syncs the host per request (no graph can capture it) and
has no graph state. The stand-in is ``torch_native`` -- upstream's class, its prefill and
decode forwards as they are -- plus what a verify needs, written as the verify kernels
are: fixed shapes, no host sync, so the decode graph runner can capture and replay it.

* ``TARGET_VERIFY``: upstream's KV write (``set_kv_buffer`` at ``out_cache_loc``), then
  each request's ``D`` nodes attend to its context (``req_to_token`` row, up to
  ``seq_lens``) and to the nodes up to themselves (a chain; the toy's logits do not
  depend on the attention) -- checked against upstream's ``torch_native`` extend over the
  same layout (``tests/upstream/test_sglang_model_runner.py``);
* graph state: none beyond the runner's static buffers (the forward reads the batch the
  runner loaded); padded rows attend to one position (``seq_len`` fill value 1).

Registered at run time in place of ``torch_native`` for the runner's backend construction
only (``registered``); the registry is upstream's, left as found.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch


def verify_attention(q, k_cache, v_cache, req_to_token, rows, prefix_lens, scaling):
    """``(bs*D, H)`` outputs of the verify's ``D`` nodes per request: node ``j`` of a
    request attends to its context's first ``prefix_len + j + 1`` positions of its row
    (the nodes' own KV is written there first). One head; fixed shapes throughout."""
    bs = rows.shape[0]
    D = q.shape[0] // bs
    cols = req_to_token.shape[1]
    slots = req_to_token[rows.to(torch.int64)].to(torch.int64)  # (bs, cols)
    keys, values = k_cache[slots].flatten(2), v_cache[slots].flatten(2)  # (bs, cols, H)
    scores = torch.einsum("bdh,bch->bdc", q.view(bs, D, -1), keys) * scaling
    pos = torch.arange(cols, device=q.device).view(1, 1, cols)
    node = torch.arange(D, device=q.device).view(1, D, 1)
    seen = pos < (prefix_lens.view(bs, 1, 1) + node + 1)
    scores = scores.masked_fill(~seen, float("-inf"))
    out = torch.einsum("bdc,bch->bdh", scores.softmax(dim=-1), values)
    return out.reshape(bs * D, -1)


def stand_in_class():
    """``VerifyingTorchNativeAttnBackend``: the stand-in (module docstring)."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    class VerifyingTorchNativeAttnBackend(TorchNativeAttnBackend):
        def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kw):
            fb = forward_batch
            if not fb.forward_mode.is_target_verify():
                return super().forward_extend(q, k, v, layer, fb, save_kv_cache)
            if save_kv_cache:
                self.token_to_kv_pool.set_kv_buffer(
                    layer, KVWriteLoc(fb.out_cache_loc, self.swa_out_cache_loc), k, v)
            return verify_attention(
                q.reshape(q.shape[0], -1), self.token_to_kv_pool.get_key_buffer(layer.layer_id),
                self.token_to_kv_pool.get_value_buffer(layer.layer_id),
                self.req_to_token_pool.req_to_token, fb.req_pool_indices, fb.seq_lens,
                layer.scaling)

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
