"""Upstream's ``ModelRunner``, built from ``__new__`` plus upstream's own init steps.

``ModelRunner.__init__`` sets the process up for a server (distributed groups, the
checkpoint loader, the memory profiler) before it builds anything a forward uses; on the
simulator none of that exists. So, as sglang's own forks that "build bespoke memory
pools" do (``_init_post_memory_pool_components``' docstring): the attributes ``__init__``
sets, the one-rank groups (``ranks``), the target's pools (upstream's ``ReqToTokenPool``
/ ``TokenToKVPoolAllocator``, and upstream's ``MHATokenToKVPool`` for the stand-in's one
attention layer), the stand-in model where ``load_model`` would put the checkpoint's
(``load_model`` itself is not run: it sizes GPU memory and loads weights), then
upstream's steps unchanged: ``resolve_layer_indices``, ``init_token_oracle``,
``_init_post_memory_pool_components`` (the KV index translator, ...),
``init_attention_backends`` (``torch_native`` with the verify stand-in: ``attention``)
and ``init_cuda_graphs`` (the eager runner, and where graphs are on upstream's
``DecodeCudaGraphRunner`` capturing every bucket: ``graphs``).
"""
from __future__ import annotations

import functools
import inspect
import types
from typing import Optional

import torch

from targets.sglang.boundary import contract, upstream
from targets.sglang.runner import attention, graphs, ranks
from targets.sglang.runner.model import ARCHITECTURE, StandInCausalLM


def modules():
    """Upstream's modules this room drives (imported with the machine's flags before a run
    masks them: ``platform.as_without_gpu``)."""
    from targets.sglang.boundary import upstream
    return upstream.import_named({
        "model_runner": "sglang.srt.model_executor.model_runner",
        "memory_pool": "sglang.srt.mem_cache.memory_pool",
        "rc": "sglang.srt.runtime_context",
        "spec_info": "sglang.srt.speculative.spec_info",
        "model_config": "sglang.srt.configs.model_config",
    })


def kv_pool(toy, size: int, device):
    """Upstream's KV pool for the stand-in's one layer (one head of the toy's width)."""
    m = modules()["memory_pool"]
    pool = m.MHATokenToKVPool(size=size, page_size=1, dtype=toy.embed.dtype, head_num=1,
                              head_dim=toy.embed.shape[1], layer_num=1, device=str(device),
                              enable_memory_saver=False)
    if pool.alt_stream is None and torch.device(device).type != "cpu":
        # the pool takes its side stream for the V write inside a graph capture on CUDA
        # (``_is_cuda``); the simulator stands for that GPU, so the pool has it here too
        pool.alt_stream = pool.device_module.Stream()
    return pool


def fits(root: Optional[str] = None) -> bool:
    """Does the release at ``root`` (default: the installed one) have the model runner
    and everything this room calls of it (``contract.FEATURES`` /
    ``DRIVER_NEEDS["model_runner"]``, read from its source)? Where not, the NGRAM
    worker's target forward stays the toy model's."""
    from targets import static
    root = root or static.package_root("sglang")
    return bool(root) and _fits(root)


@functools.lru_cache(maxsize=None)
def _fits(root: str) -> bool:  # a static read of the source: once per release
    return contract.missing_code(root, "model_runner") is None \
        and contract.undriven(root, "model_runner") is None


def ngram_model_runner(args, device, toy, pools):
    """The NGRAM worker's target runner: upstream's ``ModelRunner`` where the release
    fits (its server config made current for the run: ``kv_lifecycle.server_context``)
    and the pools are upstream's classes in the full layout (the runner's forward and
    its KV pool address upstream's ``req_to_token`` rows and allocator's slots, whoever
    writes them: upstream's lifecycle functions or, on releases before their 0.5.22
    shapes, specrace's), else None."""
    if (pools.origin != "upstream" or args.kv_layout == "swa"
            or args.spec_algorithm != "ngram" or not fits()):
        return None
    graphs.as_a_new_process()  # the engine's runners start from none of another's
    graph_config(args.cuda_graph_max_bs if args.cuda_graph else 0)
    # a server serving hidden states captures its graphs with them (the capture mode
    # upstream's runner checks every replay against), read from the context's projection
    # or -- 0.5.16-0.5.17 -- from the server's args themselves
    _server_config(enable_return_hidden_states=bool(args.return_hidden_states))
    return build_model_runner(toy, pools, device, max_running_requests=args.req_pool_size)


