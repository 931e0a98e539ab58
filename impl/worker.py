"""The NGRAM worker: one forward (prefill or draft-prep + verify) on the forward stream.

``forward_batch_generation`` runs with the forward stream current. For a decode batch:

1. draft prep: the previous step's accept state comes to the host with a blocking
   ``.cpu()`` on the forward stream; under overlap (and without grammar) it is spliced
   onto each request's context, because result processing lags one iteration;
2. the host proposer builds the draft trees; they are staged in pinned memory and copied
   to the device ``non_blocking``;
3. the shared-read-done event is recorded -- the fine WAR fence the schedule stream
   waits on (everything the scheduler may overwrite next has been read by now);
4. the verify forward (a CUDA graph replay when the server captured one for this batch
   size: ``graph_runner.py``), the grammar mask (built on the host while it runs),
   greedy tree verification -> ``predict``, ``accept_index``, ``accept_lens``, and the
   accepted tokens ``predict[accept_index]``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch

from seams.faults import fault_point, observe

from toys.memory import host_empty, staged
from toys.verify import verify_and_accept

from impl.spec_info import NgramVerifyInput


@dataclass
class GenerationBatchResult:
    next_token_ids: torch.Tensor  # (bs*D,) int32: row i holds request i's accepted tokens
    accept_lens: torch.Tensor  # (bs,) int32, bonus included
    next_draft_input: NgramVerifyInput
    stride: int
    read_done: Optional[Any] = None  # shared-read-done event (fine WAR fence)
    copy_done: Optional[Any] = None
    keep_alive: List[torch.Tensor] = field(default_factory=list)
    kv_check: Optional[torch.Tensor] = None  # (bs, 2): what the attention read (n, checksum)
    released_at_launch: List[bool] = field(default_factory=list)  # per request (scheduler)
    prefill: bool = False  # the launch's mode (scheduler): the KV oracle's context
    extend_ends: Optional[List[int]] = None  # a prefill's: where each request's chunk ends

    def copy_to_cpu(self) -> None:
        """On the copy stream, after it waited on the forward stream. As upstream, the
        pinned host copies take the device tensors' place on the result (they are what
        result processing reads, after ``copy_done``)."""
        device = self.next_token_ids.device
        host_tokens = host_empty(self.next_token_ids.shape, torch.int32, device)
        host_lens = host_empty(self.accept_lens.shape, torch.int32, device)
        host_tokens.copy_(self.next_token_ids, non_blocking=True)
        host_lens.copy_(self.accept_lens, non_blocking=True)
        # The copies read the device tensors when they run; their other holder, the
        # relay (next_draft_input), lets go at the next resolve on the forward stream,
        # and the forward stream's next allocation could then take their blocks. Keep
        # them until the result is processed (upstream: extra_keep_alive_refs).
        self.keep_alive = [self.next_token_ids, self.accept_lens]
        self.next_token_ids, self.accept_lens = host_tokens, host_lens
        if self.kv_check is not None:
            host_check = host_empty(self.kv_check.shape, torch.int64, device)
            host_check.copy_(self.kv_check, non_blocking=True)
            self.keep_alive.append(self.kv_check)
            self.kv_check = host_check


class NgramWorker:
    def __init__(self, model, proposer, device, draft_token_num: int, relay: str,
                 overlap: bool, grammar_backend: Any = None,
                 spec_algorithm: str = "ngram", graph_runner: Any = None,
                 attention: Any = None) -> None:
        self.model = model
        self.proposer = proposer
        self.device = torch.device(device)
        self.D = draft_token_num
        self.relay = relay
        self.overlap = overlap
        self.grammar_backend = grammar_backend
        self.device_drafted = spec_algorithm == "eagle"  # the EAGLE-style path
        self.graph_runner = graph_runner  # the verify forward as graph replays, if set
        self.attn = attention  # the toy paged attention over the memory pools
        self.mod = torch.get_device_module(self.device)

    # --- prefill ------------------------------------------------------------------------
    def forward_extend(self, batch) -> GenerationBatchResult:
        bs, D = len(batch.reqs), self.D
        input_ids = batch.input_ids  # built on the schedule stream (prepare_for_extend)
        meta = self.attn.init_forward_metadata(batch.req_pool_indices, batch.reqs,
                                               batch.extend.ids.shape[1], prefill=True,
                                               prefix_lens=batch.extend.prefix_lens)
        read_done = self._record_shared_read_done()
        kv_check = self.attn.attend_prefill(meta, batch.extend)
        logits = self.model.forward(input_ids)
        if batch.has_grammar:
            self._apply_extend_grammar(batch, logits)
        predict = logits.argmax(dim=-1)
        accept_tokens = torch.zeros((bs, D), dtype=torch.int32, device=self.device)
        accept_tokens[:, 0] = predict.to(torch.int32)
        accept_tokens = accept_tokens.flatten()
        accept_lens = torch.ones((bs,), dtype=torch.int32, device=self.device)
        return self._result(accept_tokens, accept_lens, read_done, kv_check)

    def _record_shared_read_done(self):
        """The fine WAR fence: past this point the forward reads nothing the scheduler may
        overwrite next. Everything written after it is *not* covered by the fence."""
        read_done = self.mod.Event()
        read_done.record()
        fault_point("forward.after_read_done")
        return read_done

    def _apply_extend_grammar(self, batch, logits: torch.Tensor) -> None:
        from toys.bitmask import apply_vocab_mask
        first = next(r.grammar for r in batch.reqs if r.grammar is not None)
        mask = first.allocate_vocab_mask(batch.sampling_info.vocab_size, len(batch.reqs),
                                         self.device)
        for i, r in enumerate(batch.reqs):
            if r.grammar is not None and not r.grammar.is_terminated():
                r.grammar.fill_vocab_mask(mask, i)
        mask = mask.to(self.device, non_blocking=True)
        apply_vocab_mask(logits, mask)
        # The extend-stage mask stays on sampling_info; verify must clear it.
        batch.sampling_info.vocab_mask = mask

    # --- decode: draft prep + verify ----------------------------------------------------
    def forward_decode(self, batch) -> GenerationBatchResult:
        bs, D = len(batch.reqs), self.D
        if bs == 0:
            return self._idle_result()
        spec = batch.spec_info
        prev_tokens = spec.accept_tokens.cpu().tolist()  # blocking, on the forward stream
        prev_lens = spec.accept_lens.cpu().tolist()
        # the state relayed from each request's previous step (the one before this launch)
        observe("draft_prep", reqs=batch.reqs, steps=[r.launched - 2 for r in batch.reqs],
                accept_lens=prev_lens, accept_tokens=prev_tokens, stride=D)
        # Under overlap the previous step's result is not yet in output_ids; with a grammar
        # the step was processed synchronously, and splicing again would duplicate it.
        use_prev = self.overlap and not batch.sync_processed
        if self.device_drafted:
            drafts_dev, nt_dev, ns_dev, tree = self._device_tree(batch)
        else:
            drafts_dev, nt_dev, ns_dev, tree = self._host_tree(batch, prev_tokens, prev_lens,
                                                               use_prev)
        meta = self.attn.init_forward_metadata(batch.req_pool_indices, batch.reqs, D,
                                               prefill=False)
        read_done = self._record_shared_read_done()
        kv_check = self.attn.attend(meta, drafts_dev.view(bs, D), None, meta.n)
        logits = self._verify_forward(drafts_dev, bs)
        self._apply_sampling_masks(batch, logits, tree)
        accept_tokens, accept_lens = verify_and_accept(self.attn, meta, logits, drafts_dev,
                                                       nt_dev, ns_dev, bs, D)
        return self._result(accept_tokens, accept_lens, read_done, kv_check)

    def _verify_forward(self, input_ids, bs: int):
        """The target forward over every draft node: a graph replay when one is captured
        for this batch size (static inputs filled on this stream, then one launch)."""
        runner = self.graph_runner
        if runner is not None and runner.can_run(bs):
            return runner.replay(input_ids)
        return self.model.forward(input_ids)

    def _host_tree(self, batch, prev_tokens, prev_lens, use_prev):
        from toys.ngram import propose_host_trees
        D = self.D
        drafts, next_token, next_sibling = propose_host_trees(
            self.proposer, batch.reqs, prev_tokens, prev_lens, D, splice=use_prev)
        # Stage in pinned memory, copy non_blocking: the copy is ordered on this stream.
        staged_tree = [staged(torch.tensor(x, dtype=torch.int64), self.device)
                       for x in (drafts, next_token, next_sibling)]
        on_dev = [t.to(self.device, non_blocking=True) for t in staged_tree]
        tree = None
        if batch.has_grammar:
            from impl.grammar import GrammarTree
            bs = len(batch.reqs)
            tree = GrammarTree.from_host(staged_tree[1], staged_tree[2],
                                         staged_tree[0].view(bs, D))
        batch.staging = staged_tree  # keep the pinned sources alive until the copies ran
        return on_dev[0], on_dev[1], on_dev[2], tree

    def _device_tree(self, batch):
        """EAGLE-style: a device drafter builds the tree on this stream; the grammar tree is
        copied to the host *before* the verify launch, resolved after it."""
        roots = torch.tensor([r.context()[-1] for r in batch.reqs], dtype=torch.int64,
                             device=self.device)
        from toys.drafter import draft_tree
        drafts, next_token, next_sibling = draft_tree(roots, self.D, self.model.vocab_size)
        fault_point("forward.after_draft")
        tree = None
        if batch.has_grammar:
            from impl.grammar import GrammarTree
            tree = GrammarTree.from_device(next_token, next_sibling,
                                           drafts.view(len(batch.reqs), self.D))
        return drafts, next_token, next_sibling, tree

    def _apply_sampling_masks(self, batch, logits, tree) -> None:
        """Grammar mask first (it clears the stale extend-stage mask), then the sampler
        applies whatever ``sampling_info`` still carries, then the verify mask."""
        info = batch.sampling_info
        mask = None
        if tree is not None:
            from impl.grammar import build_grammar_vocab_mask
            mask = build_grammar_vocab_mask(reqs=batch.reqs, tree=tree, sampling_info=info,
                                            device=self.device)
        elif info is not None:
            # The batch's grammar requests left it (finished, retracted) before their first
            # verify: no grammar mask is built to clear the extend stage's mask, whose rows
            # are the prefill's, not this verify's.
            info.vocab_mask = None
        if info is not None and info.vocab_mask is not None:
            from toys.bitmask import apply_vocab_mask
            apply_vocab_mask(logits, info.vocab_mask)
        if mask is not None:
            mask.apply(logits)

    # --- results ------------------------------------------------------------------------
    def _result(self, accept_tokens, accept_lens, read_done,
                kv_check) -> GenerationBatchResult:
        nxt = NgramVerifyInput(draft_token_num=self.D, relay=self.relay,
                               accept_tokens=accept_tokens, accept_lens=accept_lens)
        return GenerationBatchResult(accept_tokens, accept_lens, nxt, self.D, read_done,
                                     kv_check=kv_check)

    def _idle_result(self) -> GenerationBatchResult:
        idle = NgramVerifyInput.create_idle_input(self.D, self.device, self.relay)
        return GenerationBatchResult(idle.accept_tokens, idle.accept_lens, idle, self.D)

