"""A maintainer's repro of the ``return_hidden_states`` readback race
(ngram-hidden-readback.md): torch and the installed sglang, imported for real (see
_repro_support.py for the absent GPU-only packages).

The racing pair is upstream's own code, called as the scheduler calls it:

* the readback -- ``Scheduler._copy_result_to_cpu`` (scheduler.py) with a batch that asks
  for hidden states: ``GenerationBatchResult.copy_to_cpu`` (managers/utils.py) copies
  ``logits_output.hidden_states`` (a ``LogitsProcessorOutput``) with ``async_d2h`` on the
  copy stream, which only waited for the forward that produced it;
* the next decode step -- the decode graph's replay on the forward stream, which rewrites
  the static ``hidden_states`` output those hidden states are a slice of
  (``decode_cuda_graph_runner.py``: ``output.hidden_states[: self.raw_num_token]``).

No stall is injected (``--forward-us N``: the next forward's work before it rewrites the
buffer; default 0); ``--load bulk-d2h`` adds bulk device-to-host copies on a second
stream. In the server NGRAM's draft prep syncs a D2H of its own before the next replay,
which drains the copy engine's queue (the write-up: 0 stale on the simulator and on an
H100); this repro has no such sync, so it measures the pair alone -- what a worker without
that sync (plain decode, another algorithm) would see. Prints one JSON line; ``--device
cpu`` is a smoke run of the same upstream calls (0 stale by construction).

    python3 repro_ngram_hidden_readback.py [--trials 200] [--device cuda] [--load none,bulk-d2h]
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
BS, HIDDEN = 16, 128  # the toy's smallest decode bucket, float32 hidden states


def trials(n, dev, Scheduler, GenerationBatchResult, LogitsProcessorOutput,
           forward_us: float = 0.0) -> int:
    batch = types.SimpleNamespace(return_logprob=False, return_hidden_states=True)
    tokens = torch.zeros(BS, dtype=torch.int64, device=dev.device)

    def result(out):  # decode k: hidden states are a slice of its output
        logits = LogitsProcessorOutput(next_token_logits=None, hidden_states=out[:BS])
        return GenerationBatchResult(logits_output=logits, next_token_ids=tokens)

    return rs.readback_trials(dev, n, Scheduler, (BS, HIDDEN), torch.float32, batch, result,
                              lambda r: r.logits_output.hidden_states[0, 0].item(), forward_us)


def main(argv=None) -> int:
    args = rs.parse(__doc__, argv, loads=("none", "bulk-d2h"))
    stood_in = rs.sglang_stand_ins()
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.utils import GenerationBatchResult
    return rs.measure("ngram-hidden-readback", "sglang", args, UPSTREAM_NAMES, lambda dev: trials(
        args.trials, dev, Scheduler, GenerationBatchResult, LogitsProcessorOutput,
        args.forward_us), stood_in=stood_in)


if __name__ == "__main__":
    sys.exit(main())
