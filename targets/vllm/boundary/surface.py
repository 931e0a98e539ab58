"""What the vLLM target drives of a release, path by path, as its contract proves it
from the release's source (``targets.driven``: every driven module exists and parses,
every driven name has its kind and parameters) before any trial.

Three paths: the engine's side both runners share (upstream's ``EngineCore``, its
``AsyncScheduler`` / ``Scheduler`` and the executor and worker it builds), then the V1
model runner (``V1``) or Model Runner V2 driven whole (``MRV2``), and the slices
(``SLICE``: one piece of upstream's code under a loop of specrace's).
"""
from __future__ import annotations

from typing import Dict, Tuple

from targets import driven
from targets.vllm.mrv2 import table as mrv2_table

_RUNNER = "vllm.v1.worker.gpu_model_runner"
_CORE = "vllm.v1.engine.core"

# The modules whose files the target drives (the report's digest covers them).
DRIVEN_MODULES = (
    _CORE, "vllm.v1.core.sched.async_scheduler", "vllm.v1.core.sched.scheduler",
    "vllm.v1.executor.uniproc_executor", "vllm.v1.worker.gpu_worker", _RUNNER,
    "vllm.v1.worker.gpu_input_batch", "vllm.v1.worker.block_table", "vllm.v1.utils",
    "vllm.v1.sample.sampler", "vllm.v1.sample.rejection_sampler",
    "vllm.v1.spec_decode.eagle",
    "vllm.v1.spec_decode.utils", "vllm.v1.attention.backends.gdn_attn",
)
# ... and those a later release added: the draft-model proposer (the toy draft model's;
# 0.13.0 - 0.15.x have none, and draft with EAGLE), and 0.23.0 moved the drafter's body
# (the proposer's loop, its kernel launches) into llm_base_proposer.py. (A digest sorts
# its modules: one moved here keeps the digests of the releases that have it.)
LATER_DRIVEN_MODULES = ("vllm.v1.spec_decode.draft_model",
                        "vllm.v1.spec_decode.llm_base_proposer")
# ... and the draft-token slice's (targets/vllm/slices/draft_tokens.py): Model Runner V2's
# DraftTokensHandler and its copy helper
SLICE_MODULES = ("vllm.v1.worker.gpu.spec_decode.utils", "vllm.v1.worker.gpu.async_utils")
# ... and Model Runner V2's driven whole (targets/vllm/mrv2/): the modules its greedy EAGLE
# path with async scheduling and structured outputs runs (those of them a release has),
# its attention and drafter helpers, vLLM's kernel-override seam where it binds through it
_GPU = "vllm.v1.worker.gpu"
MRV2_MODULES = tuple(mrv2_table.DRIVEN_MODULES) + (
    f"{_GPU}.attn_utils", f"{_GPU}.spec_decode.eagle.utils", f"{_GPU}.spec_decode.eagle",
    f"{_GPU}.spec_decode.rejection_sample", "vllm.triton_utils.dispatcher")

# Functions the target calls or overrides -> the parameters it relies on (a prefix).
CALLED: Dict[str, Tuple[str, ...]] = {
    f"{_CORE}:EngineCore.__init__": ("self", "vllm_config", "executor_class", "log_stats"),
    f"{_CORE}:EngineCore.step_with_batch_queue": ("self",),
    f"{_CORE}:EngineCore.step": ("self",),
    f"{_CORE}:EngineCore.post_step": ("self", "model_executed"),
    f"{_CORE}:EngineCore.preprocess_add_request": ("self", "request"),
    f"{_CORE}:EngineCore.add_request": ("self", "request"),
    "vllm.v1.executor.uniproc_executor:UniProcExecutor._init_executor": ("self",),
    "vllm.v1.worker.gpu_worker:Worker.init_device": ("self",),
    "vllm.v1.worker.gpu_worker:Worker._maybe_get_memory_pool_context": ("self", "tag"),
    "vllm.v1.worker.gpu_worker:init_worker_distributed_environment":
        ("vllm_config", "rank", "distributed_init_method", "local_rank", "backend"),
    f"{_RUNNER}:GPUModelRunner._init_device_properties": ("self",),
    f"{_RUNNER}:GPUModelRunner.execute_model": ("self", "scheduler_output"),
    "vllm.v1.attention.backends.gdn_attn:GDNAttentionMetadataBuilder.build":
        ("self", "common_prefix_len", "common_attn_metadata", "num_accepted_tokens",
         "num_decode_draft_tokens_cpu"),
}

