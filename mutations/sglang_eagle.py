"""Seeded bugs in the installed sglang's EAGLE v2 code: run-time source patches
of upstream's ``EagleDraftInput``, ``EAGLEWorkerV2`` / ``EagleDraftWorker`` and
``run_eagle_verify``, as in ``sglang.py`` (whose helper they use). Probed on the
``eagle-v2`` scenario (``targets/sglang/slices/eagle.py``): the release as it is, with upstream's
plan streams, and a tree draft (topk 2).
"""
from __future__ import annotations

from typing import List

from mutations import Mutation
from mutations.sglang import M

EAGLE = ("eagle-v2", "eagle-v2-lazy", "eagle-v2-plan", "eagle-v2-plan-lazy",
         "eagle-v2-topk2", "eagle-v2-topk2-plan-lazy")
EAGLE_PLAN = ("eagle-v2-plan", "eagle-v2-plan-lazy", "eagle-v2-topk2-plan-lazy")
EAGLE_TREE = ("eagle-v2-topk2", "eagle-v2-topk2-plan-lazy")
_EAGLE_INFO = "sglang.srt.speculative.eagle_info:EagleDraftInput"
_EAGLE_V2 = "sglang.srt.speculative.eagle_worker_v2"
_EAGLE_COMMON = "sglang.srt.speculative.eagle_worker_common"

MUTATIONS: List[Mutation] = [
    M("eagle-verify-lifetime-dropped",
      "run_eagle_verify neither marks the plan stream's rebinds as used on the forward "
      "stream nor parks the verify's forward batch: nothing holds the blocks the verify "
      "still reads once the host drops them",
      "upstream's record_stream / extra_keep_alive_refs", f"{_EAGLE_COMMON}:run_eagle_verify",
      [("    record_stream_each((batch.input_ids, batch.out_cache_loc), fwd_stream)\n", ""),
       ("        extra_keep_alive_refs=[verify_forward_batch],\n",
        "        extra_keep_alive_refs=None,\n")],
      EAGLE_PLAN,
      equivalent="in every configuration driven (plan stream on; topk 1 and 2; eager and "
                 "lazy) each allocation that could take a block the verify reads is "
                 "ordered after the verify: the forward stream's by program order, the "
                 "plan stream's by run_eagle_verify's plan_stream.wait_stream(fwd_stream) "
                 "before each plan -- record_stream and the keep-alive are defence in "
                 "depth there (without that wait the trace shows 11-13 reuse races)"),
    M("eagle-filter-keeps-future-indices",
      "EagleDraftInput.filter_batch returns without slicing future_indices: the resolve "
      "gathers the relayed bonus tokens and draft state of finished requests' rows",
      "M10 (EAGLE)", f"{_EAGLE_INFO}.filter_batch",
      [("            self.future_indices = self.future_indices[new_indices]\n"
        "            return\n", "            return\n")],
      EAGLE),
    M("eagle-merge-order-swapped",
      "EagleDraftInput.merge_batch concatenates the future indices in the other batch's "
      "order: each request resolves another's relayed state",
      "M4 (EAGLE)", f"{_EAGLE_INFO}.merge_batch",
      [("                [self.future_indices, spec_info.future_indices]\n",
        "                [spec_info.future_indices, self.future_indices]\n")],
      EAGLE),
    M("eagle-verify-plan-not-joined",
      "run_eagle_verify launches the target verify without waiting for the plan stream's "
      "verify preparation (input ids, cache locations, positions)",
      "upstream PR #17033 (plan stream)", f"{_EAGLE_COMMON}:run_eagle_verify",
      [("        torch.get_device_module(device).current_stream().wait_stream(plan_stream)\n",
        "        pass\n")],
      EAGLE_PLAN),
    M("eagle-verify-plan-starts-early",
      "the plan stream prepares the verify without waiting for the draft frontier: it "
      "copies tree metadata the draft has not written yet",
      "upstream PR #17033 (plan stream)", f"{_EAGLE_COMMON}:run_eagle_verify",
      [("            plan_stream.wait_stream(fwd_stream)\n", "            pass\n")],
      EAGLE_PLAN),
    M("eagle-draft-extend-plan-not-joined",
      "_draft_extend_for_decode runs the draft extend without waiting for the plan "
      "stream's preparation of its inputs",
      "upstream PR #17033 (plan stream)",
      f"{_EAGLE_V2}:EagleDraftWorker._draft_extend_for_decode",
      [("            torch.get_device_module(self.device).current_stream().wait_stream(\n"
        "                self.plan_stream\n"
        "            )\n", "            pass\n")],
      EAGLE_PLAN),
    M("eagle-draft-extend-plan-starts-early",
      "the plan stream prepares the draft extend without waiting for the verify: it reads "
      "accept lengths and tokens the verify has not written yet",
      "upstream PR #17033 (plan stream)",
      f"{_EAGLE_V2}:EagleDraftWorker._draft_extend_for_decode",
      [("            self.plan_stream.wait_stream(\n"
        "                torch.get_device_module(self.device).current_stream()\n"
        "            )\n", "            pass\n")],
      EAGLE_PLAN),
    M("eagle-read-done-from-target-runner",
      "EAGLEWorkerV2.last_shared_read_runner names the target runner: the WAR barrier "
      "waits for the verify's reads, and the draft extend reads the rows after it unfenced",
      "PR #34052 (last_shared_read_runner)",
      f"{_EAGLE_V2}:EAGLEWorkerV2.last_shared_read_runner",
      [("        return self._draft_worker.draft_runner\n",
        "        return self._target_worker.model_runner\n")],
      EAGLE),
    M("eagle-tree-path-not-compacted",
      "run_eagle_verify skips _finalize_accept_tree_path for a tree draft: the accepted "
      "path stays scattered over the tree, where the commit and the draft extend read a "
      "chain (and its KV is not moved to the window's front)",
      "topk > 1 (eagle_worker_common)", f"{_EAGLE_COMMON}:run_eagle_verify",
      [("    if finalize_tree_path and not batch.forward_mode.is_idle() and topk > 1:\n",
        "    if False:\n")],
      EAGLE_TREE),
    M("eagle-publish-dropped",
      "EAGLEWorkerV2.forward_batch_generation does not publish the verify's new seq lens: "
      "the next launch plans with the lengths an earlier step published",
      "PR #35198 (publish fence)", f"{_EAGLE_V2}:EAGLEWorkerV2.forward_batch_generation",
      [("            # Publish before draft_extend so the fence is at verify-end.\n"
        "            if on_publish is not None:\n"
        "                on_publish(batch_output.new_seq_lens)\n",
        "            # Publish before draft_extend so the fence is at verify-end.\n")],
      EAGLE),
    M("eagle-grammar-barrier-skipped",
      "Scheduler._advance_pending_grammar advances nothing: the verify builds its grammar "
      "mask from an FSM that has not seen the previous step's committed tokens",
      "spec-v2 grammar barrier", "sglang.srt.managers.scheduler:Scheduler._advance_pending_grammar",
      [("        for prev_batch, prev_result in self.result_queue:\n"
        "            self.batch_result_processor.advance_grammar_fsm(prev_result, prev_batch)\n",
        "        pass\n")],
      ("eagle-v2-grammar",)),
    # Examined and left out: dropping the record_stream of the relayed future indices in
    # FutureMap._resolve_spec_extras survives every EAGLE probe -- as upstream's own FIXME
    # there says, the batch pins them two iterations (record_batch_in_overlap), so the
    # allocator cannot hand their block out while the forward reads it
    # (docs/sglang-target.md#eagle-v2).
]
