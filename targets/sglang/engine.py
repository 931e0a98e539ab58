"""The upstream engine: installed sglang's relay and batch code in its overlap event loop.

What is upstream's own code here (called, never copied; variants and mutations patch it
at run time, ``targets.sglang.patches``):

* ``ScheduleBatch.init_new`` / ``filter_batch`` / ``merge_batch`` / ``copy`` on the
  schedule stream, and through them ``NgramVerifyInput.filter_batch`` / ``merge_batch``;
* ``FutureMap`` (``resolve_seq_lens_cpu`` with its private D2H stream and pinned mirror,
  ``publish``, ``stash``, ``_resolve_spec_extras``), ``resolve_forward_inputs`` and
  ``RelayPayload.from_ngram``;
* ``Scheduler._forward_isolation`` / ``record_batch_in_overlap`` (the two-iteration
  tensor lifetime), ``_relay_forward_payload``, ``_copy_result_to_cpu`` and
  ``_apply_war_barrier``, called on this engine as their ``self``;
* ``GenerationBatchResult.copy_to_cpu`` (``async_d2h``: pinned copy + ``record_stream``),
  ``record_stream_for_v2_verify``.

What is ours: the sequencing of ``Scheduler.event_loop_overlap`` and of ``run_batch``'s
overlap branch (``run_batch`` itself needs the whole scheduler: ZMQ, the tokenizer, the
KV pools), request bookkeeping, and the worker: ``ToyNgramWorker`` stands in for
``NGRAMWorker`` + ``TpModelWorker`` (they need GPU kernels and the JIT n-gram corpus) with
specrace's toy target model, host n-gram proposer and greedy tree verify, shaped like
upstream's worker -- draft prep reads the relayed accept state with a blocking ``.cpu()``
on the forward stream, the verify publishes ``new_seq_lens`` through ``on_publish``.
"""
from __future__ import annotations

import collections
import types
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Deque, List, Optional, Tuple

import torch

from harness.faults import ask, fault_point, observe
from impl.drafter import draft_tree
from impl.grammar import apply_vocab_mask
from impl.model import ToyTargetModel
from impl.ngram import NgramProposer
from impl.tree import derive_tree_links
from impl.verify import verify_tree_greedy
from impl.vocab import EOS_ID

from . import upstream


@dataclass
class Req:
    """A request, with the attributes upstream's batch code reads of sglang's ``Req``."""

    rid: int
    prompt: List[int]
    max_new_tokens: int
    grammar: Any = None
    output_ids: List[int] = field(default_factory=list)
    done: bool = False
    pool_idx: int = -1
    launched: int = 0  # forward steps launched (prefill = step 0)
    committed_step: int = -1
    # read by ScheduleBatch.init_new / filter_batch / merge_batch
    return_logprob: bool = False
    is_prefill_only: bool = False

    @property
    def return_hidden_states_mode(self):
        return upstream.CaptureHiddenMode.NULL

    def finished(self) -> bool:
        return self.done

    def needs_splice(self) -> bool:
        return self.committed_step < self.launched - 2

    def context(self) -> List[int]:
        return self.prompt + self.output_ids


