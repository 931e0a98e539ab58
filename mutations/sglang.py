"""Seeded bugs in the installed sglang: each a run-time source patch of one upstream
function (``seams.sourcepatch``), applied for one run and reverted -- the installed
files are never edited. Snippets are upstream's own lines (sglang 0.5.23); a release that
moves them makes the mutation a harness error, never a silent pass.

They follow the bug classes of the impl catalogue (the seeds' risk lists, the digest's
M-numbers), expressed against the real relay, filter/merge, the FutureMap's private D2H
stream and pinned mirror, the result copy and the fence.
"""
from __future__ import annotations

import dataclasses
from typing import List

from mutations import BY_NAME as _IMPL
from mutations.base import M, Mutation

_NGRAM = "sglang.srt.speculative.ngram_info:NgramVerifyInput"
_FM = "sglang.srt.managers.overlap_utils:FutureMap"
_SB = "sglang.srt.managers.schedule_batch:ScheduleBatch"
_SCHED = "sglang.srt.managers.scheduler:Scheduler"
_RESULT = "sglang.srt.managers.utils:GenerationBatchResult"
_BRP = ("sglang.srt.managers.scheduler_components.batch_result_processor:"
        "SchedulerBatchResultProcessor")

_SPEC = "sglang.srt.speculative.spec_utils"

SEED = ("seed-eager", "seed-lazy", "seed-stall")
GRAMMAR = ("grammar-ngram", "grammar-eagle", "eagle-v2-grammar")
SLOT_REUSE = ("slot-reuse", "slot-reuse-stall")
KV_REUSE = ("kv-reuse", "kv-reuse-lazy")
KV_REUSE_SWA = ("kv-reuse-swa", "kv-reuse-swa-lazy")
KV_RETRACT = ("kv-retract", "kv-retract-lazy", "eagle-v2-retract", "kv-pressure")
KV_CHUNKED = ("kv-chunked", "kv-chunked-lazy", "eagle-v2-chunked")
# the DSpark slice, in the release's ordering configurations (clean as shipped)
DSPARK_RING = ("dspark-ring", "dspark-ring-lazy", "dspark-ring-random", "dspark-ring-fixed")
DSPARK_RELAY = ("dspark-readback", "dspark-ring")


