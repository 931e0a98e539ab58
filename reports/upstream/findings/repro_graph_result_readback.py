"""A maintainer's repro of the DSpark graph-output readback race (graph-result-readback.md):
torch and the installed sglang, imported for real (see _repro_support.py for the absent
GPU-only packages).

The racing pair is upstream's own code, called as the scheduler calls it:

* the readback -- ``Scheduler._copy_result_to_cpu`` (scheduler.py, 0.5.18 on), called
  unbound on an object with the attributes it reads: ``copy_stream.wait_stream(
  forward_stream)``, then ``GenerationBatchResult.copy_to_cpu`` (managers/utils.py) on the
  copy stream, ``async_d2h`` per field; nothing makes the next forward wait for it;
* the next forward -- a CUDA graph replay on the forward stream that rewrites the static
  output buffer the result's fields are views of (what the DSpark folded epilogue's
  ``out_tokens_buf`` / ``commit_lens_buf`` / ``block_accept_lens`` are).

No stall is injected; ``--forward-us N`` gives the next forward N us of work before it
rewrites the buffer (default 0: right behind, the tightest window). ``--load bulk-d2h``
adds a second stream doing bulk device-to-host copies (KV offload / HiCache write-back):
the readback queues behind it on the copy engine.
Prints one JSON line, the stale count per load (``"k/N"``). ``--device cpu`` is a smoke run
of the same upstream calls (sglang captures no graph on a CPU: each forward writes a fresh
output, every copy is ordered, 0 stale is the only right answer).

    python3 repro_graph_result_readback.py [--trials 200] [--device cuda] [--load none,bulk-d2h]
"""
from __future__ import annotations

import os
import sys
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _repro_support as rs  # noqa: E402

UPSTREAM_NAMES = ("sglang.srt.managers.scheduler:Scheduler._copy_result_to_cpu",
                  "sglang.srt.managers.utils:GenerationBatchResult.copy_to_cpu")
BS, K = 8, 4


def trials(n: int, dev: rs.Device, Scheduler, GenerationBatchResult,
           forward_us: float = 0.0) -> int:
    batch = types.SimpleNamespace(return_logprob=False, return_hidden_states=False)
    return rs.readback_trials(
        dev, n, Scheduler, (BS, K), torch.int64, batch,
        # forward k's result is a view of its output, as the folded epilogue's buffers are
        lambda out: GenerationBatchResult(next_token_ids=out.view(-1), accept_lens=out[:, 0]),
        lambda result: result.next_token_ids[0].item(), forward_us)


def main(argv=None) -> int:
    args = rs.parse(__doc__, argv, loads=("none", "bulk-d2h"))
    stood_in = rs.sglang_stand_ins()
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.utils import GenerationBatchResult
    return rs.measure("dspark-result-readback", "sglang", args, UPSTREAM_NAMES, lambda dev: trials(
        args.trials, dev, Scheduler, GenerationBatchResult, args.forward_us), stood_in=stood_in)


if __name__ == "__main__":
    sys.exit(main())
