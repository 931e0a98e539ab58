"""The catalogue of seeded bugs: each a small source patch applied to ``impl/`` at run time.

A mutation names a function or method in ``impl/``, a snippet of its source and the
replacement -- a diff, as a mutation-testing tool would apply it. ``applied()`` compiles
the patched function in its module's namespace and swaps it in for the duration of the
block; the snippet must occur exactly once, so a refactor of ``impl/`` that moves the code
breaks the mutation loudly instead of silently testing nothing. ``impl/`` stays the clean
server code; the bugs live here.

Sources: the seeds' risk sections and ``reference/sglang_digest.md`` §4 (M-numbers).
"""
from __future__ import annotations

from typing import List

from seams.sourcepatch import resolve

from mutations.base import M, Mutation, MutationError

__all__ = ["Mutation", "MUTATIONS", "BY_NAME", "MutationError", "resolve"]


SEED = ("seed-eager", "seed-lazy", "seed-stall")
GRAMMAR = ("grammar-ngram", "grammar-eagle")
SLOT_REUSE = ("slot-reuse", "slot-reuse-stall")
KV_REUSE = ("kv-reuse", "kv-reuse-lazy")
KV_REUSE_SWA = ("kv-reuse-swa", "kv-reuse-swa-lazy")
KV_REUSE_AFTER_READ_DONE = KV_REUSE
KV_RETRACT = ("kv-retract", "kv-retract-lazy", "kv-pressure")
KV_CHUNKED = ("kv-chunked", "kv-chunked-lazy")

