"""A maintainer's repro of vLLM's seq-lens race (docs/vllm-target.md, ``vllm-seq-lens-shadow``;
0.17.0-0.18.0): torch and the installed vLLM, imported for real (a python-only vLLM gets
its base platform first: _repro_support.py).

The racing pair:

* the read -- ``CpuGpuBuffer.copy_to_gpu`` (``vllm/v1/utils.py``), upstream's own: the
  runner's pinned ``seq_lens`` staging buffer (``GPUModelRunner.seq_lens``, int32, built
  by ``_make_buffer`` as here) uploaded non-blocking on the main stream for the target
  forward (``gpu_model_runner.py``, ``self.seq_lens.copy_to_gpu(num_reqs)``);
* the write -- the drafter's first proposal in a step with no drafts to verify
  increments ``common_attn_metadata._seq_lens_cpu`` in place (``spec_decode/eagle.py``,
  0.17.0 line 581: ``common_attn_metadata._seq_lens_cpu += 1``), and up to 0.18.0 that
  tensor *is* the staging buffer. The statement sits inside EAGLE's
  ``SpecDecodeBaseProposer.propose``, which needs a loaded drafter; the repro runs that
  statement on the same buffer (and ``UPSTREAM_STATEMENTS`` names it, so a release that
  moves it fails the CPU test).

A target forward that read ``seq_len + 1`` is stale. No stall is injected;
``--forward-us N`` puts N us of work on the main stream ahead of the upload (the previous
step's forward still running under async scheduling; default 0); ``--load bulk-h2d`` puts
bulk host-to-device copies on another stream. Prints one JSON line. ``--device cpu``: a
smoke run of the same calls (every copy ordered: 0 stale by construction).

    python3 repro_vllm_seq_lens_shadow.py [--trials 200] [--device cuda] [--forward-us 0]
"""
from __future__ import annotations

import os
import sys
import threading

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _repro_support as rs  # noqa: E402

UPSTREAM_NAMES = ("vllm.v1.utils:CpuGpuBuffer.copy_to_gpu",
                  "vllm.v1.spec_decode.eagle:SpecDecodeBaseProposer.propose")
UPSTREAM_STATEMENTS = (("vllm/v1/spec_decode/eagle.py",
                        "common_attn_metadata._seq_lens_cpu += 1"),)
NUM_REQS = 8


class BulkH2D(rs.BulkD2H):
    """Bulk host-to-device copies on another stream (weight or KV prefetch traffic)."""

    def _run(self) -> None:
        src = torch.empty(self.mib << 20, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(self.mib << 20, dtype=torch.uint8, device="cuda")
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            while not self.stop.is_set():
                dst.copy_(src, non_blocking=True)
                stream.synchronize()


def trials(n: int, dev: rs.Device, CpuGpuBuffer, forward_us: float) -> int:
    main = dev.stream()
    seq_lens = CpuGpuBuffer(NUM_REQS, dtype=torch.int32, device=dev.device,
                            pin_memory=dev.pinned)
    stale = 0
    for step in range(1, n + 1):
        seq_lens.np[:NUM_REQS] = step  # _prepare_inputs fills the staging buffer
        with dev.on(main):
            dev.stall_us(forward_us)  # work queued ahead: the previous step's forward
            seq_lens.copy_to_gpu(NUM_REQS)  # upstream's non-blocking upload
            read = seq_lens.gpu[:NUM_REQS].clone()  # the target forward's attention reads it
        shadow = seq_lens.cpu[:NUM_REQS]  # the drafter's common_attn_metadata._seq_lens_cpu
        shadow += 1  # eagle.py:581, in place on the staging buffer
        dev.synchronize()
        stale += int(read[0].item() != step)
    return stale


def main(argv=None) -> int:
    args = rs.parse(__doc__, argv, loads=("none", "bulk-h2d"))
    platform = rs.vllm_platform()
    from vllm.v1.utils import CpuGpuBuffer
    import vllm.v1.spec_decode.eagle  # noqa: F401  (the write's module imports here too)
    return rs.measure("vllm-seq-lens-shadow", "vllm", args, UPSTREAM_NAMES,
                      lambda dev: trials(args.trials, dev, CpuGpuBuffer, args.forward_us),
                      kinds={"bulk-h2d": BulkH2D}, platform=platform)


if __name__ == "__main__":
    sys.exit(main())
