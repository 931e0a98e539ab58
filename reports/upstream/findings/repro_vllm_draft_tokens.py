"""A maintainer's repro of Model Runner V2's draft-token copy race (docs/vllm-target.md,
``vllm-draft-tokens``; vllm-0.34.0-audit S4: shipped in 0.16.0-0.19.1 with
``VLLM_USE_V2_MODEL_RUNNER=1``, one speculative token and structured outputs): torch and
the installed vLLM, imported for real (a python-only vLLM gets its base platform first:
_repro_support.py).

The racing pair is upstream's own ``DraftTokensHandler`` (``vllm/v1/worker/gpu/
spec_decode/utils.py``): ``set_draft_tokens`` makes its copy stream wait on the main
stream and queues ``async_copy_to_np(draft_tokens)`` there -- the drafts a main-stream
temporary, with no ``record_stream`` before 0.24.0 -- and ``get_draft_tokens`` waits on
the copy's event once the engine has launched the next step. When the speculator drops
its output, the next step's main-stream allocation of the same size takes its block
(the caching allocator knows of no other stream's use) and may be written before the
copy has read it: the host gets the next step's drafts.

No stall is injected; ``--forward-us N`` gives the copy stream N us of work ahead of the
copy (a copy engine busy with earlier transfers; default 0); ``--load bulk-d2h`` puts bulk
D2H copies on another stream. Prints one JSON line. On a CPU the handler cannot be built
(its ``__init__`` makes a ``torch.cuda.Stream``): ``--device cpu`` imports the module and
checks the pair's methods, and prints no rate.

    python3 repro_vllm_draft_tokens.py [--trials 200] [--device cuda] [--load none,bulk-d2h]
"""
from __future__ import annotations

import os
import sys
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _repro_support as rs  # noqa: E402

UPSTREAM_NAMES = ("vllm.v1.worker.gpu.spec_decode.utils:DraftTokensHandler.set_draft_tokens",
                  "vllm.v1.worker.gpu.spec_decode.utils:DraftTokensHandler.get_draft_tokens")
NUM_REQS, NUM_DRAFT = 8, 1


def trials(n: int, dev: rs.Device, DraftTokensHandler, forward_us: float) -> int:
    handler = DraftTokensHandler(dev.device)
    batch = types.SimpleNamespace(req_ids=[f"r{i}" for i in range(NUM_REQS)],
                                  has_structured_output_reqs=True)
    stale = 0
    for step in range(1, n + 1):
        drafts = torch.full((NUM_REQS, NUM_DRAFT), step, dtype=torch.int64,
                            device=dev.device)  # the speculator's output, a temporary
        with dev.on(handler.copy_stream):
            dev.stall_us(forward_us)  # earlier transfers on the copy engine
        handler.set_draft_tokens(batch, drafts)  # upstream's copy, on its side stream
        del drafts  # the speculator drops it; its block is free for the main stream
        nxt = torch.full((NUM_REQS, NUM_DRAFT), step + 10_000, dtype=torch.int64,
                         device=dev.device)  # the next step's drafts, same size
        got = handler.get_draft_tokens().draft_token_ids  # upstream's wait and read
        stale += int(got[0][0] != step)
        del nxt
        dev.synchronize()
    return stale


def main(argv=None) -> int:
    args = rs.parse(__doc__, argv, loads=("none", "bulk-d2h"))
    platform = rs.vllm_platform()
    from vllm.v1.worker.gpu.spec_decode.utils import DraftTokensHandler
    if args.device == "cpu":
        missing = [m for m in ("set_draft_tokens", "get_draft_tokens")
                   if not callable(getattr(DraftTokensHandler, m, None))]
        rs.report("vllm-draft-tokens", "vllm", rs.Device("cpu"), args.trials, {},
                  UPSTREAM_NAMES, stall="none", platform=platform, missing=missing,
                  not_run="DraftTokensHandler builds a torch.cuda.Stream: no CPU run")
        return 1 if missing else 0
    return rs.measure("vllm-draft-tokens", "vllm", args, UPSTREAM_NAMES,
                      lambda dev: trials(args.trials, dev, DraftTokensHandler, args.forward_us),
                      platform=platform)


if __name__ == "__main__":
    sys.exit(main())
