"""The vLLM census's table: which of a release's folders a single-node server runs
(``AREAS``: the V1 runner and Model Runner V2 under ``v1/worker``, the proposers, the
structured outputs, the KV cache manager and block tables, the sampler, the attention
backends' metadata builders, the async output classes) and the rules that name why a
site did not run (``RULES``, as ``targets/sglang/environments/census.py`` describes).
``PINNED_FACTORIES``: calls that return a pinned host/device buffer pair (the runner's
``CpuGpuBuffer`` and its ``_make_buffer``), so writes through ``.np`` / ``.cpu`` count.
"""
from __future__ import annotations

from typing import Tuple

from targets.census_rules import CONFIG, HARDWARE, MULTI_NODE, Rule, rules

PACKAGE = "vllm"
AREAS = ("v1/worker", "v1/spec_decode", "v1/structured_output", "v1/core", "v1/sample",
         "v1/attention/backends", "v1/outputs.py", "v1/engine/core.py", "v1/utils.py")
PINNED_FACTORIES = ("CpuGpuBuffer", "_make_buffer", "UvaBuffer", "UvaBufferPool",
                    "StagedWriteTensor")

_OTHER_HW = r"(tpu|xpu|cpu|hpu|npu|rocm|aiter|hip|neuron|mps|xla)"

# Each rule: (category, what it reads, pattern, its own words). The words say which
# configuration or hardware a site needs -- what `specrace coverage` lists beside a site
# no scenario ran (checked against vLLM 0.17.0's and 0.34.0's unrun sites, 2026-12-07).
# CONFIG sites stay in the headline's denominator: a single-node server with that
# configuration runs them; only the HARDWARE and MULTI_NODE ones leave it.
_SEVERAL_GPUS = "several GPUs: "
# Model Runner V2's full decode graphs run (targets/vllm/engine/graphs.py); what is left
# is graphs elsewhere
_HYBRID = "hybrid (Mamba / linear-attention / GDN) models' attention metadata"
_MULTIMODAL = "pooling models, encoders and multimodal inputs"
_GRAPHS = ("CUDA graphs the target does not capture (the V1 runner runs eager; hybrid "
           "builders' graph buffers, encoder graphs, graph memory profiling)")


RULES: Tuple[Rule, ...] = (
    (HARDWARE, "path", rf"(^|/|_){_OTHER_HW}(_|/|\.py$)", "another platform's backend"),
    *rules(HARDWARE, "another platform's branch",
           ("guard", r"^(?!not \().*\b(current_platform\.)?is_(rocm|tpu|xpu|cpu|hpu|"
                     r"neuron)\(\)(?!.*cuda)"),
           ("guard", r"^not \(.*\bis_cuda(_alike)?\(\)")),
    (HARDWARE, "text", r"\btorch\.(npu|xpu|hpu|xla)\b", "another platform's device module"),
    *rules(MULTI_NODE, "KV / encoder-cache transfer connectors",
           ("path", r"(kv_connector|kv_transfer|nixl|mooncake|lmcache|p2p|ec_connector)"),
           ("function", r"(kv_connector|kv_transfer|nixl|ec_connector)")),
    (CONFIG, "path", r"(ubatch|dp_utils)", _SEVERAL_GPUS + "data parallel and dual-batch "
                                             "overlap (micro-batching)"),
    *rules(CONFIG, _SEVERAL_GPUS + "pipeline parallel",
           ("path", r"pp_utils"), ("function", r"intermediate_tensors")),
    (CONFIG, "guard", r"\b(dcp|total_cp|pcp)_world_size\b", _SEVERAL_GPUS + "context parallel"),
    (CONFIG, "text", r"_has_fault_gpu|all2all", _SEVERAL_GPUS + "expert parallel"),
    (CONFIG, "path", r"(eplb|sentinel)", _SEVERAL_GPUS + "expert load balancing, the "
                                         "elastic worker sentinel"),
    (CONFIG, "function", r"eplb", _SEVERAL_GPUS + "expert load balancing"),
    # before the model kinds': a hybrid builder's padding for full graphs is a graph site
    *rules(CONFIG, _GRAPHS, ("path", r"cudagraph"), ("guard", r"(cuda_?graph)"),
           ("function", r"(cudagraph|capture)")),
    *rules(CONFIG, _HYBRID, ("path", r"(mamba|linear_attn|gdn|short_conv)"),
           ("function", r"(mamba|causal_conv1d)")),
    (CONFIG, "path", r"(sparse|mla/|flashinfer|flex|tree|triton_attn|xformers|hpc_attn|"
                     r"flash_attn\.py)",
     "upstream's attention backends (the target's attention is a toy backend: their "
     "metadata builders need the compiled kernels they plan for)"),
    (CONFIG, "function", r"(local_attention|kv_sharing)",
     "model-specific attention (chunked local attention, KV sharing)"),
    *rules(CONFIG, _MULTIMODAL, ("path", r"(pooling|encoder|multimodal|mm_|mm/|mrope)"),
           ("function", r"(pool(ing|er)|encoder|mm_|mrope|xdrope)"),
           ("guard", r"(supports_mm_inputs|uses_mrope|uses_xdrope|is_mm_prefix_lm|"
                     r"mm_ranges|inputs_embeds|actual_num_sched)")),
    *rules(CONFIG, "LoRA adapters", ("path", r"lora"), ("function", r"lora")),
    (CONFIG, "path", r"(medusa|suffix|draft_model|dflash)",
     "the Medusa, suffix, draft-model (MRv2) and DFlash proposers"),
    (CONFIG, "path", r"adaptive_verification", "MRv2's adaptive verification (opt-in: "
                                               "enable_adaptive_verification)"),
    (CONFIG, "path", r"trace_replay", "MRv2's sampler trace replay (opt-in)"),
    (CONFIG, "function", r"StepTimingCollector", "MRv2's step timing (collected only when asked)"),
    *rules(CONFIG, "KV offloading", ("path", r"(kv_offload|offload)"),
           ("function", r"offload")),
    (CONFIG, "function", r"(warmup|profil|dummy_run|_dummy|timed_)",
     "start-up: warm-up, profiling and dummy runs (the target starts with a fixed KV "
     "budget, no warm-up)"),
    (CONFIG, "function", r"(logprobs|LogprobsTensors)", "logprobs and prompt logprobs requests"),
    (CONFIG, "function", r"SamplingMaskTensors",
     "MRv2's returned sampling masks (opt-in: return_sampling_mask)"),
    (CONFIG, "function", r"(MinP|MinTokens)", "min-p and min-tokens sampling"),
    (CONFIG, "path", r"backend_(outlines|lm_format_enforcer|guidance)",
     "structured-output backends other than the target's toy grammar"),
    (CONFIG, "function", r"maybe_randomize_inputs",
     "VLLM_RANDOMIZE_DP_DUMMY_INPUTS (a debugging switch)"),
    (CONFIG, "function", r"NonUvaBuffer", "platforms without UVA (the target maps UVA)"),
    (CONFIG, "function", r"SpecDecodeBaseProposer\.prepare_inputs$",
     "disable_padded_drafter_batch (refused with async scheduling)"),
)
