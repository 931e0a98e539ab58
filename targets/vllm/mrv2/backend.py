"""Ours, named as such: the toy attention backend (``engine/model.py``) as later releases'
backend interface asks for it, for the models Model Runner V2 runs (``model``).

What changed by 0.34.0, and the answer given -- the same toy metadata, built the same
way, through the interface the release has:

* ``get_supported_kernel_block_sizes`` takes the layer's KV spec (0.17.0: nothing);
* the metadata builder is a plain ``AttentionMetadataBuilder`` (MRv2 has no hybrid
  path: the GDN type the V1 path's builder carries for its accepted counts is not
  needed), built with whatever ``build`` arguments the release passes, and declaring
  the CUDA-graph support the 0.17.0 builder inherits from GDN's (``UNIFORM_BATCH``:
  full graphs of uniform decode batches, what ``engine/graphs.py`` asks for; the base
  class says ``NEVER``, which would turn a run's graphs off).

On 0.17.0 the backend is the V1 path's own (``backend_for`` returns it unchanged where
its interface fits), so 0.17.0's MRv2 runs are what they were.
"""
from __future__ import annotations

import inspect
from typing import Any

_BUILT: dict = {}


def backend_for(backend):
    """``backend`` (the toy backend class), or a subclass that answers the installed
    release's interface where it changed."""
    if backend in _BUILT:
        return _BUILT[backend]
    from vllm.v1.attention.backend import AttentionBackend, AttentionMetadataBuilder
    base = inspect.signature(AttentionBackend.get_supported_kernel_block_sizes)
    if not base.parameters:  # the toy's own interface (0.17.0)
        _BUILT[backend] = backend
        return backend
    toy_builder = backend.get_builder_cls()

    class Builder(AttentionMetadataBuilder):
        _cudagraph_support = toy_builder._cudagraph_support

        def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
            AttentionMetadataBuilder.__init__(self, kv_cache_spec, layer_names,
                                              vllm_config, device)
            spec = vllm_config.speculative_config
            self.num_spec = spec.num_speculative_tokens if spec else 0
            self.use_spec_decode = self.num_spec > 0

        def build(self, common_prefix_len, common_attn_metadata, *args: Any,
                  **kwargs: Any):
            return toy_builder.build(self, common_prefix_len, common_attn_metadata)

        def build_for_cudagraph_capture(self, common_attn_metadata):
            return self.build(0, common_attn_metadata)

    class Backend(backend):
        @staticmethod
        def get_builder_cls():
            return Builder

        @staticmethod
        def get_supported_kernel_block_sizes(spec=None):
            return [16]

    Backend.__name__ = Backend.__qualname__ = backend.__name__ + "V2"
    _BUILT[backend] = Backend
    return Backend