class SamplingInfo:
    """The sampling state filter/merge carry along (none of it is under test here)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.grammar_mask = None

    def filter_batch(self, keep_indices, keep_indices_device) -> None:
        pass

    def merge_batch(self, other: "SamplingInfo") -> None:
        if other.grammar_mask is not None:
            self.grammar_mask = other.grammar_mask

    def copy_for_forward(self) -> "SamplingInfo":
        return self


class ToyNgramWorker:
    """Stands in for upstream's NGRAMWorker + target worker, shaped like them.

    The sampler is ours too (upstream's applies the grammar bitmask with a triton kernel,
    which has no simulator path): masks are upstream's ``GrammarMask`` objects, applied
    with plain torch ops. ``device_drafted`` is the EAGLE-style path: a device drafter
    builds the tree on the forward stream and ``GrammarTree.from_device`` stages it.
    """

    def __init__(self, model: ToyTargetModel, device, draft_token_num: int,
                 overlap: bool, device_drafted: bool = False) -> None:
        self.model = model
        self.device = torch.device(device)
        self.mod = torch.get_device_module(self.device)
        self.D = draft_token_num
        self.overlap = overlap
        self.device_drafted = device_drafted
        self.proposer = NgramProposer(draft_token_num)
        # _apply_war_barrier reads the runner's shared-read-done event (and clears it)
        self.last_shared_read_runner = self
        self.shared_read_done_event = None

    def _record_shared_read_done(self) -> None:
        event = self.mod.Event()
        event.record()
        self.shared_read_done_event = event
        fault_point("forward.after_read_done")

    def forward_batch_generation(self, batch, on_publish=None):
        fwd = self.mod.current_stream()
        upstream.spec_utils.record_stream_for_v2_verify(batch, None, fwd)
        bs, D = len(batch.reqs), self.D
        if batch.forward_mode.is_extend():
            self._record_shared_read_done()
            logits = self.model.forward(batch.input_ids)
            if batch.has_grammar:
                self._apply_extend_grammar(batch, logits)
            predict = logits.argmax(dim=-1)
            new_seq_lens = batch.seq_lens.clone()
            accept_tokens = torch.zeros((bs, D), dtype=torch.int32, device=self.device)
            accept_tokens[:, 0] = predict.to(torch.int32)
            accept_tokens = accept_tokens.flatten()
            accept_lens = torch.ones((bs,), dtype=torch.int32, device=self.device)
            next_token_ids = predict
        elif bs == 0:  # a DP-idle rank: empty tensors all the way
            accept_tokens = torch.empty((0,), dtype=torch.int32, device=self.device)
            accept_lens = torch.empty((0,), dtype=torch.int32, device=self.device)
            new_seq_lens = torch.empty((0,), dtype=torch.int64, device=self.device)
            next_token_ids = accept_tokens
        else:
            if self.device_drafted:
                drafts, nt, ns, tree = self._device_tree(batch)
            else:
                drafts, nt, ns, tree = self._prepare_for_speculative_decoding(batch)
            self._record_shared_read_done()
            logits = self.model.forward(drafts)  # the verify forward
            self._sample_masks(batch, logits, tree)
            target_predict = logits.argmax(dim=-1).view(bs, D)
            fault_point("forward.before_verify")
            predict, accept_index, accept_lens = verify_tree_greedy(
                target_predict, drafts.view(bs, D), nt, ns)
            new_seq_lens = batch.seq_lens + accept_lens
            accept_tokens = predict[accept_index].flatten().to(torch.int32)
            next_token_ids = accept_tokens
        if on_publish is not None:
            on_publish(new_seq_lens)
        next_draft_input = upstream.NgramVerifyInput(
            draft_token_num=D, new_seq_lens=new_seq_lens, accept_tokens=accept_tokens,
            accept_lens=accept_lens)
        return upstream.GenerationBatchResult(
            next_token_ids=next_token_ids, accept_lens=accept_lens,
            new_seq_lens=new_seq_lens, next_draft_input=next_draft_input,
            speculative_num_draft_tokens=D)

    def _prepare_for_speculative_decoding(self, batch):
        """Draft prep: the previous step's accept state to the host (blocking, on the
        forward stream), spliced onto the context under overlap, then the host trees
        staged in pinned memory and copied to the device."""
        D = self.D
        spec = batch.spec_info
        prev_tokens = spec.accept_tokens.cpu().tolist()
        prev_lens = spec.accept_lens.cpu().tolist()
        observe("draft_prep", reqs=batch.reqs, steps=[r.launched - 2 for r in batch.reqs],
                accept_lens=prev_lens, accept_tokens=prev_tokens, stride=D)
        use_prev = self.overlap and not batch.sync_processed
        drafts: List[int] = []
        next_token: List[List[int]] = []
        next_sibling: List[List[int]] = []
        for i, req in enumerate(batch.reqs):
            context = req.context()
            if use_prev and req.needs_splice():
                context = context + prev_tokens[i * D: i * D + prev_lens[i]]
            tokens, parents = self.proposer.propose(context)
            nt, ns = derive_tree_links(parents)
            drafts += tokens
            next_token.append(nt)
            next_sibling.append(ns)
        staged = [torch.tensor(x, dtype=torch.int64, pin_memory=True)
                  for x in (drafts, next_token, next_sibling)]
        batch.staging = staged  # the pinned sources live until the copies ran
        on_device = [t.to(self.device, non_blocking=True) for t in staged]
        tree = None
        if batch.has_grammar:  # the tree is already on the host: from_host (NGRAM)
            tree = upstream.GrammarTree.from_host(staged[1], staged[2],
                                                  staged[0].view(len(batch.reqs), D))
        return on_device[0], on_device[1], on_device[2], tree

    def _device_tree(self, batch):
        """EAGLE-style: the tree is built on this stream; its host copy is started before
        the verify launch (``from_device``) and resolved after it."""
        roots = torch.tensor([r.context()[-1] for r in batch.reqs], dtype=torch.int64,
                             device=self.device)
        drafts, next_token, next_sibling = draft_tree(roots, self.D, self.model.vocab_size)
        fault_point("forward.after_draft")
        tree = None
        if batch.has_grammar:
            tree = upstream.GrammarTree.from_device(next_token, next_sibling,
                                                    drafts.view(len(batch.reqs), self.D))
        return drafts, next_token, next_sibling, tree

    def _apply_extend_grammar(self, batch, logits) -> None:
        """The extend stage's mask: one row per request, left on ``sampling_info`` (the
        verify's ``build_grammar_vocab_mask`` must clear it)."""
        reqs = batch.reqs
        first = next(r.grammar for r in reqs if r.grammar is not None)
        mask = first.allocate_vocab_mask(batch.sampling_info.vocab_size, len(reqs),
                                         self.device)
        for i, r in enumerate(reqs):
            if r.grammar is not None and not r.grammar.is_terminated():
                r.grammar.fill_vocab_mask(mask, i)
        mask = first.move_vocab_mask(mask, self.device)
        apply_vocab_mask(logits, mask)
        batch.sampling_info.grammar_mask = upstream.GrammarMask(first, mask)

    def _sample_masks(self, batch, logits, tree) -> None:
        """Upstream's verify mask first (it clears the stale extend-stage mask), then
        whatever ``sampling_info`` still carries, then the verify mask itself."""
        info = batch.sampling_info
        grammar_mask = None
        if tree is not None:
            grammar_mask = upstream.spec_utils.build_grammar_vocab_mask(
                reqs=batch.reqs, tree=tree, sampling_info=info, device=self.device,
                barrier=None)
        if info.grammar_mask is not None:
            apply_vocab_mask(logits, info.grammar_mask.vocab_mask)
        if grammar_mask is not None:
            apply_vocab_mask(logits, grammar_mask.vocab_mask)


