"""The sglang census's table: which of a release's folders a single-node server runs
(``AREAS``, relative to the package) and the rules that name why a site did not run
(``RULES``: the first that matches wins; ``targets.coverage`` applies them).

A rule is (category, field, pattern): ``path`` is the file relative to the package,
``function`` the qualified function, ``guard`` one enclosing if-test (``not (T)`` in an
else branch), ``text`` the call as written. Patterns are regular expressions searched
in the field. Hardware comes first (an NPU branch of a transfer engine is still NPU),
then the multi-node transfer engines and remote KV stores, then the configurations the
scenarios do not set up; a site no rule names is "not reached by any scenario".
"""
from __future__ import annotations

from targets.census_rules import CONFIG, HARDWARE, MULTI_NODE

PACKAGE = "sglang"
AREAS = ("srt/managers", "srt/speculative", "srt/model_executor", "srt/mem_cache",
         "srt/sampling", "srt/constrained", "srt/disaggregation", "srt/layers/attention",
         "srt/layers/sampler.py")
PINNED_FACTORIES: tuple = ()

# device tokens other than CUDA, as sglang spells its platform checks and backends
_OTHER_HW = r"(npu|hip|rocm|xpu|hpu|musa|mlu|mps|aiter|ascend|amx|cpu_graph)"

RULES = (
    (HARDWARE, "path", rf"(^|/|_){_OTHER_HW}(_|/|\.py$)|/(wave_backend|wave_ops|"
                       r"intel_amx_backend|mindspore_runner)"),
    (HARDWARE, "guard", r"^(?!not \().*\b_?(is|use)_(npu|hip|xpu|hpu|musa|mlu|cpu|mps|"
                        r"aiter|intel_amx)\b(?!.*cuda)"),
    (HARDWARE, "guard", r"^not \(.*\b_?is_cuda(_alike)?\b"),
    (HARDWARE, "function", r"(^|[._])(forward|init|run)_(npu|hip|xpu|hpu|musa|cpu)(\b|_)"),
    (HARDWARE, "text", r"\btorch\.(npu|xpu|hpu|musa|mlu)\b|torch_npu"),
    (MULTI_NODE, "path", r"^srt/disaggregation/(ascend|base|common|fake|mooncake|mori|"
                         r"nixl|encoder)/|^srt/mem_cache/storage/"),
    (MULTI_NODE, "path", r"(mooncake|nixl|mori|transfer_engine|rdma|deepep)"),
    (MULTI_NODE, "function", r"(mooncake|nixl|transfer_engine|rdma|deepep)"),
    (CONFIG, "path", r"^srt/disaggregation/"),  # the PD scheduler mixins: no PD scenario
    (CONFIG, "path", r"(hicache|hiradix|hisparse|host|offload|l2_transfer|storage_prefetch|"
                     r"lora|multimodal|embedding|mm_|encoder|pp_|pipeline|eplb|expert|"
                     r"dllm|diffusion|piecewise|breakable|compile|tbo|two_batch|mamba|"
                     r"hybrid_linear|linear/|nsa|dsa|sparse|qsa|deepseek_v4|dsv4|minimax|"
                     r"llada|vision|dflash|uno|frozen_kv|multi_layer|domino|lilicorr|"
                     r"elastic|weight|profil|debug|dump|canary)"),
    (CONFIG, "function", r"(hicache|hiradix|host_|offload|lora|multimodal|mm_|pp_|"
                         r"pipeline|eplb|expert|dllm|piecewise|breakable|compile|tbo|"
                         r"two_batch|mamba|weight|profil|debug|dump)"),
)
