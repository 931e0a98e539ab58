"""The verify forward under a CUDA graph, as SGLang's CUDA-graph runner runs it.

At start-up the runner captures the target model's forward once per batch-size bucket
(``capture_bs``, largest first, sharing one memory pool) on its own stream, against
static buffers: the draft tokens ``input_ids`` (``bucket*D``, zero-filled) and the logits
the captured kernels write. A verify step then runs, on the forward stream:

1. pad the batch to the next captured size;
2. copy the draft tokens into the static ``input_ids`` -- on the forward stream, so the
   copy is ordered after the previous replay (which read them) and before this one.
   Rows past the batch keep what they held: zeros at first, an earlier batch's tokens
   later -- valid ids either way, so the padded rows compute harmless logits;
3. replay the graph: one launch of every captured kernel, in order, on this stream;
4. return the static logits' rows for this batch -- a view, as SGLang's runner returns
   its output buffers: the sampler consumes it on this stream, before the next replay
   overwrites it.

Batches larger than the largest bucket run the forward eagerly, as SGLang does.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Any, Dict, Iterator, List, Tuple

import torch

CAPTURE_BS = (1, 2, 4, 8, 16, 32)
WARMUP_RUNS = 1  # lazy initialisation (cuBLAS handles, workspaces) must not happen in capture


@contextlib.contextmanager
def gc_frozen() -> Iterator[None]:
    """No garbage collection while capturing, as SGLang's runner freezes it: a collection
    mid-capture can free CUDA objects of earlier work (events, pinned buffers), and such a
    CUDA call during a global-mode capture invalidates the capture. (No collection
    before it either: a full collection per bucket costs more than the run.)"""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def capture_graphs(mod, stream, pool, buckets, body) -> Dict[int, Tuple[Any, Any]]:
    """One graph per batch-size bucket, largest first, all in ``pool``, captured on
    ``stream`` once the current stream's work (the weights' upload) is done: ``body(bs)``
    runs ``WARMUP_RUNS`` times eagerly, then once under capture, with the garbage
    collector frozen throughout. ``{bs: (graph, what the captured body returned)}``."""
    captured: Dict[int, Tuple[Any, Any]] = {}
    stream.wait_stream(mod.current_stream())
    with gc_frozen(), mod.stream(stream):
        for bs in reversed(buckets):
            for _ in range(WARMUP_RUNS):
                body(bs)
            graph = mod.CUDAGraph()
            with mod.graph(graph, pool=pool, stream=stream):
                out = body(bs)
            captured[bs] = (graph, out)
    mod.current_stream().wait_stream(stream)
    return captured


def graphs_supported(device) -> bool:
    """Does ``device``'s module capture graphs (torch.cuda and the simulator do)?"""
    device = torch.device(device)
    if device.type == "cpu":
        return False
    mod = torch.get_device_module(device)
    return hasattr(mod, "CUDAGraph") and hasattr(mod, "graph")


class VerifyGraphRunner:
    """``forward`` (default ``model.forward``) is what each graph captures: a function of
    the flat draft tokens returning one tensor, or a tuple of them (rows first), e.g. the
    hidden states next to the logits."""

    def __init__(self, model, device, draft_token_num: int, max_bs: int,
                 forward=None) -> None:
        self.model = model
        self.forward = forward or model.forward
        self.device = torch.device(device)
        self.mod = torch.get_device_module(self.device)
        self.D = draft_token_num
        self.capture_bs: List[int] = [bs for bs in CAPTURE_BS if bs <= max_bs]
        self.stream = self.mod.Stream()  # the capture stream
        self.pool = self.mod.graph_pool_handle()
        self.graphs: Dict[int, object] = {}
        self.input_ids: Dict[int, torch.Tensor] = {}
        self.logits: Dict[int, torch.Tensor] = {}
        self.capture()

    def capture(self) -> None:
        def body(bs: int):
            if bs not in self.input_ids:  # allocated on the capture stream, before warm-up
                self.input_ids[bs] = torch.zeros((bs * self.D,), dtype=torch.int64,
                                                 device=self.device)
            return self.forward(self.input_ids[bs])

        captured = capture_graphs(self.mod, self.stream, self.pool, self.capture_bs, body)
        for bs, (graph, logits) in captured.items():
            self.graphs[bs] = graph
            self.logits[bs] = logits

    def can_run(self, bs: int) -> bool:
        return 0 < bs <= self.capture_bs[-1]

    def replay(self, input_ids: torch.Tensor):
        """Logits ``(n, V)`` for flat draft tokens ``(n,)``, on the current stream (each
        of ``forward``'s outputs, if it returns several): views of the static outputs."""
        n = input_ids.shape[0]
        bs = next(b for b in self.capture_bs if b * self.D >= n)
        self.input_ids[bs][:n].copy_(input_ids)
        self.graphs[bs].replay()
        out = self.logits[bs]
        return tuple(t[:n] for t in out) if isinstance(out, tuple) else out[:n]
