"""A maintainer's repro of DSpark's confidence ring race (confidence-ring-war.md): torch
and the installed sglang, imported for real (see _repro_support.py for the absent
GPU-only packages).

The racing pair is upstream's own ``ConfidenceRelay`` (managers/overlap_utils.py, 0.5.16
on), called as ``FutureMap`` calls it:

* the read -- ``ConfidenceRelay.issue_ring_copy``: the private D2H stream waits for the
  publish event, then copies ``confidence_buf`` into the pinned ring slot and records
  ``copy_done``;
* the write -- ``ConfidenceRelay.scatter`` of the *next* forward, on the forward stream,
  which never waits on ``copy_done`` (in the server only ``resolve_seq_lens_cpu``'s
  synchronize orders them, and it returns early when the attention backend declares
  ``needs_cpu_seq_lens = False``, as DeepSeek-V4's does under DSpark; this repro has no
  such sync).

A ring slot that holds the next step's confidence is stale. No stall is injected;
``--forward-us N`` gives the next forward N us of work before its scatter (default 0:
right behind the publish, the tightest window); ``--load bulk-d2h`` puts bulk D2H copies
on another stream. Prints one JSON line. ``--device cpu``: upstream builds no ring off
CUDA (``resolve`` reads ``confidence_buf`` itself); the smoke run calls scatter,
``issue_ring_copy`` and ``resolve`` on that path (0 stale by construction).

    python3 repro_confidence_ring_war.py [--trials 200] [--device cuda] [--load none,bulk-d2h]
"""
from __future__ import annotations

import os
import sys
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _repro_support as rs  # noqa: E402

UPSTREAM_NAMES = ("sglang.srt.managers.overlap_utils:ConfidenceRelay.scatter",
                  "sglang.srt.managers.overlap_utils:ConfidenceRelay.issue_ring_copy",
                  "sglang.srt.managers.overlap_utils:ConfidenceRelay.resolve")
POOL, GAMMA, BS = 64, 4, 8


def trials(n: int, dev: rs.Device, overlap_utils, forward_us: float) -> int:
    fwd, d2h = dev.stream(), dev.stream()
    pool = types.SimpleNamespace(req_generation=torch.zeros(POOL, dtype=torch.int64))
    relay = overlap_utils.ConfidenceRelay(device=dev.device, req_pool_size=POOL, pool=pool)
    idx = torch.arange(BS, device=dev.device)
    batch = types.SimpleNamespace(  # what resolve reads on the ring-less (CPU) path
        spec_info=types.SimpleNamespace(future_indices=idx), req_pool_indices=idx,
        req_pool_indices_cpu=idx.cpu())
    on_gpu = dev.kind == "cuda"
    stale = 0
    for step in range(1, n + 1):
        with dev.on(fwd):
            relay.scatter(idx, torch.full((BS, GAMMA), float(step), device=dev.device))
            published = dev.event()
            published.record()  # FutureMap.publish's event
        relay.issue_ring_copy(stream=d2h if on_gpu else None,
                              publish_ready=published if on_gpu else None)
        with dev.on(fwd):
            dev.stall_us(forward_us)  # the next forward's work before its scatter
            relay.scatter(idx, torch.full((BS, GAMMA), float(step + 10_000),
                                          device=dev.device))
        if on_gpu:
            slot = (relay.ring_pos - 1) % overlap_utils.CONFIDENCE_RELAY_RING_DEPTH
            relay.copy_done[slot].synchronize()
            seen = relay.conf_ring[slot][0, 0].item()
        else:  # no ring: what resolve hands the planner is read now, in order
            with dev.on(fwd):
                relay.scatter(idx, torch.full((BS, GAMMA), float(step), device=dev.device))
            seen = relay.resolve(batch, stream=None, publish_ready=None).confidence[0, 0].item()
        stale += int(seen != step)
        dev.synchronize()
    return stale


def main(argv=None) -> int:
    args = rs.parse(__doc__, argv, loads=("none", "bulk-d2h"))
    stood_in = rs.sglang_stand_ins()
    from sglang.srt.managers import overlap_utils
    return rs.measure("dspark-confidence-ring", "sglang", args, UPSTREAM_NAMES,
                      lambda dev: trials(args.trials, dev, overlap_utils, args.forward_us),
                      ring=bool(overlap_utils._is_cuda), stood_in=stood_in)


if __name__ == "__main__":
    sys.exit(main())
