"""Upstream's worker and executor with only their CUDA start-up and their second thread
replaced -- everything a step runs is vLLM's.

* ``SpecraceWorker`` is ``vllm.v1.worker.gpu_worker.Worker`` with the V1
  ``GPUModelRunner`` (Model Runner V2 runs get ``targets/vllm/mrv2/worker.py``'s, which
  shares ``SimWorkerOverrides``): ``execute_model``,
  ``sample_tokens``, ``take_draft_token_ids``, ``load_model``, ``get_kv_cache_spec``,
  ``initialize_from_config`` and ``initialize_cache`` are upstream's. Replaced:
  ``init_device`` (CUDA device, NCCL, a memory snapshot: the same distributed set-up on
  gloo, then the real ``GPUModelRunner.__init__``), ``determine_available_memory`` (CUDA
  memory profiling: a fixed KV budget), ``compile_or_warm_up_model`` (dummy runs and
  graph capture, which a toy model does not need) and ``_maybe_get_memory_pool_context``
  (from 0.23.0 it asks for CUDA's sleep-mode allocator on any platform that is not CUDA,
  XPU or CPU; sleep mode is off here, so no pool, as up to 0.19.0).
* The runner is ``GPUModelRunner`` itself, in a subclass that overrides only
  ``_init_device_properties`` on the simulator (it asks CUDA for the SM count) -- the
  hook vLLM's own ``CPUModelRunner`` overrides -- and marks the step's start for stalls
  (``vllm.before_execute``, an amplifier), the drafter's start on the main stream
  (``vllm.previous_drafter_running``: the next step's real window, ``_drafter_stalled``),
  the draft-ids copy stream's point before each step's draft copy (a copy engine busy
  with earlier transfers), and which pinned draft rows the host zeroed: the judge's
  ``draft_rows_zeroed`` (``harness.oracle.stale``) needs no device read to know them.
  On a GPU the device set-up is upstream's but for gloo (one rank: no NCCL needed).
* ``SpecraceExecutor`` is ``UniProcExecutor`` whose output futures run on the engine's
  thread when their result is asked for, instead of on a pool thread: the simulator is
  one thread of device time, and a second thread syncing events while the engine
  enqueues would make the schedule nondeterministic. The schedule it gives is a legal
  one upstream's can take -- the output thread slower than the engine -- and
  ``done()`` answers False until then, as a busy thread's future does.
"""
from __future__ import annotations

import contextlib
from concurrent.futures import Future
from typing import Any

import torch

from seams.faults import fault_point, observe

KV_BUDGET_BYTES = 8 << 20


class SimWorkerOverrides:
    """What both workers replace of upstream's ``Worker`` -- this module's for the V1
    runner and Model Runner V2's (``targets/vllm/mrv2/worker.py``) -- mixed in before it:
    the device start-up (``start_device``), the KV budget, the warm-up and the sleep-mode
    pool (see the module's doc)."""

    def start_device(self) -> None:
        """The rank's device, the distributed set-up on gloo (one rank) and the seed, as
        upstream's ``init_device`` makes them -- no NCCL, no memory snapshot."""
        from vllm.v1.worker.gpu_worker import init_worker_distributed_environment
        try:
            from vllm.v1.worker.gpu_worker import set_random_seed
        except ImportError:  # a release that imports it from elsewhere
            from vllm.utils.torch_utils import set_random_seed
        self.device = self.device_config.device
        if self.device.type == "cuda":  # as upstream's: the rank's own card
            self.device = torch.device(f"cuda:{self.local_rank}")
            torch.cuda.set_device(self.device)
        init_worker_distributed_environment(self.vllm_config, self.rank,
                                            self.distributed_init_method,
                                            self.local_rank, "gloo")
        set_random_seed(self.model_config.seed)

    def determine_available_memory(self) -> int:
        return KV_BUDGET_BYTES

    def compile_or_warm_up_model(self):
        # no compile time, in the form the release reads: a float up to 0.19.0,
        # ``CompilationTimes`` (language model, encoder) from 0.23.0
        try:
            from vllm.v1.worker.worker_base import CompilationTimes
        except ImportError:
            return 0.0
        return CompilationTimes(language_model=0.0, encoder=0.0)

    def _maybe_get_memory_pool_context(self, tag: str):
        return contextlib.nullcontext()  # no sleep mode (see the module's doc)