def graph_config(max_bs: int) -> None:
    """The run's decode graphs as ``--cuda-graph-config`` would give them: captured up
    to ``max_bs`` requests (0: disabled); no prefill graph (the toy's prefill forwards
    one token per request, nothing a prefill graph would hold). Set on the run's
    runtime context, which the server config made for this run alone."""
    from sglang.srt.model_executor.cuda_graph_config import (Backend, CudaGraphConfig,
                                                             PhaseConfig)
    decode = PhaseConfig(backend=Backend.DISABLED)
    if max_bs:
        # the buckets as a server given ``--cuda-graph-config '{"decode": {"bs": [1, 2,
        # 4, ...]}}'`` captures them: powers of two up to the bound (upstream's default
        # list captures every size up to 8; each capture is a cost every trial pays, and
        # a batch between two buckets replays padded, which drives the padding too)
        buckets = sorted({1 << k for k in range(max_bs.bit_length())} | {max_bs})
        decode = PhaseConfig(backend=Backend.FULL, max_bs=max_bs, bs=buckets)
    _server_config(
        cuda_graph_config=CudaGraphConfig(decode=decode,
                                          prefill=PhaseConfig(backend=Backend.DISABLED)))


def _server_config(**fields) -> None:
    """Set on the run's config where a resolved server keeps it: the server's args (what
    0.5.16-0.5.18's runners read) and, where the context projects them (``override``:
    later releases' runners read the projection), the context."""
    rc = modules()["rc"]
    args = upstream.current_server_args()
    for name, value in fields.items():
        setattr(args, name, value)
    ctx = rc.get_context()
    if hasattr(ctx, "override"):
        ctx.override("specrace.runner", **fields)


def build_model_runner(toy, pools, device, *, max_running_requests: int,
                       draft: bool = False):
    """Upstream's ``ModelRunner`` over ``pools`` (``Pools``) with the stand-in model."""
    m = modules()
    MR = m["model_runner"].ModelRunner
    mr = MR.__new__(MR)
    _set_init_attributes(mr, m, toy, device, draft)
    mr.model = StandInCausalLM(toy)
    mr.req_to_token_pool = pools.req_to_token_pool
    mr.token_to_kv_pool_allocator = pools.allocator
    mr.token_to_kv_pool = kv_pool(toy, pools.allocator.size + 1, device)
    mr.max_total_num_tokens = pools.allocator.size
    mr.max_running_requests = max_running_requests
    # upstream's init steps (contract.MODEL_RUNNER_INIT_STEPS), in ``__init__``'s order
    mr.init_spec_aux_hidden_state()
    # as initialize() does, with what the release's signature takes of these (before
    # 0.5.21 the spec algorithm, then the draft model's index)
    resolve = m["model_runner"].resolve_layer_indices
    known = dict(model=mr.model, model_config=mr.model_config, is_draft_worker=draft,
                 draft_model_idx=None, spec_algorithm=mr.spec_algorithm)
    mr.layer_info = resolve(**{k: v for k, v in known.items()
                               if k in inspect.signature(resolve).parameters})
    mr.init_token_oracle()
    mr._init_post_memory_pool_components()
    with attention.registered():
        mr.init_attention_backends()
    with graphs.capturing_on(device):
        mr.init_cuda_graphs()
    # the server serves once its start-up is done on the device (the worker's warm-up
    # and memory profiling wait for it): the buffers built above are complete before
    # the first forward reads them on the forward stream
    torch.get_device_module(torch.device(device)).synchronize()
    return mr