# Model Runner V2 (targets/vllm/mrv2/): what it calls or overrides beyond the engine's
# (its worker, targets/vllm/mrv2/worker.py, overrides the same Worker methods as the V1
# path's), with the parameters relied on; its Triton kernels are checked from source
# against targets/vllm/mrv2/table.py (check_mrv2)
_MRV2_RUNNER = f"{_GPU}.model_runner:GPUModelRunner"
MRV2_CALLED: Dict[str, Tuple[str, ...]] = {
    **{t: e for t, e in CALLED.items() if t.startswith((_CORE, "vllm.v1.executor",
                                                       "vllm.v1.worker.gpu_worker"))},
    f"{_MRV2_RUNNER}.__init__": ("self", "vllm_config", "device"),
    f"{_MRV2_RUNNER}.initialize_kv_cache": ("self", "kv_cache_config"),
    f"{_MRV2_RUNNER}.execute_model": ("self", "scheduler_output"),
    # its graph capture, called at start-up where the run asks for graphs
    # (targets/vllm/engine/graphs.py)
    f"{_MRV2_RUNNER}.capture_model": ("self",),
    f"{_GPU}.spec_decode.utils:DraftTokensHandler.set_draft_tokens":
        ("self", "input_batch", "draft_tokens"),
    f"{_GPU}.buffer_utils:UvaBuffer.__init__": ("self", "size", "dtype"),
    "vllm.v1.structured_output.backend_types:StructuredOutputBackend.compile_grammar":
        ("self", "request_type", "grammar_spec"),
}
MRV2_SCENARIOS = ("vllm-mrv2", "vllm-mrv2-draft-tokens", "vllm-mrv2-uva-pool")


# The slices (targets/vllm/slices/): scenarios that drive one piece of upstream's code
# under a loop of specrace's, not the V1 engine -- they run where the engine cannot be
# driven (Model Runner V2 only, 0.34.0), and need only what they call.
SLICE_SCENARIOS = ("vllm-draft-tokens",)
_DRAFTS = "vllm.v1.worker.gpu.spec_decode.utils:DraftTokensHandler"
SLICE_CALLED: Dict[str, Tuple[str, ...]] = {
    f"{_DRAFTS}.__init__": ("self", "device"),
    f"{_DRAFTS}.set_draft_tokens": ("self", "input_batch", "draft_tokens"),
    f"{_DRAFTS}.get_draft_tokens": ("self",),
}

_SCHED = "vllm.v1.core.sched"
# The engine's side both runners run: upstream's EngineCore steps its async scheduler, and
# builds the executor and worker the target subclasses. Every release 0.16.0 on has them.
ENGINE_MODULES = (_CORE, f"{_SCHED}.async_scheduler", f"{_SCHED}.scheduler",
                  "vllm.v1.executor.uniproc_executor", "vllm.v1.worker.gpu_worker")
ENGINE_CLASSES = (f"{_CORE}:EngineCore", f"{_SCHED}.async_scheduler:AsyncScheduler",
                  f"{_SCHED}.scheduler:Scheduler")
# What upstream's own engine calls on the driven scheduler each step, with the arguments
# it passes (read from 0.13.0, 0.14.0, 0.17.0, 0.18.1, 0.19.0, 0.23.0, 0.27.1 and 0.34.0:
# unchanged between): the target calls none of these itself, but a release that changed
# one and not its caller crashes in a trial -- so the contract holds the scheduler to them.
ENGINE_DRIVEN: Dict[str, Tuple[str, ...]] = {
    f"{_SCHED}.scheduler:Scheduler.schedule": ("self",),
    f"{_SCHED}.scheduler:Scheduler.update_from_output":
        ("self", "scheduler_output", "model_runner_output"),
    f"{_SCHED}.scheduler:Scheduler._update_after_schedule": ("self", "scheduler_output"),
    f"{_SCHED}.scheduler:Scheduler._update_request_with_output":
        ("self", "request", "new_token_ids"),
    f"{_SCHED}.async_scheduler:AsyncScheduler._update_after_schedule":
        ("self", "scheduler_output"),
}
# ... and what the async scheduler overrides where it does (0.34.0 inherits the output
# update from Scheduler)
ENGINE_OVERRIDES: Dict[str, Tuple[str, ...]] = {
    f"{_SCHED}.async_scheduler:AsyncScheduler._update_request_with_output":
        ("self", "request", "new_token_ids"),
}
_ENGINE_CALLED = {t: e for t, e in CALLED.items()
                  if t.startswith((_CORE, "vllm.v1.executor", "vllm.v1.worker.gpu_worker"))}
ENGINE = driven.Surface(modules=ENGINE_MODULES, classes=ENGINE_CLASSES,
                        functions={**_ENGINE_CALLED, **ENGINE_DRIVEN},
                        overrides=ENGINE_OVERRIDES)
# The V1 model runner's path (its kernels are checked against their stand-ins apart:
# contract.check_api)
V1 = driven.Surface(modules=DRIVEN_MODULES, later_modules=LATER_DRIVEN_MODULES,
                    functions={t: e for t, e in CALLED.items() if t not in _ENGINE_CALLED})
# Model Runner V2 driven whole: the modules of it a release has (0.17.0 on)
MRV2 = driven.Surface(later_modules=MRV2_MODULES,
                      functions={t: e for t, e in MRV2_CALLED.items()
                                 if t not in _ENGINE_CALLED})
