"""vLLM's own engine loop, stepped by the harness.

``VllmEngine`` is the engine the harness drives, a ``toys.engine.Engine`` (``step`` /
``has_work`` / ``add_request`` / ``run_to_completion`` / ``close`` / ``iteration`` /
``streams``). Under
it everything is upstream's: ``EngineCore`` built from a ``VllmConfig`` by its real
``__init__`` (KV-cache sizing, the scheduler, the executor), ``AsyncScheduler`` and
``EngineCore.step_with_batch_queue`` with async scheduling on -- two batches in flight,
the next scheduled and launched before the previous one's output is read -- and
``Scheduler`` with ``EngineCore.step`` / ``post_step`` with it off, the synchronous
reference. One harness step is one engine step, as ``EngineCoreProc`` runs it (``step_fn``
then ``post_step``).

Ours: the config values (a tiny model, no prefix caching, eager mode), request intake,
and collecting each request's tokens from the engine's outputs.
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional

from toys.engine import EngineLoop
from toys.vocab import EOS_ID

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "configs")
BLOCK_SIZE = 16
MAX_MODEL_LEN = 128
MAX_NUM_SEQS = 8
KV_BLOCKS = 64


class VllmRequest:
    """A request as the harness knows it; its tokens come back from the engine."""

    def __init__(self, rid: int, prompt: List[int], max_new_tokens: int) -> None:
        self.rid, self.prompt, self.max_new_tokens = rid, list(prompt), max_new_tokens
        self.tokens: List[int] = []
        self.finished: Optional[str] = None

    def output(self) -> List[int]:
        return list(self.tokens)

    def core_request(self, structured: bool = False, presence_penalty: float = 0.0,
                     logprobs: int = 0):
        from vllm import SamplingParams
        from vllm.v1.engine import EngineCoreRequest
        extra_params = {}
        if structured:  # Model Runner V2's toy grammar (targets/vllm/mrv2/grammar.py)
            from targets.vllm.mrv2.grammar import params_for
            extra_params["structured_outputs"] = params_for(self.prompt)
        params = SamplingParams(temperature=0.0, max_tokens=self.max_new_tokens,
                                stop_token_ids=[EOS_ID], ignore_eos=False,
                                presence_penalty=presence_penalty,
                                logprobs=logprobs or None,
                                prompt_logprobs=logprobs or None, **extra_params)
        extra = {}
        if "eos_token_id" in EngineCoreRequest.__struct_fields__:  # 0.16.0 asks for it
            extra["eos_token_id"] = EOS_ID
        return EngineCoreRequest(request_id=str(self.rid), prompt_token_ids=self.prompt,
                                 mm_features=None, sampling_params=params,
                                 pooling_params=None, arrival_time=time.time(),
                                 lora_request=None, cache_salt=None, data_parallel_rank=None,
                                 **extra)


def release_async_default() -> bool:
    """Does the installed release turn async scheduling on by default for an EAGLE-family
    drafter (EAGLE / EAGLE3 / MTP), the deployment the seq-lens scenario stands for?
    Read from the release's own ``SchedulerConfig``: a default of ``False`` is off (0.13.0
    ``config/scheduler.py:133``: ``--async-scheduling`` opts in); ``None`` is "decide",
    which ``VllmConfig`` turns on for EAGLE-family drafting with the uni / mp executors,
    one pipeline stage and the padded drafter batch -- what every run here has (0.14.0
    ``config/scheduler.py:133``, ``config/vllm.py:588-628``, PR #31998; the same in every
    later release driven). The draft-model method is not of that family: vLLM turns it off
    for it (0.17.0 ``config/vllm.py:714-723``); the toy draft model stands in for an
    EAGLE-family drafter here, so the answer is the family's."""
    import dataclasses
    from vllm.config import SchedulerConfig
    field = {f.name: f for f in dataclasses.fields(SchedulerConfig)}["async_scheduling"]
    default = getattr(field.default, "default", field.default)  # pydantic's FieldInfo
    return default is None or bool(default)


def async_scheduling(args) -> bool:
    """Async scheduling on for this engine? Off for the synchronous reference and the
    ``overlap=False`` variants; with ``vllm_async_default``, as the release has it by
    default (``release_async_default``); else on."""
    if not args.overlap:
        return False
    return release_async_default() if args.vllm_async_default else True


def draft_method() -> tuple:
    """(the speculative method, the drafter's config) the V1 runner drives the toy
    drafter with: a draft model where the release has the draft-model proposer
    (``spec_decode/draft_model.py``: 0.16.0 and 0.17.0 here), else EAGLE -- 0.13.0 and
    0.14.0 have no V1 draft-model proposer (the runner builds ``EagleProposer`` for EAGLE / MTP only,
    0.13.0 ``gpu_model_runner.py:391-392``) and their async scheduling refuses any other
    method (0.14.0 ``config/vllm.py:570-576``). Both run the same proposer loop
    (``propose``, whose in-place ``_seq_lens_cpu += 1`` the seq-lens race is about)."""
    import importlib.util
    if importlib.util.find_spec("vllm.v1.spec_decode.draft_model") is not None:
        return "draft_model", os.path.join(CONFIGS, "draft")
    return "eagle", os.path.join(CONFIGS, "eagle")


