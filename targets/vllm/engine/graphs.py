"""CUDA graphs on Model Runner V2 (its worker, ``mrv2/worker.py``, uses this; the V1
runner runs eager): upstream's ``CudaGraphManager`` (and its speculator's)
captures the uniform-decode batches at start-up and replays them each decode step, as a
vLLM server does by default (``cudagraph_mode`` ``FULL_DECODE_ONLY`` here: the full
graphs need no ``torch.compile``, which the piecewise ones do).

What the capture needs of the machine, on the simulator only (a GPU's ``torch.cuda`` is
its own), for the runner's construction -- the managers take their memory pool there --
and ``capture_model`` (``names``, restored after):

* ``torch.cuda.CUDAGraph``, ``graph`` and ``graph_pool_handle``: the managers name them
  on ``torch.cuda`` (0.17.0 ``cudagraph_utils.py:68``, ``:178``, ``:193``); on the
  simulator they are the simulator's, whose capture refuses what CUDA's refuses (a host
  sync, a data-dependent shape, an unjoined fork) and whose replays issue the captured
  ops again on the replaying stream -- so a replay's reads and writes are judged like
  any others;
* ``torch.cuda.mem_get_info`` / ``empty_cache``: ``capture_model`` measures the
  graphs' memory for its log line (any size does) and empties the cache first.

Replays need none of it: a graph replays through its own object.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

SIM_MEMORY = 80 << 30  # capture_model's log line reads the free memory; any value does
FULL_DECODE_ONLY = "FULL_DECODE_ONLY"


def compilation_config(args) -> dict:
    """The ``compilation_config`` a Model Runner V2 run with ``cuda_graph`` asks for: no
    ``torch.compile`` (``mode`` 0; the toy model runs op by op), full graphs for the
    uniform-decode batches up to ``cuda_graph_max_bs`` requests (each
    ``draft_token_num`` tokens: the verified slots) -- the sizes asked for; the release
    resolves its own list (0.34.0 replaces them with its default sizes)."""
    per_req = args.draft_token_num
    return {"mode": 0, "cudagraph_mode": FULL_DECODE_ONLY,
            "cudagraph_capture_sizes": [per_req * b for b in range(1, args.cuda_graph_max_bs + 1)]}


def wants_graphs(vllm_config) -> bool:
    from vllm.config.compilation import CUDAGraphMode
    return vllm_config.compilation_config.cudagraph_mode != CUDAGraphMode.NONE


@contextlib.contextmanager
def names(device) -> Iterator[None]:
    """``torch.cuda``'s graph names answered by the simulator while the block runs (on a
    GPU: nothing changes)."""
    mod = torch.get_device_module(torch.device(device))
    if mod is torch.cuda:
        yield
        return
    answers = {"CUDAGraph": mod.CUDAGraph, "graph": mod.graph,
               "graph_pool_handle": mod.graph_pool_handle,
               "mem_get_info": lambda *a, **k: (SIM_MEMORY, SIM_MEMORY),
               "empty_cache": mod.empty_cache}
    saved = {name: getattr(torch.cuda, name) for name in answers}
    for name, value in answers.items():
        setattr(torch.cuda, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(torch.cuda, name, value)
