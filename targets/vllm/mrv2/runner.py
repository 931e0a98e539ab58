"""Model Runner V2 as the worker builds it, with only what the simulator needs added.

``runner_class()`` is upstream's MRv2 ``GPUModelRunner`` (0.17.0
``vllm/v1/worker/gpu/model_runner.py``) itself: ``__init__``, ``load_model``,
``initialize_kv_cache``, ``execute_model`` (input preparation: ``prepare_inputs``,
``prepare_attn``, the model state's attention metadata), ``sample_tokens`` (sampler,
rejection sampling, ``postprocess``, the EAGLE speculator's ``propose``, the
``DraftTokensHandler`` and ``AsyncOutput`` copies) and ``take_draft_token_ids`` are
upstream's, unmodified. The subclass adds, and changes nothing it calls:

* the step's stall point (``vllm.before_execute``) as a real step's ``execute_model``
  starts -- its uploads and forward queue behind it, as on the V1 path;
* the draft-token copy's stall point (``vllm.before_draft_copy``) on the handler's copy
  stream right before upstream's ``set_draft_tokens`` queues its copy there (a copy
  engine busy with earlier transfers), as the slice (``slices/draft_tokens.py``) does;
* the drafter's stall point (``vllm.before_propose``) on the main stream as the
  speculator's ``propose`` starts -- after the step's output copy event -- and a probe
  of the sampling inputs the drafter copies (``probe``: recorded, never acted on);
* after upstream's ``initialize_kv_cache``, which tensors each of the block tables'
  pointer tables holds (``kernels.register_pointer_table``: the stand-ins cannot follow
  raw device addresses).

The worker (``engine/worker.py``) builds this class where upstream's ``Worker`` would
build MRv2 (``VLLM_USE_V2_MODEL_RUNNER``, read into ``Worker.use_v2_model_runner``);
its other MRv2 branch, ``warmup_kernels`` in ``compile_or_warm_up_model``, JIT-compiles
Triton kernels the simulator does not have, and is replaced there like the V1 warm-up.
MRv2 has no ``_init_device_properties`` (the V1 runner's one CUDA query).
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

import torch

from seams.faults import fault_point
from targets.vllm.mrv2.kernels import register_pointer_table
from targets.vllm.mrv2.probe import wrap_propose

_BUILT: dict = {}


def runner_class():
    """The MRv2 runner subclass, built against the installed vLLM on first use."""
    if "runner" in _BUILT:
        return _BUILT["runner"]
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    class SpecraceModelRunnerV2(GPUModelRunner):
        def __init__(self, vllm_config, device) -> None:
            GPUModelRunner.__init__(self, vllm_config, device)
            handler = self.draft_tokens_handler
            upstream = handler.set_draft_tokens

            def set_draft_tokens(input_batch, draft_tokens) -> None:
                # the copy stream busy before this step's copy is queued on it
                with torch.cuda.stream(handler.copy_stream):
                    fault_point("vllm.before_draft_copy")
                upstream(input_batch, draft_tokens)

            handler.set_draft_tokens = set_draft_tokens
            # the main stream's stall point after the output copy event, before the
            # drafter (vllm.before_propose), and the drafter's sampling inputs recorded
            wrap_propose(self, fault_point)

        def initialize_kv_cache(self, kv_cache_config, *args: Any, **kwargs: Any) -> None:
            GPUModelRunner.initialize_kv_cache(self, kv_cache_config, *args, **kwargs)
            register_block_tables(self.block_tables)
            # a drafter with block tables of its own (0.34.0's speculators hold the
            # target's, or their own)
            register_block_tables(getattr(self.speculator, "block_tables", None))

        def execute_model(self, scheduler_output, *args: Any, **kwargs: Any):
            if not kwargs.get("dummy_run", False):
                # the step's first work on the main stream: its uploads and forward
                # queue behind a stall planned here
                fault_point("vllm.before_execute")
            return GPUModelRunner.execute_model(self, scheduler_output, *args, **kwargs)

    _BUILT["runner"] = SpecraceModelRunnerV2
    return SpecraceModelRunnerV2


def streams(runner) -> dict:
    """MRv2's streams, named for traces."""
    handler = getattr(runner, "draft_tokens_handler", None)
    grammar = getattr(runner, "structured_outputs_worker", None)
    return {"output copy": getattr(runner, "output_copy_stream", None),
            "draft copy": getattr(handler, "copy_stream", None),
            "grammar copy": getattr(grammar, "copy_stream", None)}


def register_block_tables(tables) -> None:
    """Which tensors a ``BlockTables``' pointer tables hold (``kernels._deref``)."""
    if tables is None:
        return
    register_pointer_table(tables.block_table_ptrs, [t.gpu for t in tables.block_tables])
    register_pointer_table(tables.input_block_table_ptrs, tables.input_block_tables)


ENV = "VLLM_USE_V2_MODEL_RUNNER"


@contextlib.contextmanager
def selected(v2: bool) -> Iterator[None]:
    """Upstream's switch set for an engine's construction: ``Worker.__init__`` and
    ``Scheduler.__init__`` read ``VLLM_USE_V2_MODEL_RUNNER`` once, into an attribute.
    Set explicitly either way: ``EngineCore.__init__`` ends by caching every vLLM
    environment variable for the process (``envs.enable_envs_cache``), so a value an
    earlier engine of this process cached would otherwise decide this one's runner."""
    import vllm.envs as envs
    before = os.environ.get(ENV)
    os.environ[ENV] = "1" if v2 else "0"
    uncache = getattr(envs, "disable_envs_cache", None)  # releases that cache them
    if uncache is not None:
        uncache()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before
