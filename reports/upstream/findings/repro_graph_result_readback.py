"""A maintainer's repro of the graph-output readback race, without specrace: torch and
sglang only (a CUDA machine with the installed sglang; absent GPU-only packages that
sglang imports at module level and this path never calls are stubbed, nothing else).

The racing pair is upstream's own code:

* the readback -- ``Scheduler._copy_result_to_cpu`` (scheduler.py, 0.5.18 on), called
  unbound on an object with the three attributes it reads: ``copy_stream.wait_stream(
  forward_stream)``, then ``GenerationBatchResult.copy_to_cpu`` (managers/utils.py) on the
  copy stream, ``async_d2h`` per field, ``copy_done.record()``; nothing makes the next
  forward wait for it;
* the next forward -- a CUDA graph replay on the forward stream that rewrites the static
  output buffer the result's fields are views of (what the DSpark folded epilogue's
  ``out_tokens_buf`` / ``commit_lens_buf`` / ``block_accept_lens`` and a decode graph's
  ``hidden_states`` are).

No stall is injected. The contention is a second stream doing bulk device-to-host
copies (what KV offload / HiCache write-back does): the readback queues behind it on the
copy engine and lands after the replay. Prints the stale rate with and without it.

    python3 repro_graph_result_readback.py [TRIALS]
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import sys
import threading
import types

import torch

# GPU-only packages sglang imports at module level that this path never calls
STUBBED = ("sgl_kernel", "flashinfer", "deep_gemm")


class _Anything:
    """Whatever a stubbed module is asked for at import (a constant, a class, a scalar
    type table): callable, and every attribute of it another such."""

    def __call__(self, *a, **k):
        return _Anything()

    def __getattr__(self, attr):
        return _Anything()


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top in STUBBED:
            try:
                if importlib.machinery.PathFinder.find_spec(top) is not None:
                    return None  # really installed: use it
            except (ImportError, ValueError):
                pass
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        mod.__getattr__ = lambda attr: _Anything()
        return mod

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Stubs())

from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.managers.utils import GenerationBatchResult  # noqa: E402

UPSTREAM_NAMES = ("sglang.srt.managers.scheduler:Scheduler._copy_result_to_cpu",
                  "sglang.srt.managers.utils:GenerationBatchResult.copy_to_cpu")
BS, K, BULK = 8, 4, 256 << 20


def _bulk_d2h(stop: threading.Event) -> None:
    dev = torch.empty(BULK, dtype=torch.uint8, device="cuda")
    host = torch.empty(BULK, dtype=torch.uint8, pin_memory=True)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        while not stop.is_set():
            host.copy_(dev, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            done.synchronize()


def trials(n: int, contention: bool) -> int:
    forward, copy = torch.cuda.Stream(), torch.cuda.Stream()
    sched = types.SimpleNamespace(  # what _copy_result_to_cpu reads of the scheduler
        copy_stream=copy, forward_stream=forward,
        copy_stream_ctx=torch.cuda.stream(copy), enable_async_d2h_copy=False)
    batch = types.SimpleNamespace(return_logprob=False, return_hidden_states=False)
    static = torch.zeros(BS, K, dtype=torch.int64, device="cuda")  # the graph's output
    step_in = torch.zeros(1, dtype=torch.int64, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(forward):
        for _ in range(2):  # warm-up before capture
            static.copy_(step_in.expand(BS, K))
        forward.synchronize()
        with torch.cuda.graph(graph, stream=forward):
            static.copy_(step_in.expand(BS, K))  # the epilogue writes its output buffer
    stop = threading.Event()
    loader = threading.Thread(target=_bulk_d2h, args=(stop,), daemon=True)
    if contention:
        loader.start()
    stale = 0
    try:
        for step in range(1, n + 1):
            with torch.cuda.stream(forward):
                step_in.fill_(step)
                graph.replay()  # forward k: the result is a view of the static buffer
                result = GenerationBatchResult(next_token_ids=static.view(-1),
                                               accept_lens=static[:, 0])
                result.copy_done = torch.cuda.Event()
                Scheduler._copy_result_to_cpu(sched, result, batch)  # upstream's readback
                step_in.fill_(step + 10_000)
                graph.replay()  # forward k+1 rewrites the buffer; nothing waited for the copy
            result.copy_done.synchronize()  # what the result processor waits on
            stale += int(result.next_token_ids[0].item() != step)
            torch.cuda.synchronize()
    finally:
        stop.set()
        if contention:
            loader.join()
    return stale


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    torch.cuda.init()
    out = {"gpu": torch.cuda.get_device_name(0), "trials": n, "stall": "none",
           "stale_no_contention": trials(n, False),
           "stale_bulk_d2h_contention": trials(n, True)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