def worker_class():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.gpu_worker import Worker
    from vllm.v1.worker.workspace import init_workspace_manager

    class SpecraceModelRunner(GPUModelRunner):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            GPUModelRunner.__init__(self, *args, **kwargs)
            _drafter_stalled(self)

        def _init_device_properties(self) -> None:
            if self.device.type == "cuda":
                return GPUModelRunner._init_device_properties(self)  # the GPU's own
            self.num_sms = 1  # (CUDA's SM count sizes kernels the simulator does not run)

        def _copy_draft_token_ids_to_cpu(self, scheduler_output, zeros_only=False):
            stream = getattr(self, "draft_token_ids_copy_stream", None)
            if stream is not None:
                with torch.cuda.stream(stream):
                    fault_point("vllm.before_draft_copy")  # a busy copy engine
            GPUModelRunner._copy_draft_token_ids_to_cpu(self, scheduler_output, zeros_only)
            # rows the host has just zeroed (upstream's near-max-length path): whatever
            # the host reads back for them must be zeros
            self._specrace_zeroed = (zeros_only and self._draft_token_req_ids is not None
                                     and torch.is_tensor(self._draft_token_ids))

        def _get_draft_token_ids_cpu(self):
            rows, req_ids = GPUModelRunner._get_draft_token_ids_cpu(self)
            if getattr(self, "_specrace_zeroed", False):
                observe("draft_rows_zeroed", rows=list(zip(req_ids, rows)))
            return rows, req_ids

        def execute_model(self, scheduler_output, *args: Any, **kwargs: Any):
            # the step's first work on the main stream: its input uploads and forward
            # queue behind a stall planned here
            fault_point("vllm.before_execute")
            return GPUModelRunner.execute_model(self, scheduler_output, *args, **kwargs)

        def _copy_valid_sampled_token_count(self, *args: Any, **kwargs: Any):
            stream = getattr(self, "valid_sampled_token_count_copy_stream", None)
            if stream is not None and self.valid_sampled_token_count_event is not None:
                with torch.cuda.stream(stream):
                    fault_point("vllm.before_valid_count_copy")  # a busy copy engine
            return GPUModelRunner._copy_valid_sampled_token_count(self, *args, **kwargs)

    class SpecraceWorker(SimWorkerOverrides, Worker):
        def init_device(self) -> None:
            self.start_device()
            init_workspace_manager(self.device, 1)
            self.model_runner = SpecraceModelRunner(self.vllm_config, self.device)

    return SpecraceWorker


def _drafter_stalled(runner) -> None:
    """Mark the start of the runner's drafter (``drafter.propose``, EAGLE or draft model)
    on the main stream: ``vllm.previous_drafter_running``. The runner calls it in
    ``propose_draft_token_ids`` after ``_copy_valid_sampled_token_count`` has recorded the
    valid-count event (0.13.0 ``gpu_model_runner.py:3472`` then ``:3533``; 0.17.0
    ``:4159`` then ``:4223``), and the next step's ``_update_states`` synchronises only
    that event before queueing its uploads (0.17.0 ``:1050`` -> ``:4021``): what of the
    previous step can still be pending on the main stream then is its drafter. A stall
    here is that drafter running long -- upstream's window, where a stall as
    ``execute_model`` starts is wider than any upstream has. Bound on the drafter object
    (the runner's own attribute, set by its ``__init__``); nothing else changes."""
    drafter = getattr(runner, "drafter", None)
    propose = getattr(drafter, "propose", None)
    if propose is None:  # no speculative decoding
        return

    def propose_after_stall(*args: Any, **kwargs: Any):
        fault_point("vllm.previous_drafter_running")  # the main stream: a long drafter
        return propose(*args, **kwargs)

    drafter.propose = propose_after_stall


class _OnDemand(Future):
    """A future whose work runs in the thread that first asks for its result."""

    def __init__(self, fn, args, kwargs) -> None:
        super().__init__()
        self._work = (fn, args, kwargs)

    def _run(self) -> None:
        if self._work is None:
            return
        fn, args, kwargs = self._work
        self._work = None
        try:
            self.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # delivered to whoever asks, as a pool thread does
            self.set_exception(exc)

    def result(self, timeout=None):
        self._run()
        return super().result(timeout)

    def exception(self, timeout=None):
        self._run()
        return super().exception(timeout)


class _OnDemandThread:
    def submit(self, fn, *args: Any, **kwargs: Any) -> Future:
        return _OnDemand(fn, args, kwargs)

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        pass


def executor_class():
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    class SpecraceExecutor(UniProcExecutor):
        def _init_executor(self) -> None:
            super()._init_executor()
            if getattr(self, "async_output_thread", None) is not None:
                self.async_output_thread.shutdown(wait=True)
                self.async_output_thread = _OnDemandThread()

    return SpecraceExecutor


_BUILT: dict = {}


def __getattr__(name: str):
    """``SpecraceWorker`` by qualified name, as vLLM's ``worker_cls`` resolves it
    (built against the installed vLLM on first use)."""
    if name == "SpecraceWorker":
        if name not in _BUILT:
            _BUILT[name] = worker_class()
        return _BUILT[name]
    raise AttributeError(name)
