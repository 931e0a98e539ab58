"""Candidate fixes for upstream findings: each a run-time source patch of one upstream
function, applied for one run like a mutation (a scenario variant names it: ``with_fix``;
the sglang target's ``fixes()``). They are what ``reports/upstream/findings/`` proposes to
upstream's maintainers, shown to remove the race and keep the outputs equal to the synchronous
reference; the installed files are never edited.
"""
from __future__ import annotations

from typing import Dict, Union

from seams.sourcepatch import FirstFitting, SourcePatch

_OU = "sglang.srt.managers.overlap_utils"
_SCHED = "sglang.srt.managers.scheduler:Scheduler"

FIXES: Dict[str, Union[SourcePatch, FirstFitting]] = {
    # findings/confidence-ring-war.md: the forward stream waits for the last ring copy
    # before it overwrites the buffer that copy reads
    "ring-copy-fenced": SourcePatch(
        f"{_OU}:ConfidenceRelay.scatter",
        (("        self.confidence_buf[indices] = confidence.to(self.confidence_buf.dtype)\n",
          "        if self.copy_done is not None and self.ring_pos > 0:\n"
          "            # the last ring copy may still read confidence_buf (D2H stream)\n"
          "            last = (self.ring_pos - 1) % CONFIDENCE_RELAY_RING_DEPTH\n"
          "            torch.get_device_module(self.device).current_stream().wait_event(\n"
          "                self.copy_done[last]\n"
          "            )\n"
          "        self.confidence_buf[indices] = confidence.to(self.confidence_buf.dtype)\n"),),
        "fix ring-copy-fenced"),
    # findings/graph-result-readback.md: the next forward (and its graph replay, which
    # rewrites the static result buffers) waits for the result readbacks queued so far
    "forward-waits-result-copy": FirstFitting((
        # 0.5.23: the wait ahead of its GPU-only-lens branch
        SourcePatch(
            f"{_SCHED}.run_batch",
            (("                    self.forward_stream.wait_stream(self.schedule_stream)\n"
              "                    if gpu_only_lens:\n",
              "                    self.forward_stream.wait_stream(self.schedule_stream)\n"
              "                    self.forward_stream.wait_stream(self.copy_stream)\n"
              "                    if gpu_only_lens:\n"),),
            "fix forward-waits-result-copy"),
        # 0.5.19-0.5.22: the same wait, where their run_batch resolves the batch's inputs
        SourcePatch(
            f"{_SCHED}.run_batch",
            (("                    self.forward_stream.wait_stream(self.schedule_stream)\n"
              "                    # resolve consumes SB staging",
              "                    self.forward_stream.wait_stream(self.schedule_stream)\n"
              "                    self.forward_stream.wait_stream(self.copy_stream)\n"
              "                    # resolve consumes SB staging"),),
            "fix forward-waits-result-copy (0.5.19-0.5.22)")),
        "fix forward-waits-result-copy"),
    # The two cheaper fixes of the same readback race, for the results upstream itself
    # knows hold graph views (its own test in _copy_result_to_cpu: hidden states, DSpark):
    # (1) clone the graph's outputs on the forward stream, behind this forward and ahead
    # of the next replay, and read the clones -- the copy stays a leaf; ...
    "clone-graph-outputs": SourcePatch(
        f"{_SCHED}._copy_result_to_cpu",
        (("        self.copy_stream.wait_stream(self.forward_stream)\n",
          "        if batch.return_hidden_states or batch.spec_algorithm.is_dspark():\n"
          "            with self.forward_stream_ctx:  # behind this forward's replay\n"
          "                for name in (\"next_token_ids\", \"accept_lens\", \"block_accept_lens\"):\n"
          "                    t = getattr(batch_result, name, None)\n"
          "                    if t is not None:\n"
          "                        setattr(batch_result, name, t.clone())\n"
          "                out = batch_result.logits_output\n"
          "                if out is not None and out.hidden_states is not None:\n"
          "                    out.hidden_states = out.hidden_states.clone()\n"
          "        self.copy_stream.wait_stream(self.forward_stream)\n"),),
        "fix clone-graph-outputs"),
    # ... (2) or make the next forward wait for this copy only when the result holds
    # graph views: every other step keeps the overlap PR #29075 built
    "forward-waits-graph-result-copy": SourcePatch(
        f"{_SCHED}._copy_result_to_cpu",
        (("            else:\n"
          "                batch_result.copy_done = self.async_d2h_worker.submit(copy_fn)\n",
          "            else:\n"
          "                batch_result.copy_done = self.async_d2h_worker.submit(copy_fn)\n"
          "        if batch.return_hidden_states or batch.spec_algorithm.is_dspark():\n"
          "            # the next replay rewrites what this copy reads\n"
          "            self.forward_stream.wait_stream(self.copy_stream)\n"),),
        "fix forward-waits-graph-result-copy"),
}