class UpstreamScheduler:
    """``event_loop_overlap`` over upstream's classes; the attributes upstream's Scheduler
    methods read of ``self`` are this object's."""

    def __init__(self, args, device, grammar_backend: Any = None,
                 model: Optional[ToyTargetModel] = None) -> None:
        args.validate()
        self.args = args
        self.device = torch.device(device)
        self.device_module = self.mod = torch.get_device_module(self.device)
        self.schedule_stream = self.mod.Stream()
        self.forward_stream = self.mod.Stream()
        self.copy_stream = self.mod.Stream()
        self.forward_stream_ctx = self.mod.stream(self.forward_stream)
        self.copy_stream_ctx = self.mod.stream(self.copy_stream)
        self.model = model or ToyTargetModel(self.device)
        self.vocab_size = self.model.vocab_size
        self.model_config = types.SimpleNamespace(
            is_encoder_decoder=False, vocab_size=self.vocab_size)
        self.req_to_token_pool = types.SimpleNamespace(
            device=self.device,
            req_to_token=torch.zeros((args.req_pool_size, 1), dtype=torch.int32,
                                     device=self.device),
            req_generation=torch.zeros((args.req_pool_size,), dtype=torch.int64))
        self.spec_algorithm = upstream.SpeculativeAlgorithm.NGRAM
        self.future_map = upstream.FutureMap(self.device, self.spec_algorithm,
                                             self.req_to_token_pool)
        self.model_worker = ToyNgramWorker(self.model, self.device, args.draft_token_num,
                                           args.overlap, args.spec_algorithm == "eagle")
        # read by the upstream Scheduler methods called on this object
        self._war_barrier_enabled = True
        self.enable_async_d2h_copy = False
        self.batch_record_buf = [None, None]
        self.batch_record_ct = 0
        self.free_slots = list(range(1, args.req_pool_size))  # slot 0: padding row
        self.waiting: Deque[Req] = collections.deque()
        self.running_batch = None
        self.last_batch = None
        # (batch copy, its requests at launch, their step numbers, token stride, result)
        self.result_queue: Deque[Tuple[Any, List[Req], List[int], int, Any]] = \
            collections.deque()
        self.finished: List[Req] = []
        self.iteration = 0

    @property
    def streams(self) -> dict:
        return {"schedule": self.schedule_stream, "forward": self.forward_stream,
                "copy": self.copy_stream,
                "d2h": self.future_map.fwd_prepare_d2h_stream}

    def add_request(self, req: Req) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running_batch or self.result_queue
                    or (self.last_batch is not None and self.last_batch.reqs))

    # --- the event loop (event_loop_overlap) ------------------------------------------
    def step(self) -> None:
        self.iteration += 1
        with self.mod.stream(self.schedule_stream):
            batch = self.get_next_batch_to_run()
            disable_overlap = batch is not None and self.is_disable_overlap_for_batch(batch)
            if disable_overlap:
                while self.result_queue:
                    self.pop_and_process()
            if batch is not None:
                batch.sync_processed = disable_overlap
                stride = self.args.draft_token_num if batch.forward_mode.is_decode() else 1
                steps = [r.launched - 1 for r in batch.reqs]
                result = self.run_batch(batch)
                self._apply_war_barrier()
                if batch.reqs:  # an idle (DP) batch has no result to process
                    self.result_queue.append((batch.copy(), list(batch.reqs), steps, stride,
                                              result))
            if not self.args.overlap or disable_overlap:
                while self.result_queue:
                    self.pop_and_process()
            elif len(self.result_queue) > 1 or (self.result_queue and not (batch and batch.reqs)):
                self.pop_and_process()
            self.last_batch = batch

    def run_to_completion(self, max_iterations: int = 10_000) -> None:
        while self.has_work() and self.iteration < max_iterations:
            self.step()
        with self.mod.stream(self.schedule_stream):
            while self.result_queue:
                self.pop_and_process()

    def is_disable_overlap_for_batch(self, batch) -> bool:
        """NGRAM grammar batches (``grammar_needs_sync``: no device draft phase to hide the
        grammar work under) and the device-drafted path; a fault plan may reorder."""
        if not batch.forward_mode.is_decode():
            return False
        default = batch.has_grammar or self.args.spec_algorithm == "eagle"
        return bool(ask("schedule.disable_overlap", default, batch=batch))

    def get_next_batch_to_run(self):
        """Schedule stream: merge the last prefill, filter finished, pick the next batch."""
        last = self.last_batch
        if last is not None and last.forward_mode.is_extend():
            self._filter_finished(last)
            if last.reqs:
                if self.running_batch is None:
                    self.running_batch = last
                else:
                    fault_point("schedule.before_merge")
                    self.running_batch.merge_batch(last)
                self.running_batch.forward_mode = upstream.ForwardMode.DECODE
        if self.running_batch is not None:
            self._filter_finished(self.running_batch)
            if not self.running_batch.reqs:
                self.running_batch = None
        if self.waiting and self.free_slots:
            return self._new_prefill_batch()
        if self.running_batch is not None:
            for r in self.running_batch.reqs:
                r.launched += 1
            return self.running_batch
        if self.args.dp_attention:
            return self._idle_batch()
        return None

    def _filter_finished(self, batch) -> None:
        keep = [i for i, r in enumerate(batch.reqs) if not r.finished()]
        if len(keep) < len(batch.reqs):
            fault_point("schedule.before_filter", batch=batch)
            batch.filter_batch(keep_indices=keep)

    def _init_batch(self, reqs: List[Req], forward_mode):
        batch = upstream.ScheduleBatch.init_new(
            reqs, self.req_to_token_pool, None, None, self.model_config,
            enable_overlap=True, spec_algorithm=self.spec_algorithm)
        batch.forward_mode = forward_mode
        batch.sampling_info = SamplingInfo(self.vocab_size)
        return batch

    def _new_prefill_batch(self):
        """``prepare_for_extend``, as far as the relay needs it: indices, lengths and the
        prefill input ids staged in pinned host memory (resolved on the forward stream)."""
        reqs = []
        while self.waiting and self.free_slots and len(reqs) < self.args.max_prefill_reqs:
            req = self.waiting.popleft()
            req.pool_idx = self.free_slots.pop(0)
            req.launched = 1
            reqs.append(req)
        batch = self._init_batch(reqs, upstream.ForwardMode.EXTEND)
        pool = [r.pool_idx for r in reqs]
        lens = [len(r.prompt) for r in reqs]
        batch.req_pool_indices = torch.tensor(pool, dtype=torch.int64, device=self.device)
        batch.req_pool_indices_cpu = torch.tensor(pool, dtype=torch.int64)
        batch.seq_lens = torch.tensor(lens, dtype=torch.int64, device=self.device)
        batch.orig_seq_lens = batch.seq_lens
        batch.seq_lens_cpu = torch.tensor(lens, dtype=torch.int64)
        batch.prefill_input_ids_cpu = torch.tensor(
            [r.prompt[-1] for r in reqs], dtype=torch.int64, pin_memory=True)
        return batch

    def _idle_batch(self):
        batch = self._init_batch([], upstream.ForwardMode.IDLE)
        batch.req_pool_indices = torch.empty((0,), dtype=torch.int64, device=self.device)
        batch.req_pool_indices_cpu = torch.empty((0,), dtype=torch.int64)
        batch.seq_lens = torch.empty((0,), dtype=torch.int64, device=self.device)
        batch.orig_seq_lens = batch.seq_lens
        batch.input_ids = torch.empty((0,), dtype=torch.int64, device=self.device)
        return batch

    # --- run_batch's overlap branch ------------------------------------------------------
    def run_batch(self, batch):
        self.future_map.resolve_seq_lens_cpu(batch)
        with self.forward_stream_ctx:
            self.forward_stream.wait_stream(self.schedule_stream)
            upstream.overlap_utils.resolve_forward_inputs(batch, self.future_map)
            with self._forward_isolation(batch, overlap=True):
                future_indices = batch.req_pool_indices
                batch_result = self.model_worker.forward_batch_generation(
                    batch, on_publish=partial(self.future_map.publish, future_indices))
                batch_result.copy_done = self.device_module.Event()
                self._relay_forward_payload(batch, future_indices, batch_result)
                self._copy_result_to_cpu(batch_result, batch)
        batch.input_ids = None
        batch.spec_info = batch_result.next_draft_input
        batch.spec_info.future_indices = future_indices
        return batch_result

    # upstream's own Scheduler methods, with this engine as their self -- looked up on
    # the class at each call, so a run-time patch of one (a variant, a mutation) is the
    # code that runs
    def _forward_isolation(self, batch, *, overlap: bool):
        return upstream.Scheduler._forward_isolation(self, batch, overlap=overlap)

    def record_batch_in_overlap(self, batch) -> None:
        upstream.Scheduler.record_batch_in_overlap(self, batch)

    def _relay_forward_payload(self, batch, future_indices, batch_result) -> None:
        fault_point("future_map.before_stash")
        upstream.Scheduler._relay_forward_payload(self, batch, future_indices, batch_result)

    def _copy_result_to_cpu(self, batch_result, batch) -> None:
        upstream.Scheduler._copy_result_to_cpu(self, batch_result, batch)

    def _apply_war_barrier(self) -> None:
        upstream.Scheduler._apply_war_barrier(self)

    # --- results ------------------------------------------------------------------------
    def pop_and_process(self) -> None:
        batch, reqs, steps, stride, result = self.result_queue.popleft()
        result.copy_done.synchronize()
        tokens = result.next_token_ids.tolist()
        lens = result.accept_lens.tolist()
        for i, req in enumerate(reqs):
            if req.done:
                continue  # it ran one step past its finish under overlap; drop that step
            accepted = tokens[i * stride: i * stride + lens[i]]
            observe("result", req=req, step=steps[i], accept_len=lens[i],
                        tokens=accepted)
            req.committed_step = steps[i]
            self._commit(req, accepted)

    def _commit(self, req: Req, tokens: List[int]) -> None:
        for tok in tokens:
            req.output_ids.append(tok)
            if req.grammar is not None and not req.grammar.is_terminated():
                req.grammar.accept_token(tok)
            if tok == EOS_ID or len(req.output_ids) >= req.max_new_tokens:
                req.done = True
                self.free_slots.append(req.pool_idx)
                self.finished.append(req)
                return
