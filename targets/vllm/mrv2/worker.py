"""Upstream's worker for Model Runner V2 runs, with only its CUDA start-up replaced.

``SpecraceWorkerV2`` is ``vllm.v1.worker.gpu_worker.Worker`` -- ``execute_model``,
``sample_tokens``, ``take_draft_token_ids``, ``load_model``, ``get_kv_cache_spec``,
``initialize_from_config`` and ``initialize_cache`` are upstream's -- whose runner is
``runner.runner_class()`` (upstream's MRv2 ``GPUModelRunner`` with the stall points).
What it replaces is what the V1 path's worker replaces (``engine/worker.py``'s
``SimWorkerOverrides``, shared; that module imports the V1 runner only when its own worker
is built, which 0.34.0 could not do):

* ``init_device``: the same distributed set-up on gloo (one rank), the seed, the
  workspace, then the runner -- through upstream's ``_init_workspace_and_model_runner``
  and its ``_make_model_runner`` hook where the release has them (0.34.0), as 0.17.0's
  ``init_device`` builds it otherwise; no CUDA device, NCCL or memory snapshot;
* ``determine_available_memory`` (a fixed KV budget), ``compile_or_warm_up_model`` (no
  dummy runs, no Triton JIT warm-up, no graph capture) and
  ``_maybe_get_memory_pool_context`` (no sleep-mode pool), as the V1 path's;
* 0.34.0's loader, runner and worker call ``torch.accelerator``'s ``empty_cache`` and
  ``synchronize``, which the simulated device has no allocator hooks for: on the
  simulator ``load_model``, the graph capture and ``shutdown`` run with them standing
  for nothing (no cache to empty) and for ``torch.cuda.synchronize`` (the simulator's),
  and the capture's ``get_memory_info`` (for its log line) answered with any size;
* ``compile_or_warm_up_model`` runs upstream's ``capture_model`` where the run asks for
  CUDA graphs (``engine/graphs.py``), with ``torch.cuda``'s graph names the simulator's;
* 0.34.0's ``Worker.__init__`` refuses to build without Triton ("vLLM's model runner
  requires Triton"): the runner's Triton kernels run as the stand-ins
  (``seams``), so the check is answered for the construction alone.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from targets.vllm.engine.worker import SimWorkerOverrides


@contextlib.contextmanager
def _accelerator_on_sim(device) -> Iterator[None]:
    """``torch.accelerator.empty_cache`` / ``synchronize`` / ``get_memory_info`` for a
    simulated device (the last read by 0.34.0's graph capture for its log line)."""
    from targets.vllm.engine.graphs import SIM_MEMORY
    acc = getattr(torch, "accelerator", None)
    if acc is None or getattr(device, "type", "cuda") == "cuda":
        yield
        return
    saved = {n: getattr(acc, n) for n in ("empty_cache", "synchronize", "get_memory_info")
             if hasattr(acc, n)}
    acc.empty_cache = lambda *a, **k: None
    acc.synchronize = lambda *a, **k: torch.cuda.synchronize()
    acc.get_memory_info = lambda *a, **k: (SIM_MEMORY, SIM_MEMORY)
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(acc, n, fn)


def worker_class():
    import vllm.v1.worker.gpu_worker as gpu_worker
    from vllm.v1.worker.gpu_worker import Worker
    from vllm.v1.worker.workspace import init_workspace_manager
    from targets.vllm.engine import graphs
    from targets.vllm.mrv2.runner import runner_class

    class SpecraceWorkerV2(SimWorkerOverrides, Worker):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            before = getattr(gpu_worker, "HAS_TRITON", None)
            if before is not None:  # the stand-ins are the Triton kernels here
                gpu_worker.HAS_TRITON = True
            try:
                Worker.__init__(self, *args, **kwargs)
            finally:
                if before is not None:
                    gpu_worker.HAS_TRITON = before

        def init_device(self) -> None:
            self.start_device()
            with graphs.names(self.device):  # the graph managers take their pool here
                if hasattr(Worker, "_init_workspace_and_model_runner"):  # 0.34.0
                    self._init_workspace_and_model_runner()
                    return
                init_workspace_manager(self.device, 1)
                self.model_runner = runner_class()(self.vllm_config, self.device)

        def compile_or_warm_up_model(self):
            # upstream's graph capture where the run asks for graphs (engine/graphs.py);
            # no dummy runs or Triton warm-up either way
            if graphs.wants_graphs(self.vllm_config):
                with graphs.names(self.device), _accelerator_on_sim(self.device):
                    self.model_runner.capture_model()
            return SimWorkerOverrides.compile_or_warm_up_model(self)

        def load_model(self, *args: Any, **kwargs: Any) -> None:
            with _accelerator_on_sim(self.device):
                return Worker.load_model(self, *args, **kwargs)

        def shutdown(self) -> None:
            with _accelerator_on_sim(getattr(self, "device", None)):
                return Worker.shutdown(self)

        def _make_model_runner(self):
            return runner_class()(self.vllm_config, self.device)

    return SpecraceWorkerV2


_BUILT: dict = {}


def __getattr__(name: str):
    """``SpecraceWorkerV2`` by qualified name, as vLLM's ``worker_cls`` resolves it."""
    if name == "SpecraceWorkerV2":
        if name not in _BUILT:
            _BUILT[name] = worker_class()
        return _BUILT[name]
    raise AttributeError(name)