MUTATIONS: List[Mutation] = [
    # --- the NGRAM relay and its streams (PR #35198, M1-M12) ---------------------------
    M("filter-gathers-accept-on-schedule",
      "filter_batch gathers accept_tokens/accept_lens on the schedule stream (fine fence)",
      "PR #35198 / M1", "impl.spec_info:NgramVerifyInput.filter_batch",
      [('if self.relay == Relay.FUTURE_MAP and self.future_indices is not None:', "if False:")],
      SEED),
    M("merge-cats-accept-on-schedule",
      "merge_batch concatenates accept state on the schedule stream (fine fence)",
      "PR #35198 / M1", "impl.spec_info:NgramVerifyInput.merge_batch",
      [('if self.relay == Relay.FUTURE_MAP and self.future_indices is not None:', "if False:")],
      SEED),
    M("resolve-before-forward-waits",
      "the forward stream resolves relayed inputs before waiting on the schedule stream",
      "M3", "impl.scheduler:Scheduler.run_batch",
      [("            fwd.wait_stream(self.schedule_stream)\n", ""),
       ("            if batch.forward_mode == \"extend\":\n",
        "            fwd.wait_stream(self.schedule_stream)\n"
        "            if batch.forward_mode == \"extend\":\n")],
      SEED),
    M("resolve-on-schedule-stream",
      "_resolve_spec_extras runs on the schedule stream, with no event on the stash",
      "M4", "impl.scheduler:Scheduler.run_batch",
      [("                self.future_map.resolve_spec_extras(batch.spec_info)",
        "                with self.mod.stream(self.schedule_stream):\n"
        "                    self.future_map.resolve_spec_extras(batch.spec_info)")],
      SEED),
    M("stash-on-schedule-stream",
      "stash runs on the schedule stream instead of the forward stream",
      "M4", "impl.scheduler:Scheduler._relay_forward_payload",
      [("            self.future_map.stash(",
        "            with self.mod.stream(self.schedule_stream):\n"
        "                self.future_map.stash(")],
      SEED),
    M("copy-done-not-recorded",
      "copy_done is never recorded, so the host's synchronize() waits for nothing",
      "M5", "impl.scheduler:Scheduler.run_batch",
      [("                result.copy_done.record()", "                pass")],
      SEED),
    M("copy-done-before-copies",
      "copy_done is recorded before the D2H copies are enqueued",
      "M5", "impl.scheduler:Scheduler.run_batch",
      [("                result.copy_to_cpu()\n                result.copy_done.record()",
        "                result.copy_done.record()\n                result.copy_to_cpu()")],
      SEED),
    M("copy-done-on-forward-stream",
      "copy_done is recorded on the forward stream, not after the copies on the copy stream",
      "M5", "impl.scheduler:Scheduler.run_batch",
      [("                result.copy_done.record()",
        "                result.copy_done.record(fwd)")],
      SEED),
    M("copy-without-waiting-forward",
      "the copy stream does not wait on the forward stream before the result D2H",
      "M6", "impl.scheduler:Scheduler.run_batch",
      [("            self.copy_stream.wait_stream(fwd)\n", "")],
      SEED),
    M("result-read-without-sync",
      "result processing reads the pinned host result without copy_done.synchronize()",
      "M5", "impl.scheduler:Scheduler.pop_and_process",
      [("        result.copy_done.synchronize()\n", "")],
      SEED),
    M("future-indices-not-filtered",
      "filter_batch (FutureMap relay) returns without slicing future_indices",
      "M10", "impl.spec_info:NgramVerifyInput.filter_batch",
      [("            self.future_indices = self.future_indices[new_indices]\n            return",
        "            return")],
      SEED),
    M("future-indices-wrong-keep",
      "future_indices filtered with different keep indices than the requests (reversed)",
      "M10", "impl.spec_info:NgramVerifyInput.filter_batch",
      [("            self.future_indices = self.future_indices[new_indices]\n            return",
        "            self.future_indices = self.future_indices[new_indices.flip(0)]\n"
        "            return")],
      SEED),
    M("merge-order-swapped",
      "merge_batch concatenates future_indices in (other, self) order, unlike the requests",
      "M10", "impl.spec_info:NgramVerifyInput.merge_batch",
      [("torch.cat((self.future_indices, other.future_indices))\n            return",
        "torch.cat((other.future_indices, self.future_indices))\n            return")],
      SEED),
    M("splice-after-commit",
      "draft prep splices the relayed tokens even when they are already committed",
      "M11", "impl.schedule_batch:Req.needs_splice",
      [("return self.committed_step < self.launched - 2", "return True")],
      # Reached when a request's previous step is already committed at its draft prep
      # -- a prefill (someone joining) ran between two of its steps -- and the doubled
      # run changes its next draft: the seed workloads get there on 4 seeds in 10;
      # slot-reuse's long cycle-prompt request beside its admissions, on every seed.
      ("slot-reuse",) + SEED),
    M("no-splice-under-overlap",
      "draft prep never splices the in-flight step's tokens under overlap",
      "M11", "impl.schedule_batch:Req.needs_splice",
      [("return self.committed_step < self.launched - 2", "return False")],
      SEED),
    M("accept-stride-mismatch",
      "draft prep slices the relayed accept tokens with a stride of D-1",
      "M12", "toys.ngram:propose_host_trees",
      [("prev_tokens[i * stride: i * stride + prev_lens[i]]",
        "prev_tokens[i * (stride - 1): i * (stride - 1) + prev_lens[i]]")],
      SEED),
    M("verify-accept-index-empty",
      "accept_index allocated with torch.empty instead of full(-1): the verify kernel "
      "writes only the accepted slots, the rest is whatever the memory held",
      "M24 / empty-vs-zeros", "toys.verify:verify_tree_greedy",
      [("accept_index = torch.full((bs, D), -1, dtype=torch.int64, device=device)",
        "accept_index = torch.empty((bs, D), dtype=torch.int64, device=device)")],
      SEED),
    M("verify-target-at-child",
      "verification compares a child's draft with the target at the child, not the parent",
      "M16 (verify)", "toys.verify:_verify_kernel",
      [("match = draft_token == target_predict.gather(1, parent)",
        "match = draft_token == target_predict")],
      SEED),
    M("stash-drops-accept-lens",
      "stash writes the accept tokens but not their lengths (rows resolve to length 0)",
      "M7 (relay buffers)", "impl.overlap:FutureMap.stash",
      [("        self.accept_lens_buf[future_indices] = payload.accept_lens\n", "")],
      SEED),
    # --- memory lifetime across streams (record_stream, keep-alive references) --------
    M("forward-inputs-not-recorded",
      "run_batch does not record_stream the schedule stream's input_ids/req_pool_indices on "
      "the forward stream: the batch drops them while the forward may still read them",
      "upstream's record_stream_for_v2_verify", "impl.scheduler:Scheduler.run_batch",
      [("            self._record_forward_inputs(batch, fwd)\n", "")],
      SEED),
    M("result-sources-freed-early",
      "copy_to_cpu keeps no reference to the device tensors its copies read: the relay lets "
      "go of them at the next resolve, before the copy stream has run",
      "upstream's extra_keep_alive_refs",
      "impl.worker:GenerationBatchResult.copy_to_cpu",
      [("        self.keep_alive = [self.next_token_ids, self.accept_lens]\n", "")],
      SEED),
    # --- grammar staging and traversal (PR #32393, M14-M23) ----------------------------
    M("tree-copy-no-event",
      "GrammarTree.from_device records no event: resolve() does not wait for the copies",
      "PR #32393 / M21", "impl.grammar:GrammarTree.from_device",
      [("        return cls(host, done)", "        return cls(host, None)")],
      ("grammar-eagle",)),
    M("tree-read-before-resolve",
      "the host reads the staged tree without resolve() waiting on the event",
      "PR #32393 / M21", "impl.grammar:GrammarTree.resolve",
      [("self._done.synchronize()", "pass")],
      ("grammar-eagle",)),
    M("stale-extend-mask",
      "build_grammar_vocab_mask does not clear the extend-stage sampling_info.vocab_mask",
      "PR #32393 / M14", "impl.grammar:build_grammar_vocab_mask",
      [("    sampling_info.vocab_mask = None\n", "")],
      GRAMMAR),
    M("grammar-mask-not-applied",
      "the verify mask is built but never applied to the logits",
      "M15", "impl.grammar:GrammarMask.apply",
      [("apply_vocab_mask(logits, self.vocab_mask)", "pass")],
      GRAMMAR),
    M("extend-mask-upload-before-fill",
      "the extend-stage bitmask is copied to the device (non_blocking) before the matchers "
      "fill it: the copy may read the pinned buffer before, during or after the fill",
      "PR #32393's bitmask staging", "impl.worker:NgramWorker._apply_extend_grammar",
      [("        mask = mask.to(self.device, non_blocking=True)\n", ""),
       ("        for i, r in enumerate(batch.reqs):\n",
        "        host_mask, mask = mask, mask.to(self.device, non_blocking=True)\n"
        "        for i, r in enumerate(batch.reqs):\n"),
       ("r.grammar.fill_vocab_mask(mask, i)", "r.grammar.fill_vocab_mask(host_mask, i)")],
      ("grammar-lazy",)),
    M("bitmask-init-zero",
      "the bitmask starts all-zero (deny all) instead of all-ones",
      "M20", "toys.bitmask:allocate_vocab_mask",
      [("torch.full((rows, bitmask_width(vocab_size)), -1,",
        "torch.full((rows, bitmask_width(vocab_size)), 0,")],
      GRAMMAR),
    M("child-tested-against-own-row",
      "the traversal tests a child's token against its own row instead of its parent's",
      "M16", "impl.grammar:traverse_tree",
      [("int(bitmask[parent, tok // BITS])", "int(bitmask[curr, tok // BITS])")],
      GRAMMAR),
    M("sibling-uses-previous-sibling-row",
      "a sibling is tested against the previous sibling's row",
      "M16", "impl.grammar:traverse_tree",
      [("dfs(next_sibling[curr], parent)", "dfs(next_sibling[curr], curr)")],
      GRAMMAR),
    M("missing-rollback",
      "an accepted node's token is never rolled back",
      "M17", "impl.grammar:traverse_tree",
      [("                grammar.rollback(1)\n", "                pass\n")],
      GRAMMAR),
    M("root-reaccepted",
      "the root token is accepted again by the matcher",
      "M18", "impl.grammar:traverse_tree",
      [("            if curr != 0:\n                grammar.accept_token(tok)",
        "            grammar.accept_token(draft_tokens[curr])")],
      GRAMMAR),
    M("descend-below-terminated",
      "the traversal fills rows and descends below a terminated grammar",
      "M19", "impl.grammar:traverse_tree",
      [("            if not grammar.is_terminated():", "            if True:")],
      GRAMMAR),
    M("bitmask-word-bit-swapped",
      "the parent-row bit test swaps word and bit (tok % 32 as the word)",
      "M19", "impl.grammar:traverse_tree",
      [("int(bitmask[parent, tok // BITS]) >> (tok % BITS)",
        "int(bitmask[parent, tok % BITS]) >> (tok // BITS)")],
      GRAMMAR),
]