def _set_init_attributes(mr, m, toy, device, draft) -> None:
    """What ``ModelRunner.__init__`` sets before ``initialize()``, as a single-rank
    generation server without LoRA, MoE, hisparse or elastic EP has them."""
    mr.server_args = upstream.current_server_args()
    mr.mem_fraction_static = 0.0
    mr.memory_pool_config = None
    # upstream's runner holds the device's type (``server_args.device``, "cuda") and its
    # index apart (``gpu_id``): its helpers branch on the type alone
    # (``get_available_gpu_memory`` rejects "cuda:0")
    mr.gpu_id = torch.device(device).index or 0
    mr.model_config = _model_config(toy, draft)
    mr.is_draft_worker = draft
    mr.lora_manager = None
    resolve = getattr(m["model_runner"], "resolve_draft_attention_backend", None)
    if resolve is not None:  # 0.5.16-0.5.17's runner has no draft backend of its own
        mr.draft_attention_backend = upstream.with_server_args(
            resolve, draft_attention_backend=None, is_draft_worker=draft)
    mr.device = torch.device(device).type
    mr.is_generation = True
    mr.device_timer = None
    mr.is_multimodal = False
    mr.spec_algorithm = m["spec_info"].SpeculativeAlgorithm.from_string(
        mr.server_args.speculative_algorithm)
    mr.capture_tail_hooks, mr.capture_head_hooks = [], []
    # the args the context projects (0.5.16 has no get_spec / get_schedule to read)
    mr.page_size = mr.server_args.page_size
    mr.mtp_draft_device_pools = mr.mtp_draft_mamba_pools = ()
    mr.is_hybrid_swa = mr.is_hybrid_swa_compress = False
    mr.use_mla_backend = False
    mr.attention_chunk_size = None
    mr.enable_elastic_ep = False
    mr.forward_pass_id = 0
    mr._pending_elastic_scale_update = None
    mr.init_new_workspace = False
    mr.draft_model_idx = None
    mr.enable_hisparse = False
    mr._sampling_observer = None
    mr.forward_stream = torch.get_device_module(torch.device(device)).Stream()
    mr.shared_read_done_event = None
    # what 0.5.16-0.5.17's __init__ keeps on the runner itself (later: the context's, and
    # the event renamed shared_read_done_event): a one-rank server's DCP placement
    sets = type(mr).__init__.__code__.co_names
    if "dcp_size" in sets:
        mr.dcp_size, mr.dcp_rank = mr.server_args.dcp_size, 0
    if "war_fastpath_read_done_event" in sets:
        mr.war_fastpath_read_done_event = None
    mr.hisparse_coordinator = None
    mr.startup_weight_load = None
    mr.support_pp = False
    mr.msprobe_debugger = None
    mr.eplb_manager = None
    mr.canary_manager = None
    ps = ranks.parallel_state()  # the placement __init__ is handed, where it is
    if ps is not None:
        mr.ps = ps
    ranks.publish(device)  # init_torch_distributed's groups, for one rank
    _placement(mr, m["rc"].get_parallel())


# What ``init_torch_distributed`` keeps on the runner of the placement it takes from the
# context: the pipeline group (every release), and before 0.5.22 -- where the forward
# reads them off the runner (``model_runner.attn_dcp_size``) -- the groups, ranks and
# widths too. Set on every release: an attribute a release never reads is inert.
PLACEMENT = ("pp_group", "tp_group", "tp_rank", "tp_size", "dp_size", "attn_dp_size",
             "pp_rank", "pp_size", "attn_cp_rank", "attn_cp_size", "attn_dcp_rank",
             "attn_dcp_size", "moe_ep_size", "dp_rank")


def _placement(mr, parallel) -> None:
    # where the runner is handed a ``ParallelState`` (``ranks.parallel_state``), its
    # ranks and widths are that's; the groups are the getters' (the context's)
    ps = getattr(mr, "ps", None)
    for name in PLACEMENT:
        setattr(mr, name, getattr(ps, name) if hasattr(ps, name) else getattr(parallel, name))
    mr.attention_tp_group = parallel.tp_group  # one rank: attention TP is all of TP


class HFConfig(types.SimpleNamespace):
    """The fields of a Hugging Face config that upstream's runner code looks up (a toy
    decoder: none of the multimodal or rope-scaling ones)."""

    def __init__(self) -> None:
        super().__init__(architectures=[ARCHITECTURE], dtype=None, language_config=None,
                         llm_config=None, model_type="specrace-toy", rope_scaling=None,
                         text_config=None, thinker_config=None, vision_config=None)

    def get_text_config(self):
        return self


def _model_config(toy, draft: bool):
    """The model's config as ``ModelConfig`` reads a checkpoint's: what the runner and
    its backends read of it (one attention layer, one head of the toy's width)."""
    H = toy.embed.shape[1]
    hf = HFConfig()
    return types.SimpleNamespace(
        hf_config=hf, hf_text_config=hf, vocab_size=toy.vocab_size, hidden_size=H,
        spec_hidden_size=H, dtype=toy.embed.dtype, is_draft_model=draft,
        is_generation=True, is_multimodal=False, is_encoder_decoder=False,
        model_is_mrope=False, num_hidden_layers=1, num_attention_heads=1,
        num_key_value_heads=1, head_dim=H, context_len=1 << 20,
        attention_arch=modules()["model_config"].AttentionArch.MHA,
        is_hybrid_swa=False, is_hybrid_swa_compress=False, attention_chunk_size=None,
        linear_attn_registry_result=None, requires_mm_token_modalities=None,
        use_ngram_embedding=False, ngram_embedding_n=0, use_engram=False,
        num_nextn_predict_layers=None, num_attention_layers=1, hc_hidden_size=None,
        swa_attention_layer_ids=None, full_attention_layer_ids=None, quantization=None)
