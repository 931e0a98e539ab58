"""The vLLM census's table: which of a release's folders a single-node server runs
(``AREAS``: the V1 runner and Model Runner V2 under ``v1/worker``, the proposers, the
structured outputs, the KV cache manager and block tables, the sampler, the attention
backends' metadata builders, the async output classes) and the rules that name why a
site did not run (``RULES``, as ``targets/sglang/environments/census.py`` describes).
``PINNED_FACTORIES``: calls that return a pinned host/device buffer pair (the runner's
``CpuGpuBuffer`` and its ``_make_buffer``), so writes through ``.np`` / ``.cpu`` count.
"""
from __future__ import annotations

from targets.census_rules import CONFIG, HARDWARE, MULTI_NODE

PACKAGE = "vllm"
AREAS = ("v1/worker", "v1/spec_decode", "v1/structured_output", "v1/core", "v1/sample",
         "v1/attention/backends", "v1/outputs.py", "v1/engine/core.py", "v1/utils.py")
PINNED_FACTORIES = ("CpuGpuBuffer", "_make_buffer", "UvaBuffer", "UvaBufferPool",
                    "StagedWriteTensor")

_OTHER_HW = r"(tpu|xpu|cpu|hpu|npu|rocm|aiter|hip|neuron|mps|xla)"

RULES = (
    (HARDWARE, "path", rf"(^|/|_){_OTHER_HW}(_|/|\.py$)"),
    (HARDWARE, "guard", r"^(?!not \().*\b(current_platform\.)?is_(rocm|tpu|xpu|cpu|hpu|"
                        r"neuron)\(\)(?!.*cuda)"),
    (HARDWARE, "guard", r"^not \(.*\bis_cuda(_alike)?\(\)"),
    (HARDWARE, "text", r"\btorch\.(npu|xpu|hpu|xla)\b"),
    (MULTI_NODE, "path", r"(kv_connector|kv_transfer|nixl|mooncake|lmcache|p2p|"
                         r"ec_connector)"),
    (MULTI_NODE, "function", r"(kv_connector|kv_transfer|nixl|ec_connector)"),
    (CONFIG, "path", r"(ubatch|dp_utils|lora|mamba|linear_attn|gdn|short_conv|pooling|encoder|multimodal|"
                     r"mm_|medusa|suffix|draft_model|dflash|eplb|cudagraph_utils|"
                     r"kv_offload|offload|sparse|mla/|flashinfer|flex|tree|triton_attn|"
                     r"rocm|aiter|xformers)"),
    (CONFIG, "function", r"(lora|mamba|pooling|encoder|mm_|eplb|offload|profil|dummy_run|"
                         r"capture_model|_dummy)"),
)
