"""The sglang census's table: which of a release's folders a single-node server runs
(``AREAS``, relative to the package) and the rules that name why a site did not run
(``RULES``: the first that matches wins; ``targets.coverage`` applies them).

A rule is (category, field, pattern, words): ``path`` is the file relative to the
package, ``function`` the qualified function, ``guard`` one enclosing if-test (``not
(T)`` in an else branch), ``text`` the call as written. Patterns are regular expressions
searched in the field. Hardware comes first (an NPU branch of a transfer engine is still
NPU), then the multi-node transfer engines and remote KV stores, then the configurations
the scenarios do not set up, each rule saying in words which one (``specrace coverage``
lists them beside the site). Last come rules of the category "not reached by any
scenario" that only say *why*: code of a configuration specrace drives, where its own
piece runs instead of upstream's (the toy prefill's staging, the slices' toy workers) --
honest words for a gap, never a reason that moves a site out of the headline. A site no
rule names is "not reached by any scenario", without words: nobody knows yet. The
configuration words were read off 0.5.23's source (2026-12-08).
"""
from __future__ import annotations

from typing import Tuple

from targets.census_rules import CONFIG, HARDWARE, MULTI_NODE, NOT_REACHED, Rule, rules

PACKAGE = "sglang"
AREAS = ("srt/managers", "srt/speculative", "srt/model_executor", "srt/mem_cache",
         "srt/sampling", "srt/constrained", "srt/disaggregation", "srt/layers/attention",
         "srt/layers/sampler.py")
PINNED_FACTORIES: tuple = ()

# device tokens other than CUDA, as sglang spells its platform checks and backends
_OTHER_HW = r"(npu|hip|rocm|xpu|hpu|musa|mlu|mps|aiter|ascend|amx|cpu_graph)"

_SEVERAL_GPUS = "several GPUs: "
_STAND_IN = "specrace's own piece runs here instead of upstream's: "

