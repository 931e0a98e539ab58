"""The declared stand-in for the attention backend's verify: upstream's ``torch_native``
backend (pure torch: it runs on the simulator as on a GPU) with the one thing it lacks --
a ``TARGET_VERIFY`` forward. sglang serves speculative verifies with its Triton or
FlashInfer backends (GPU kernels, no simulator path); ``torch_native`` reads a verify's
``extend_prefix_lens`` / ``extend_seq_lens``, which a verify batch does not carry. The
stand-in gives it the verify's layout -- each request's context (``seq_lens``) as the
prefix, its ``D`` draft nodes as the extend, causal over them (a chain; the toy's logits
do not depend on the attention) -- and runs upstream's ``forward_extend`` unchanged:
upstream's KV write (``set_kv_buffer`` at ``out_cache_loc``) and its reads of
``req_to_token`` and the KV pool. Every other mode is upstream's code as it is.

Registered at run time in place of ``torch_native`` for the runner's backend
construction only (``registered``); the registry is upstream's, left as found.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch


class _VerifyLayout:
    """A verify's forward batch as an extend over its ``D`` nodes: the fields
    ``forward_extend`` reads of the layout; every other field is the batch's."""

    def __init__(self, forward_batch, draft_token_num: int) -> None:
        self._fb = forward_batch
        prefix = forward_batch.seq_lens
        self.extend_prefix_lens = prefix
        self.extend_seq_lens = torch.full_like(prefix, draft_token_num)
        self.seq_lens = prefix + draft_token_num

    def __getattr__(self, name):
        return getattr(self._fb, name)


def stand_in_class():
    """``VerifyingTorchNativeAttnBackend``: the stand-in (module docstring)."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    class VerifyingTorchNativeAttnBackend(TorchNativeAttnBackend):
        def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kw):
            if forward_batch.forward_mode.is_target_verify():
                D = forward_batch.spec_info.draft_token_num
                forward_batch = _VerifyLayout(forward_batch, D)
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)

    return VerifyingTorchNativeAttnBackend


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """``torch_native`` builds the stand-in while the block runs."""
    from sglang.srt.layers.attention import attention_registry as reg
    cls = stand_in_class()
    original = reg.ATTENTION_BACKENDS["torch_native"]
    reg.ATTENTION_BACKENDS["torch_native"] = cls
    try:
        yield
    finally:
        reg.ATTENTION_BACKENDS["torch_native"] = original