# --- the verify forward under a CUDA graph (graph_runner.py) ---------------------
MUTATIONS += [
    M("graph-input-on-side-stream",
      "the static input_ids are refilled on the graph runner's own stream: unordered with "
      "the previous replay reading them and with the replay about to read them",
      "the verify CUDA graph (static input refill)", "toys.graph_runner:VerifyGraphRunner.replay",
      [("        self.input_ids[bs][:n].copy_(input_ids)\n",
        "        with self.mod.stream(self.stream):\n"
        "            self.input_ids[bs][:n].copy_(input_ids)\n")],
      SEED),
    M("graph-replay-on-side-stream",
      "the graph is replayed on its capture stream; the forward stream reads the static "
      "logits without waiting for the replay",
      "the verify CUDA graph (replay stream)", "toys.graph_runner:VerifyGraphRunner.replay",
      [("        self.graphs[bs].replay()\n",
        "        self.stream.wait_stream(self.mod.current_stream())\n"
        "        with self.mod.stream(self.stream):\n"
        "            self.graphs[bs].replay()\n")],
      SEED),
    M("graph-replay-before-fill",
      "the graph is replayed before the static input_ids are refilled: it computes the "
      "previous batch's logits",
      "the verify CUDA graph (replay order)", "toys.graph_runner:VerifyGraphRunner.replay",
      [("        self.input_ids[bs][:n].copy_(input_ids)\n        self.graphs[bs].replay()\n",
        "        self.graphs[bs].replay()\n        self.input_ids[bs][:n].copy_(input_ids)\n")],
      SEED),
]