MUTATIONS: List[Mutation] = [
    # --- the relay and filter/merge (PR #35198) ---------------------------------
    M("filter-gathers-accept-on-schedule",
      "NgramVerifyInput.filter_batch gathers accept_tokens/accept_lens on the schedule "
      "stream again (the pre-#35198 slice), fine fence",
      "PR #35198 / M1", f"{_NGRAM}.filter_batch",
      [("            self.future_indices = self.future_indices[new_indices]\n"
        "            return\n",
        "            self.future_indices = self.future_indices[new_indices]\n")],
      SEED),
    M("merge-cats-accept-on-schedule",
      "NgramVerifyInput.merge_batch concatenates accept state on the schedule stream again",
      "PR #35198 / M1", f"{_NGRAM}.merge_batch",
      [("                (self.future_indices, spec_info.future_indices), dim=0\n"
        "            )\n"
        "            return\n",
        "                (self.future_indices, spec_info.future_indices), dim=0\n"
        "            )\n")],
      SEED + ("mixed-overlap", "slot-reuse", "kv-retract", "kv-chunked"),
      equivalent="upstream's loop merges a prefilled batch in the iteration after its "
                 "extend forward, and an extend publishes no read-done: that barrier is "
                 "the coarse fallback, so the merge's gather on the schedule stream is "
                 "behind every forward (the fine fence never covers a merge)"),
    M("stash-skips-ngram",
      "FutureMap.stash returns for ngram: the resolve gathers rows nobody wrote",
      "M2", f"{_FM}.stash",
      [("        if self.spec_algo.is_ngram():\n"
        "            self._maybe_init_ngram_bufs(payload)\n",
        "        if self.spec_algo.is_ngram():\n"
        "            self._maybe_init_ngram_bufs(payload)\n"
        "            return\n")],
      SEED),
    M("resolve-skips-ngram",
      "FutureMap._resolve_spec_extras returns for ngram: draft prep reads the unfiltered "
      "accept state the batch carried",
      "M3", f"{_FM}._resolve_spec_extras",
      [("            draft_input.accept_tokens = self.accept_tokens_buf[indices].flatten()\n"
        "            draft_input.accept_lens = self.accept_lens_buf[indices]\n", "")],
      SEED),
    M("future-indices-not-filtered",
      "NgramVerifyInput.filter_batch returns without slicing future_indices",
      "M10", f"{_NGRAM}.filter_batch",
      [("            self.future_indices = self.future_indices[new_indices]\n"
        "            return\n", "            return\n")],
      SEED),
    M("merge-order-swapped",
      "NgramVerifyInput.merge_batch concatenates future_indices as (other, self), unlike "
      "the requests",
      "M10", f"{_NGRAM}.merge_batch",
      [("(self.future_indices, spec_info.future_indices)",
        "(spec_info.future_indices, self.future_indices)")],
      SEED),
    # --- the result copy (copy stream, copy_done) ----------------------------------------
    M("copy-without-waiting-forward",
      "Scheduler._copy_result_to_cpu does not make the copy stream wait on the forward "
      "stream before the result D2H",
      "M6", f"{_SCHED}._copy_result_to_cpu",
      [("        self.copy_stream.wait_stream(self.forward_stream)\n", "")],
      SEED),
    M("copy-done-not-recorded",
      "GenerationBatchResult.copy_to_cpu never records copy_done: the host's "
      "synchronize() waits for nothing",
      "M5", f"{_RESULT}.copy_to_cpu",
      [("        self.copy_auxiliary_output_to_cpu()\n\n        self.copy_done.record()\n",
        "        self.copy_auxiliary_output_to_cpu()\n")],
      SEED),
    M("copy-done-before-copies",
      "GenerationBatchResult.copy_to_cpu records copy_done before the D2H copies",
      "M5", f"{_RESULT}.copy_to_cpu",
      [("        if return_logprob:\n            if self.logits_output.next_token_logprobs",
        "        self.copy_done.record()\n        if return_logprob:\n"
        "            if self.logits_output.next_token_logprobs"),
       ("        self.copy_auxiliary_output_to_cpu()\n\n        self.copy_done.record()\n",
        "        self.copy_auxiliary_output_to_cpu()\n")],
      SEED),
    # --- the FutureMap's private D2H stream and pinned mirror ----------------------------
    M("d2h-stream-skips-publish-wait",
      "resolve_seq_lens_cpu copies new_seq_lens_buf on the private D2H stream without "
      "waiting on publish_ready",
      "M4", f"{_FM}.resolve_seq_lens_cpu",
      [("        # Mechanism: don't sync the schedule stream; gate a private stream on the\n"
        "        # publish event and copy into the static pinned buffer.\n"
        "        self.fwd_prepare_d2h_stream.wait_event(self.publish_ready)\n",
        "        # Mechanism: don't sync the schedule stream; gate a private stream on the\n"
        "        # publish event and copy into the static pinned buffer.\n")],
      SEED),
    M("pinned-mirror-read-before-sync",
      "resolve_seq_lens_cpu reads the pinned seq_lens mirror on the host without waiting "
      "for its D2H copy",
      "M5", f"{_FM}.resolve_seq_lens_cpu",
      [("            self.new_seq_lens_cpu_pinned.copy_(self.new_seq_lens_buf, non_blocking=True)\n"
        "        self.fwd_prepare_d2h_stream.synchronize()\n",
        "            self.new_seq_lens_cpu_pinned.copy_(self.new_seq_lens_buf, non_blocking=True)\n")],
      SEED),
    M("publish-event-before-scatter",
      "FutureMap.publish records publish_ready before it scatters new_seq_lens",
      "M4", f"{_FM}.publish",
      [("        relay = self._relay\n        if relay is not None and new_seq_lens is "
        "relay.published_seq_lens:",
        "        if self.spec_algo.is_some():\n"
        "            if self.publish_ready is None:\n"
        "                self.publish_ready = torch.get_device_module(self.device).Event()\n"
        "            self.publish_ready.record()\n"
        "            self._publish_fresh = True\n"
        "        relay = self._relay\n        if relay is not None and new_seq_lens is "
        "relay.published_seq_lens:"),
       ("        # Only spec_v2 needs the event; it gates the seq_lens D2H on the private stream.\n"
        "        if self.spec_algo.is_some():\n"
        "            if self.publish_ready is None:\n"
        "                self.publish_ready = torch.get_device_module(self.device).Event()\n"
        "            self.publish_ready.record()\n"
        "            self._publish_fresh = True\n", "")],
      SEED),
    # --- grammar staging and traversal (PR #32393) ----------------------------------------
    M("tree-copy-no-event",
      "GrammarTree.from_device records no event: resolve() does not wait for the D2H copies",
      "PR #32393 / M21", f"{_SPEC}:GrammarTree.from_device",
      [("        return cls(host, done)\n", "        return cls(host, None)\n")],
      ("grammar-eagle", "eagle-v2-grammar")),
    M("tree-read-before-resolve",
      "GrammarTree.resolve returns the host tree without waiting on the event",
      "PR #32393 / M21", f"{_SPEC}:GrammarTree.resolve",
      [("            self._done.synchronize()\n", "            pass\n")],
      ("grammar-eagle", "eagle-v2-grammar")),
    M("stale-extend-mask",
      "build_grammar_vocab_mask does not clear the extend-stage sampling_info.grammar_mask",
      "PR #32393 / M14", f"{_SPEC}:build_grammar_vocab_mask",
      [("    sampling_info.grammar_mask = None\n", "")],
      GRAMMAR,
      equivalent="where the batch's sampling state is upstream's SamplingBatchInfo (0.5.22 "
                 "on, engine/worker.py sampling_info_for): the extend stage's mask is set "
                 "on the forward-only copy (copy_for_forward), which _forward_isolation "
                 "drops after the forward, so no later verify sees it -- the leak PR #32393 "
                 "closed cannot happen there. Before 0.5.22 (specrace's SamplingInfo "
                 "forwards itself) the stale mask reaches the verify and the probes kill "
                 "it (measured at 6d6058a: killed by a crash on grammar-ngram)"),
    M("missing-rollback",
      "traverse_tree never rolls an accepted node's token back",
      "M17", f"{_SPEC}:traverse_tree",
      [("                grammar.rollback(1)\n", "                pass\n")],
      GRAMMAR),
    M("child-tested-against-own-row",
      "traverse_tree tests a child's token against its own row instead of its parent's",
      "M16", f"{_SPEC}:traverse_tree",
      [("            parent_bitmask = allocate_token_bitmask[parent_pos]\n",
        "            parent_bitmask = allocate_token_bitmask[curr]\n")],
      GRAMMAR),
    M("descend-below-terminated",
      "traverse_tree fills rows and descends below a terminated grammar",
      "M19", f"{_SPEC}:traverse_tree",
      [("            if not grammar.is_terminated():\n", "            if True:\n")],
      GRAMMAR),
    # --- upstream's own loop (event_loop_overlap / run_batch), which drives the target --
    # (The WAR barrier moved before run_batch is not here: on the fixed relay it guards
    # no buffer of the toy engine yet -- no KV pool -- so no oracle can see it moved.)
    M("loop-processes-current-result",
      "event_loop_overlap processes the batch it just launched instead of the previous one "
      "(the host reads a result whose forward may still be running)",
      "upstream's loop", f"{_SCHED}.event_loop_overlap",
      [("                if not disable_overlap_for_batch:\n"
        "                    pop_and_process()\n",
        "                if not disable_overlap_for_batch:\n"
        "                    self.result_queue.rotate(1)\n"
        "                    pop_and_process()\n")],
      SEED),
    M("run-batch-resolve-before-wait",
      "run_batch resolves the relayed inputs before the forward stream waits on the "
      "schedule stream",
      "upstream's loop / M3", f"{_SCHED}.run_batch",
      [("                    self.forward_stream.wait_stream(self.schedule_stream)\n"
        "                    if gpu_only_lens:\n",
        "                    resolve_forward_inputs(batch, self.future_map)\n"
        "                    self.forward_stream.wait_stream(self.schedule_stream)\n"
        "                    if gpu_only_lens:\n")],
      SEED),
    # --- the memory pools behind the WAR barrier: upstream's ReqToTokenPool and
    # allocator, rows and slots reused; the forward is our toy's (targets.sglang.engine.worker)
    M("war-barrier-removed",
      "_apply_war_barrier orders nothing: the schedule stream rewrites req_to_token rows "
      "while the previous forward may not have gathered them",
      "PR #26380", f"{_SCHED}._apply_war_barrier",
      [("        if ev is not None and not envs.SGLANG_FORCE_COARSE_WAR_BARRIER.get():\n"
        "            self.schedule_stream.wait_event(ev)\n"
        "        else:\n"
        "            self.schedule_stream.wait_stream(self.forward_stream)\n",
        "        pass\n")],
      KV_REUSE + ("eagle-v2",)),  # and upstream's EAGLE worker (sglang_eagle.py)
    M("war-barrier-at-loop-top",
      "event_loop_overlap applies the WAR barrier at the loop's top, as before #31687: "
      "result processing after a launch -- a finished request's free clears its SWA "
      "mapping -- is not fenced behind the just-launched forward's reads",
      "PR #31687", f"{_SCHED}.event_loop_overlap",
      [("                # Fence result processing behind this forward's shared reads.\n"
        "                self._apply_war_barrier()\n", ""),
       ("            # Receive requests\n",
        "            self._apply_war_barrier()\n"
        "            # Receive requests\n")],
      KV_REUSE_SWA),
    M("seq-lens-mirror-batch-rows-only",
      "resolve_seq_lens_cpu copies only the batch's rows of new_seq_lens_buf into the front "
      "of the pinned mirror, then indexes the mirror by pool row: the launch plans with "
      "other requests' (or never-written) lengths",
      "FutureMap CPU mirror", f"{_FM}.resolve_seq_lens_cpu",
      [("            self.new_seq_lens_cpu_pinned.copy_(self.new_seq_lens_buf, non_blocking=True)\n",
        "            self.new_seq_lens_cpu_pinned[: fi.shape[0]].copy_(\n"
        "                self.new_seq_lens_buf[fi], non_blocking=True\n"
        "            )\n")],
      ("dspark-readback", "dspark-ring")),
    M("async-d2h-skips-record-stream",
      "async_d2h enqueues the result's device-to-host copy on the copy stream without "
      "marking the source as used there: once the host drops it, the forward stream's "
      "next allocation can take its block before the copy has read it",
      "lifetime (record_stream)", "sglang.srt.utils.common:async_d2h",
      [("    tensor.record_stream(torch.get_device_module(tensor.device).current_stream())\n",
        "")],
      SEED + KV_REUSE),
    M("war-barrier-keeps-stale-event",
      "upstream's WAR barrier takes the runner's read-done event without clearing it: the "
      "next forward that publishes none (an extend, a batch over the graph's size) is "
      "fenced on the stale event of an earlier replay instead of the coarse fallback",
      "PR #34052 (the clearing comment)", f"{_SCHED}._apply_war_barrier",
      [("        runner.shared_read_done_event = None\n", "")],
      SEED + KV_REUSE + ("graph-eligibility",)),
    M("read-done-before-metadata",
      "the toy verify records shared-read-done before its attention gathers req_to_token: "
      "upstream's fine fence then covers none of the forward's reads of the pools",
      "PR #28363 / #34052", "targets.sglang.engine.worker:ToyNgramWorker.forward_batch_generation",
      [("            meta = self.attn.init_forward_metadata(batch.req_pool_indices, batch.reqs, D,\n"
        "                                                   prefill=False)\n"
        "            ran = upstream_forward.verify(self.model_runner, batch, drafts, meta.window)\n"
        "            self._record_shared_read_done(replayed=self._replays(bs))\n",
        "            self._record_shared_read_done(replayed=self._replays(bs))\n"
        "            meta = self.attn.init_forward_metadata(batch.req_pool_indices, batch.reqs, D,\n"
        "                                                   prefill=False)\n"
        "            ran = upstream_forward.verify(self.model_runner, batch, drafts, meta.window)\n")],
      KV_REUSE),
    M("read-done-from-draft-runner",
      "the step's read-done taken from the draft runner, not the target's (the step's last "
      "shared-buffer reader): the barrier waits for the draft, the target's attention "
      "gathers the pools after it unfenced",
      "PR #34052 (last_shared_read_runner)", "targets.sglang.engine.worker:ToyNgramWorker.__init__",
      [("        self._init_shared_read()\n",
        "        self._init_shared_read()\n"
        "        if self.draft_runner is not None:\n"
        "            self.last_shared_read_runner = self.war_fastpath_runner = self.draft_runner\n")],
      ("kv-reuse-eagle", "kv-reuse-eagle-lazy")),
    # --- upstream's model runner (targets/sglang/runner): the KV write in a graph ----
    M("kv-write-side-stream-unordered",
      "MHATokenToKVPool's captured KV write forks the V write onto its side stream "
      "without waiting for the capture stream: the graph's V write is unordered with the "
      "projection that produced it, on every replay",
      "mem_cache/memory_pool.py _set_kv_buffer_impl (alt_stream fork)",
      "sglang.srt.mem_cache.memory_pool:_set_kv_buffer_impl",
      [("        alt_stream.wait_stream(current_stream)\n", "")],
      SEED),
    # the same patches of specrace's pools code (toys.attention, toys.mem_cache), which
    # both targets run: one definition serves both catalogues
    _IMPL["accept-moved-via-req-to-token"],
    M("kv-release-whole-row",
      "a finished request's release frees its whole req_to_token row, not the columns it "
      "holds: slot ids a previous owner of the row left in its tail are freed again, and "
      "two live requests get the same slots (impl's mutation of the same name, here in "
      "upstream's release_kv_cache)",
      "mem_cache/common.py release_kv_cache", "sglang.srt.mem_cache.common:release_kv_cache",
      [("    tree_cache.free_kv_row(req.kv, [(req.kv.cache_protected_len, owned_kv_len)])\n",
        "    tree_cache.free_kv_row(req.kv, [(0, tree_cache.req_to_token_pool.req_to_token"
        ".shape[1])])\n"),
       ("    _release_overallocated_kv_indices(\n"
        "        req, owned_kv_len, req.kv.kv_allocated_len, tree_cache\n"
        "    )\n", "")],
      KV_REUSE),
    M("retracted-result-committed",
      "the result of a step a retracted request had in flight is committed: the tokens "
      "are committed again by its re-prefill and the steps after it (impl's mutation of "
      "the same name, in upstream's own decode result processing)",
      "upstream's result processor skips req.is_retracted (overlap only)",
      f"{_BRP}.process_batch_result_decode",
      [("                req.finished() or req.is_retracted\n", "                req.finished()\n")],
      KV_RETRACT),
    M("chunked-req-merged",
      "the request being chunked is not excluded when the last prefill merges into the "
      "running batch (impl's mutation of the same name, in the sglang target's batch "
      "formation)",
      "upstream's get_next_batch_to_run (reqs_to_exclude = {chunked_req})",
      "targets.sglang.engine.loop:Intake._next",
      [("            loop.filter_finished(last_batch, exclude=chunked)\n",
        "            loop.filter_finished(last_batch)\n")],
      KV_CHUNKED),
    # impl's patches of the code both targets run, probed on the EAGLE v2 slice too
    M("middle-chunk-committed",
      "a middle chunk's result is committed as the request's token: its output gains the "
      "model's successor of a token in the middle of its prompt (impl's mutation of the "
      "same name, in upstream's own prefill result processing)",
      "upstream's result processor (inflight_middle_chunks > 0: skipped)",
      f"{_BRP}.process_batch_result_prefill",
      [("                    continue\n\n"
        "                if req.inflight_middle_chunks <= 0:\n",
        "                    continue\n\n"
        "                if True:\n")],
      KV_CHUNKED),
    dataclasses.replace(_IMPL["chunk-prefix-dropped"], probes=KV_CHUNKED),
    # --- the request pool: reached only once the pool's last slot is in use -----
    M("pool-edge-off-by-one",
      "FutureMap sizes its pool-indexed buffers without the padding row (one row short of "
      "the request pool): the publish/stash for the pool's last slot indexes past them",
      "slot reuse (pool edge)", f"{_FM}.__init__",
      [("        self.req_pool_size = req_to_token_pool.req_to_token.shape[0]\n",
        "        self.req_pool_size = req_to_token_pool.req_to_token.shape[0] - 1\n")],
      SLOT_REUSE),
]