def engine_config(args):
    """The ``VllmConfig`` a run's server args ask for, built offline by vLLM's own
    ``EngineArgs``: the toy hybrid model with the toy draft model as its drafter
    (``draft_method``: the EAGLE-family path, which async scheduling accepts; none when a
    step verifies one slot, ``draft_token_num`` 1), async scheduling as
    ``async_scheduling`` says, prefix
    caching off (so the hybrid accepted counts are copied without a sync, the path
    #36013 is about), eager on the V1 runner (Model Runner V2: ``_graph_mode``), the KV
    cache a fixed 64 blocks."""
    from vllm.engine.arg_utils import EngineArgs
    drafts = args.draft_token_num - 1  # the verified slots of a step, less the bonus one
    method, drafter = draft_method()
    if args.vllm_runner == "v2":
        # Model Runner V2 (targets/vllm/mrv2/): its speculator is EAGLE only, and it has
        # no hybrid (Mamba-state) path -- 0.17.0's attn_utils.py asserts attention specs
        if args.hybrid:
            raise ValueError("Model Runner V2 runs the dense toy model (hybrid=False)")
        from targets.vllm.mrv2.model import CONFIG as EAGLE_CONFIG
        method, drafter = "eagle", EAGLE_CONFIG
    model = os.path.join(CONFIGS, "target" if args.hybrid else "target-dense")
    if args.vllm_runner == "v2":  # the dense toy model as MRv2's loaders read it
        from targets.vllm.mrv2.model import TARGET_CONFIG as model
    return EngineArgs(
        model=model,
        skip_tokenizer_init=True,
        load_format="dummy", dtype="float32", seed=0,
        speculative_config=None if drafts < 1 else {
            "method": method, "model": drafter, "num_speculative_tokens": drafts},
        async_scheduling=async_scheduling(args), **_graph_mode(args),
        max_model_len=MAX_MODEL_LEN, max_num_seqs=MAX_NUM_SEQS,
        # a step's token budget: chunked prefill's chunk (--max-num-batched-tokens; V1
        # chunks any prompt longer than what is left of it)
        max_num_batched_tokens=args.chunked_prefill_size or MAX_MODEL_LEN,
        block_size=BLOCK_SIZE,
        num_gpu_blocks_override=KV_BLOCKS, enable_prefix_caching=False,
        distributed_executor_backend="uni",
        worker_cls=("targets.vllm.mrv2.worker.SpecraceWorkerV2" if args.vllm_runner == "v2"
                    else "targets.vllm.engine.worker.SpecraceWorker"),
        disable_log_stats=True,
    ).create_engine_config()


def _graph_mode(args) -> dict:
    """Eager on the V1 runner; on Model Runner V2 upstream's full decode graphs where
    ``cuda_graph`` asks for them (``engine/graphs.py``), eager where it does not."""
    if args.vllm_runner == "v2" and args.cuda_graph:
        from targets.vllm.engine.graphs import compilation_config
        return {"enforce_eager": False, "compilation_config": compilation_config(args)}
    return {"enforce_eager": True}


class VllmEngine(EngineLoop):
    def __init__(self, args, device, grammar_backend: Any = None) -> None:
        from vllm.v1.engine.core import EngineCore
        from targets.vllm.engine.worker import executor_class
        from targets.vllm.mrv2.runner import selected
        from targets.vllm.boundary.contract import refuse_undriven
        refuse_undriven(args.vllm_runner == "v2")  # the engine asked for is driven here
        self.args = args
        self.config = engine_config(args)
        # what the engine runs, as vLLM resolved it (the loop below steps whichever)
        self.async_scheduling = bool(self.config.scheduler_config.async_scheduling)
        with selected(args.vllm_runner == "v2"):  # the runner: V1, or Model Runner V2
            self.core = EngineCore(self.config, executor_class=executor_class(),
                                   log_stats=False)
        self.runner = self.core.model_executor.driver_worker.worker.model_runner
        if args.vllm_structured_outputs:
            from targets.vllm.mrv2 import grammar
            grammar.install(self.core.structured_output_manager, self.config)
        self.requests: Dict[str, VllmRequest] = {}
        self.iteration = 0

    @property
    def streams(self) -> Dict[str, Any]:
        """The runner's streams, named for traces (a release that lacks one: None)."""
        import torch
        r = self.runner
        if self.args.vllm_runner == "v2":
            from targets.vllm.mrv2.runner import streams
            return {"main": torch.cuda.current_stream(), **streams(r)}
        return {"main": torch.cuda.current_stream(),
                "output copy": getattr(r, "async_output_copy_stream", None),
                "valid-count copy": getattr(r, "valid_sampled_token_count_copy_stream", None),
                "draft-ids copy": getattr(r, "draft_token_ids_copy_stream", None)}

    def add_request(self, req: VllmRequest) -> None:
        self.requests[str(req.rid)] = req
        request, wave = self.core.preprocess_add_request(
            req.core_request(structured=self.args.vllm_structured_outputs,
                             presence_penalty=self.args.vllm_presence_penalty,
                             logprobs=self.args.vllm_logprobs))
        self.core.add_request(request, wave)

    def has_work(self) -> bool:
        return bool(self.core.scheduler.has_requests() or self.core.batch_queue)

    def step(self) -> None:
        if not self.has_work():
            self.iteration += 1
            return
        outputs, executed = self.core.step_fn()
        for engine_outputs in (outputs or {}).values():
            for out in engine_outputs.outputs:
                req = self.requests[out.request_id]
                req.tokens.extend(out.new_token_ids)
                if out.finish_reason is not None:
                    req.finished = str(out.finish_reason)
        self.core.post_step(executed)
        self.iteration += 1

    def close(self) -> None:
        probe = getattr(self.runner, "_specrace_probe", None)  # Model Runner V2's
        try:
            if probe is not None:
                probe.close("trial" if self.args.overlap else "reference")
        except Exception:  # a run that failed mid-step: its error is the verdict
            pass
        try:
            self.core.shutdown()
        except Exception:  # a run that failed mid-step: its error is the verdict, not this
            pass