# --- the request pool: slot reuse ------------------------------------------------
# Each is harmless while every request gets a fresh slot; only a pool that wraps around
# (``slot-reuse``: many short requests through a few slots) reaches them.
MUTATIONS += [
    # --- the memory pools behind the WAR barrier (PRs #26380, #28363, #31687) --
    M("war-barrier-removed",
      "no WAR barrier: the schedule stream rewrites req_to_token rows while the previous "
      "forward may not have gathered them",
      "PR #26380", "impl.scheduler:Scheduler._apply_war_barrier",
      [('        if self.args.war_barrier == Fence.FINE and event is not None:\n'
        '            self.schedule_stream.wait_event(event)\n'
        '        else:\n'
        '            self.schedule_stream.wait_stream(self.forward_stream)', "        pass")],
      KV_REUSE),
    M("war-barrier-at-loop-top",
      "the WAR barrier at the loop's top (before #31687): result processing after a launch "
      "-- a finished request's free clears its SWA mapping -- is not fenced behind the "
      "just-launched forward's reads",
      "PR #31687", "impl.scheduler:Scheduler.step",
      [("                result = self.run_batch(batch)\n"
        "                self._apply_war_barrier()\n",
        "                result = self.run_batch(batch)\n"),
       ("            batch = self.get_next_batch_to_run()\n",
        "            self._apply_war_barrier()\n"
        "            batch = self.get_next_batch_to_run()\n")],
      KV_REUSE_SWA),
    M("read-done-before-metadata",
      "shared-read-done recorded before the attention gathers req_to_token (the fine "
      "fence then covers none of the forward's reads of the pools)",
      "PR #28363 / #34052", "impl.worker:NgramWorker.forward_decode",
      [("        meta = self.attn.init_forward_metadata(batch.req_pool_indices, batch.reqs, D,\n"
        "                                               prefill=False)\n"
        "        read_done = self._record_shared_read_done()\n",
        "        read_done = self._record_shared_read_done()\n"
        "        meta = self.attn.init_forward_metadata(batch.req_pool_indices, batch.reqs, D,\n"
        "                                               prefill=False)\n")],
      KV_REUSE_AFTER_READ_DONE),
    M("accept-moved-via-req-to-token",
      "the accepted KV's targets read from req_to_token after read-done instead of the "
      "verify window (what move_accept_tokens_to_target_kvcache must not do)",
      "spec_utils.py:894-896", "toys.attention:ToyPagedAttention.commit_accepted",
      [("        targets = meta.window\n",
        "        j = torch.arange(accept_index.shape[1], device=meta.n.device)[None, :]\n"
        "        targets = self.req_to_token[meta.rows].to(torch.int64).gather(\n"
        "            1, (meta.n[:, None] + j).clamp(max=self.req_to_token.shape[1] - 1))\n")],
      KV_REUSE_AFTER_READ_DONE),
    M("kv-release-whole-row",
      "a finished request's release frees its whole req_to_token row, not the columns it "
      "holds: slot ids a previous owner of the row left in its tail are freed again, and "
      "two live requests get the same slots (on the sglang target: upstream's row and "
      "allocator)",
      "mem_cache/common.py release_kv_cache", "toys.mem_cache:KVCacheManager.release",
      [("req.pool_idx, req.kv_allocated)", "req.pool_idx, self.req_to_token.shape[1])")],
      KV_REUSE),
    M("retracted-result-committed",
      "the result of a step a retracted request had in flight is committed: the tokens "
      "are committed again by its re-prefill and the steps after it, and the relay's "
      "step numbering is off by one from then on",
      "upstream's result processor skips req.is_retracted (overlap only)",
      "impl.scheduler:Scheduler.pop_and_process",
      [("            if req.finished or req.is_retracted:\n", "            if req.finished:\n")],
      KV_RETRACT),
    # --- chunked prefill ---------------------------------------------------------
    M("chunked-req-merged",
      "the request being chunked is not excluded when the last prefill merges into the "
      "running batch: it decodes from a prompt whose KV is half written, beside its own "
      "next chunk",
      "upstream's get_next_batch_to_run (reqs_to_exclude = {chunked_req})",
      "impl.scheduler:Scheduler.get_next_batch_to_run",
      [("            self._filter_finished(last, exclude=chunked)\n",
        "            self._filter_finished(last)\n")],
      KV_CHUNKED),
    M("middle-chunk-committed",
      "a middle chunk's result is committed as the request's token: its output gains the "
      "model's successor of a token in the middle of its prompt (both targets' result "
      "processing asks here)",
      "upstream's result processor (inflight_middle_chunks > 0: skipped)",
      "toys.requests:middle_chunk",
      [("    if req.inflight_middle_chunks <= 0:\n", "    if True:\n")],
      KV_CHUNKED),
    M("chunk-prefix-dropped",
      "a chunk's prefix length is staged as 0: its KV overwrites the earlier chunks' "
      "positions, and it attends to a context that is not the request's (both targets "
      "stage their extends here)",
      "prefix_lens / extend_prefix_lens of a chunked extend",
      "toys.requests:stage_extend",
      [("[len(c), r.prefix_len]", "[len(c), 0]")],
      KV_CHUNKED),
    M("pool-edge-off-by-one",
      "the FutureMap sizes its relay buffers without the padding row (req_pool_size - 1 "
      "rows): the stash for the pool's last slot indexes past them",
      "slot reuse (pool edge)", "impl.overlap:FutureMap.__init__",
      [("        self.req_pool_size = req_pool_size\n",
        "        self.req_pool_size = req_pool_size - 1\n")],
      SLOT_REUSE),
    M("slot-released-twice",
      "a finished request's slot is released at finish detection and again when its batch "
      "filters it out: once the pool wraps, two live requests share one slot and one "
      "resolves the other's relayed accept state",
      "slot reuse (slot freed early)", "impl.scheduler:Scheduler._filter_finished",
      [("            batch.filter_batch(keep, self.device)\n",
        "            self.kv_cache.free_rows.extend(r.pool_idx for r in batch.reqs if r.finished)\n"
        "            batch.filter_batch(keep, self.device)\n")],
      SLOT_REUSE),
    M("finished-kept-on-merge",
      "in an iteration that merges a prefill, the running batch is not filtered: a finished "
      "request whose slot was already handed to a new one runs beside it, and one resolves "
      "the other's relayed accept state from the shared row",
      "slot reuse (finish and join in one iteration)",
      "impl.scheduler:Scheduler.get_next_batch_to_run",
      [("        if self.running_batch is not None:\n            self._filter_finished(",
        "        elif self.running_batch is not None:\n            self._filter_finished(")],
      SLOT_REUSE),
]

BY_NAME = {m.name: m for m in MUTATIONS}