RULES: Tuple[Rule, ...] = (
    (HARDWARE, "path", rf"(^|/|_){_OTHER_HW}(_|/|\.py$)|/(wave_backend|wave_ops|"
                       r"intel_amx_backend|mindspore_runner)",
     "another platform's backend (NPU, ROCm/HIP, XPU, HPU, MUSA, MLU, MPS, AMX)"),
    *rules(HARDWARE, "another platform's branch",
           ("guard", r"^(?!not \().*\b_?(is|use)_(npu|hip|xpu|hpu|musa|mlu|cpu|mps|"
                     r"aiter|intel_amx)\b(?!.*cuda)"),
           ("guard", r"^not \(.*\b_?is_cuda(_alike)?\b"),
           ("function", r"(^|[._])(forward|init|run)_(npu|hip|xpu|hpu|musa|cpu)(\b|_)"),
           ("text", r"\btorch\.(npu|xpu|hpu|musa|mlu)\b|torch_npu"),
           ("function", r"hccl")),  # Ascend's collectives
    (MULTI_NODE, "path", r"^srt/disaggregation/(ascend|base|common|fake|mooncake|mori|"
                         r"nixl|encoder)/|^srt/mem_cache/storage/",
     "PD transfer engines and remote KV stores"),
    *rules(MULTI_NODE, "a transfer engine (Mooncake, NIXL, MORI, RDMA, DeepEP)",
           ("path", r"(mooncake|nixl|mori|transfer_engine|rdma|deepep)"),
           ("function", r"(mooncake|nixl|transfer_engine|rdma|deepep)")),
    # the PD scheduler mixins: no scenario is a PD server
    (CONFIG, "path", r"^srt/disaggregation/", "PD disaggregation (--disaggregation-mode)"),
    # a retracted request's KV copied to the host and back: only a PD decode server
    # backs retractions up (schedule_batch.release_req -> backup_kv_cache)
    (CONFIG, "function", r"(cpu_copy|cpu_slots|\.backup_kv_cache|\.restore_kv_cache)$",
     "PD decode's retraction backup (--disaggregation-mode decode)"),
    *rules(CONFIG, "HiCache, HiSparse and host / offloaded KV (--enable-hierarchical-cache)",
           ("path", r"(hicache|hiradix|hisparse|host|offload|l2_transfer|storage_prefetch|"
                    r"cache_controller)"),
           ("function", r"(hicache|hiradix|host_|offload|UnifiedRadixCache\.(writing_check|"
                        r"loading_check|_count_ready_acks|is_load_back_event_done))")),
    *rules(CONFIG, "LoRA adapters", ("path", r"lora"), ("function", r"lora")),
    *rules(CONFIG, "multimodal, encoder-decoder and embedding models",
           ("path", r"(multimodal|embedding|mm_|encoder|vision)"),
           ("function", r"(multimodal|mm_|encoder|mrope|modalities|non_generation|"
                        r"EmbeddingBatchResult)"),
           ("guard", r"(not \(self\.is_generation\)|input_embeds|replace_embeds|"
                     r"vision_position_ids|visible_frame_counts)")),
    *rules(CONFIG, _SEVERAL_GPUS + "pipeline parallel",
           ("path", r"(pp_|pipeline)"), ("function", r"(pp_|pipeline)")),
    *rules(CONFIG, _SEVERAL_GPUS + "expert parallel, EPLB and elastic EP",
           ("path", r"(eplb|expert|elastic)"),
           ("function", r"(eplb|expert|elastic|ep_ranks)")),
    *rules(CONFIG, _SEVERAL_GPUS + "data parallel (the DP controller, DP attention's "
                   "token-count sync)",
           ("path", r"data_parallel_controller"),
           ("function", r"(mlp_sync|num_token_non_padded)")),
   *rules(CONFIG, "diffusion LLMs (dLLM)",
           ("path", r"(dllm|diffusion|llada)"), ("function", r"dllm"),
           ("guard", r"dllm")),
   *rules(CONFIG, "piecewise / breakable CUDA graphs, torch.compile, two-batch overlap",
           ("path", r"(piecewise|breakable|compile|tbo|two_batch|cuda_graph_dedup_mixin)"),
           ("function", r"(piecewise|breakable|compile|tbo|two_batch)")),
   *rules(CONFIG, "hybrid models (Mamba / linear attention)",
           ("path", r"(mamba|hybrid_linear|linear/)"), ("function", r"mamba"),
           ("guard", r"mamba")),
   (CONFIG, "path", r"(nsa|dsa|sparse|qsa|deepseek_v4|dsv4|minimax|index_key)",
    "sparse attention (NSA / DSA / QSA) and model-specific pools (DeepSeek V4, MiniMax)"),
   (CONFIG, "path", r"(dflash|uno|frozen_kv|multi_layer|domino|lilicorr)",
    "speculative algorithms no scenario runs (DFlash, UNO, frozen-KV MTP, multi-layer "
    "EAGLE)"),
   *rules(CONFIG, "weight updates, profiling and debugging",
           ("path", r"(weight|profil|debug|dump|canary)"),
           ("function", r"(weight|profil|debug|dump)")),
   (CONFIG, "function", r"TokenToKVPool(FP4|MXFP8)\.",
    "an FP4 / MXFP8 KV cache (--kv-cache-dtype)"),
   *rules(CONFIG, "the unified memory pool (--enable-unified-memory)",
           ("path", r"(unified_sub_pool|unified_cache/)"),
           ("guard", r"enable_unified_memory")),
   (CONFIG, "path", r"page_interleave", "logical-page KV sharding (page interleave)"),
   (CONFIG, "path", r"row_bucket_graph_runner",
    "DeepSeek V4's replay tail (row-bucket graphs)"),
   *rules(CONFIG, "the decode graph runner's metadata glue graph and early / forked "
                   "metadata prep (SGLANG_ENABLE_METADATA_GLUE_GRAPH; DeepSeek V4.1 and "
                   "DSpark switches)",
           ("path", r"(metadata_glue_graph|early_verify_metadata|forked_metadata_prep)"),
           ("function", r"in_graph_metadata_prep"), ("guard", r"metadata_glue")),
   (CONFIG, "function", r"(graph_pool_borrow|borrow_graph_pool|_teardown_borrow_pool)",
    "graph memory-pool borrowing (SGLANG_ENABLE_GRAPH_POOL_BORROW)"),
   (CONFIG, "path", r"prefill_cuda_graph_runner",
    "prefill CUDA graphs (--cuda-graph-backend-prefill; the target captures decode "
    "graphs only)"),
   (CONFIG, "path", r"async_d2h_copy_worker",
    "NVIDIA Confidential Computing (the result copy on a worker thread)"),
   (CONFIG, "path", r"(llguidance|outlines)_backend",
    "grammar backends other than xgrammar (--grammar-backend)"),
   (CONFIG, "path", r"^srt/layers/attention/|flashinfer",
    "upstream's attention backends (the target's attention is a toy backend: their "
    "metadata and plan code needs the kernels they plan for)"),
   (CONFIG, "guard", r"return_logprob|extend_input_logprob",
    "logprobs requests (return_logprob)"),
   (CONFIG, "guard", r"not \(alloc_page_size == 1\)", "--page-size > 1"),
   (CONFIG, "function", r"_execute_extend_cp", _SEVERAL_GPUS + "context parallel"),
   # configurations specrace drives, where its own piece runs instead of upstream's
   (NOT_REACHED, "function", r"ScheduleBatch\.prepare_for_extend$",
    _STAND_IN + "the prefill's staging (the toy prefill forwards one token a request: "
                "targets/sglang/engine/loop.py new_prefill_batch)"),
   (NOT_REACHED, "path", r"^srt/speculative/dspark_components/",
    _STAND_IN + "DSpark's worker (targets/sglang/slices/dspark.py)"),
   (NOT_REACHED, "path", r"^srt/speculative/(ngram_worker|eagle_draft_cuda_graph_runner|"
                         r"eagle_draft_extend_cuda_graph_runner)\.py$",
    _STAND_IN + "the NGRAM worker and EAGLE's draft graph runners (toy workers and "
                "runners)"),
   (NOT_REACHED, "function", r"Scheduler\.(init_overlap|init_model_worker)$|"
                             r"^allocate_distinct_stream$|^ModelRunner\.__init__$",
    _STAND_IN + "the scheduler's and runner's construction (streams and workers built "
                "as upstream's init builds them: engine/scheduler_object.py, "
                "runner/build.py)"),
   (NOT_REACHED, "function", r"resolve_mixed_spec_tails|^resolve_forward_inputs$",
    "mixed chunks (--enable-mixed-chunk): the toy scheduler never batches a chunk with "
    "decodes"),
   (NOT_REACHED, "function", r"launch_batch_sample_if_needed",
    "decoding without speculative decoding: every scenario runs a speculative "
    "algorithm"),
)
