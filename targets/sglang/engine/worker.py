"""Ours, under upstream's loop: the toy worker and the request the sglang target runs.

``ToyNgramWorker`` stands in for upstream's ``NGRAMWorker`` (it needs GPU kernels and the
JIT n-gram corpus) with a host n-gram proposer and greedy tree verify, shaped like it: draft
prep reads the relayed accept state with a blocking ``.cpu()`` on the forward stream, the
verify publishes ``new_seq_lens`` through ``on_publish`` and records the shared-read-done
event upstream's ``_apply_war_barrier`` waits on. Its target forward is upstream's
``ModelRunner.forward`` where the release runs it (``targets.sglang.runner``), else the toy
model's. It calls ``record_stream_for_v2_verify``, ``NgramVerifyInput``,
``GenerationBatchResult``, ``GrammarTree`` and ``build_grammar_vocab_mask`` too.
"""
from __future__ import annotations

import types
import weakref
from typing import Any, Optional

import torch

from seams.faults import fault_point, observe
from toys.bitmask import apply_vocab_mask
from toys.drafter import draft_tree
from toys.graph_runner import VerifyGraphRunner
from toys.memory import host_empty, mark_used_on
from toys.model import ToyTargetModel
from toys.ngram import NgramProposer, propose_host_trees
from toys.verify import verify_and_accept

from targets.sglang.boundary import upstream
from targets.sglang.runner import forward as upstream_forward


class SamplingInfo:
    """The sampling state before 0.5.22 (``sampling_info_for``): inert, greedy."""

    # what EAGLE's sampling reads: greedy, no penalties, bias or watermark
    is_all_greedy = True
    acc_additive_penalties = acc_scaling_penalties = logit_bias = sampling_seed = None
    has_watermark_candidates = False

    # prepare_for_decode accumulates penalties only where a penalizer is required
    penalizer_orchestrator = types.SimpleNamespace(is_required=False)

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.grammar_mask = None

    def filter_batch(self, keep_indices, keep_indices_device) -> None:
        pass

    def merge_batch(self, other: "SamplingInfo") -> None:
        pass  # upstream's merge leaves the other batch's extend-stage grammar_mask behind

    def copy_for_forward(self) -> "SamplingInfo":
        return self


def finish_result(result, batch, draft_token_num: int, kv_check=None,
                  decode: Optional[bool] = None):
    """What both toy workers add to a launch's ``GenerationBatchResult``: what the commit
    needs of the launch (ours: upstream keys on the batch) -- its requests, their steps and
    the row stride of its tokens -- what the toy attention read (``kv_check``, copied to
    pinned memory with the result, before upstream's own copies so ``copy_done`` covers
    it) and a fault point on the copy stream before the result's D2H (upstream's
    ``copy_to_cpu``, unchanged; a stall there is a copy engine busy with an earlier
    transfer)."""
    if batch.reqs:
        if decode is None:  # the launch's mode (a worker that changes it passes it)
            decode = batch.forward_mode.is_decode()
        stride = draft_token_num if decode else 1
        result.specrace_launch = (list(batch.reqs), [r.launched - 1 for r in batch.reqs],
                                  stride)
        result.specrace_prefill = not decode  # the KV oracle's context
        result.specrace_extend_ends = None if decode else [r.extend_end for r in batch.reqs]
        if not decode:  # what upstream's prefill processing slices hidden states by
            result.extend_input_len_per_req = list(batch.extend_lens)
    result.specrace_kv_check = kv_check
    # a request whose finish a synchronous step processed before this launch rides in it
    # with its KV released: the KV oracle does not judge what its attention read
    result.specrace_released = [r.done for r in batch.reqs]
    # the wrapper reaches the result through a weak reference: a closure over it would
    # make a reference cycle, and when its storages are freed (a trace record) would then
    # depend on when the garbage collector runs -- the same seed must give the same trace
    result_ref = weakref.ref(result)

    def copy_to_cpu(*a, **kw):
        res = result_ref()
        fault_point("copy.before_result_d2h")
        if res.specrace_kv_check is not None:
            device_check = res.specrace_kv_check
            host = host_empty(device_check.shape, torch.int64, device_check.device)
            host.copy_(device_check, non_blocking=True)
            res.specrace_kv_check, res.specrace_kv_source = host, device_check
        return type(res).copy_to_cpu(res, *a, **kw)
    result.copy_to_cpu = copy_to_cpu
    return result


def launch_rows(result):
    """What a launch's result hands the host (after ``copy_done``): ``(stride, rows)``,
    a row ``(index, request, step, accept length, accepted tokens)`` per request of the
    launch (an EAGLE prefill's result has no accept lengths: one token each)."""
    reqs, steps, stride = result.specrace_launch
    result.copy_done.synchronize()
    tokens = result.next_token_ids.tolist()
    lens = result.accept_lens.tolist() if result.accept_lens is not None \
        else [1] * len(reqs)
    return stride, [(i, req, steps[i], lens[i], tokens[i * stride: i * stride + lens[i]])
                    for i, req in enumerate(reqs)]


def take_staged_extend(batch, stream):
    """The extend the loop staged for a prefill's attention (``stage_extend``, on the
    schedule stream): ``ExtendInputs``, marked used on ``stream`` (the forward) and taken
    off the batch, which drops them after this launch."""
    extend, batch.specrace_extend = batch.specrace_extend, None
    for t in extend.tensors():
        mark_used_on(t, stream)
    return extend


def apply_extend_grammar(batch, logits, device) -> None:
    """The extend stage's mask (both toy workers): one row per request, left on
    ``sampling_info`` (the verify's ``build_grammar_vocab_mask`` must clear it)."""
    reqs = batch.reqs
    first = next(r.grammar for r in reqs if r.grammar is not None)
    mask = first.allocate_vocab_mask(batch.sampling_info.vocab_size, len(reqs), device)
    for i, r in enumerate(reqs):
        if r.grammar is not None and not r.grammar.is_terminated():
            r.grammar.fill_vocab_mask(mask, i)
    mask = first.move_vocab_mask(mask, device)
    apply_vocab_mask(logits, mask)
    if upstream.GrammarMask is None:
        # before GrammarMask (0.5.14-0.5.16) the extend stage leaves the bare mask where
        # upstream's update_regex_vocab_mask puts it, which the verify then clears
        batch.sampling_info.vocab_mask = mask
        return
    batch.sampling_info.grammar_mask = upstream.GrammarMask(first, mask)


class SharedReadRunner:
    """The runner whose shared-read-done event upstream's ``_apply_war_barrier`` waits on
    (and clears): ``last_shared_read_runner.shared_read_done_event`` since 0.5.18,
    ``war_fastpath_runner.war_fastpath_read_done_event`` before. The toy workers are their
    own runner. ``publish_read_done``: whether the release's graph runner publishes
    read-done for this worker's graph replays at all (``--war-barrier``: fine publishes,
    coarse does not); ``graph_max_bs``: the largest batch it replays (0: graphs disabled).

    Upstream publishes only from a graph replay (``decode_cuda_graph_runner``'s
    ``_publish_read_done``, for the mode's declared ``SharedReadEnds``): an extend batch, a
    batch over the graph's size, or a server with graphs disabled runs eagerly and
    publishes nothing, and the scheduler's barrier (``_apply_war_barrier``, which clears the
    event it took) falls back to its coarse fence for that step."""

    mod: Any

    def _init_shared_read(self) -> None:
        self.last_shared_read_runner = self.war_fastpath_runner = self
        self.shared_read_done_event = self.war_fastpath_read_done_event = None
        self.publish_read_done = True
        self.graph_max_bs = 0  # the scheduler object sets it from the server args

    def _replays(self, bs: int) -> bool:
        """Would the release run a decode / verify of ``bs`` requests as a graph replay?"""
        return 0 < bs <= self.graph_max_bs

    def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size: int = 0) -> None:
        """What upstream's result processor tells the worker once the accept counts are
        on the host: nothing to a worker without an adaptive controller (upstream's
        ``BaseSpecWorker`` default)."""

    def _record_shared_read_done(self, replayed: bool) -> None:
        """The point where this forward's shared reads are done: read-done is published
        there when the step is a graph replay (``replayed``) of a publishing release."""
        if self.publish_read_done and replayed:
            event = self.mod.Event()
            event.record()
            self.shared_read_done_event = self.war_fastpath_read_done_event = event
        fault_point("forward.after_read_done")


class DraftRunner:
    """The device drafter's runner (the EAGLE-style path). Every upstream runner publishes
    read-done of its own; the scheduler's barrier must take the one of the step's *last*
    shared-buffer reader (``last_shared_read_runner``) -- here the target, whose attention
    gathers the pools after the draft."""

    def __init__(self, mod) -> None:
        self.mod = mod
        self.shared_read_done_event = self.war_fastpath_read_done_event = None

    def publish_read_done(self) -> None:
        event = self.mod.Event()
        event.record()
        self.shared_read_done_event = self.war_fastpath_read_done_event = event


class ToyNgramWorker(SharedReadRunner):
    """Stands in for upstream's NGRAMWorker + target worker, shaped like them.

    The sampler is ours too (upstream's applies the grammar bitmask with a triton kernel,
    which has no simulator path): masks are upstream's ``GrammarMask`` objects, applied
    with plain torch ops. ``device_drafted`` is the EAGLE-style path: a device drafter
    builds the tree on the forward stream and ``GrammarTree.from_device`` stages it.
    """

    def __init__(self, model: ToyTargetModel, device, draft_token_num: int,
                 overlap: bool, device_drafted: bool = False,
                 verify_graphs: Optional[VerifyGraphRunner] = None,
                 attention: Any = None) -> None:
        self.model = model
        self.device = torch.device(device)
        self.mod = torch.get_device_module(self.device)
        self.D = draft_token_num
        self.overlap = overlap
        self.device_drafted = device_drafted
        self.proposer = NgramProposer(draft_token_num)
        # the verify forward as graph replays into static (hidden, logits) buffers, as the
        # decode graph runner's are (``return_hidden_states`` runs: the readback of them)
        self.verify_graphs = verify_graphs
        self.attn = attention  # the toy paged attention over the memory pools
        self.draft_runner = DraftRunner(self.mod) if device_drafted else None
        self.model_runner = None  # upstream's ModelRunner, where it runs (runner.build)
        self._init_shared_read()

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None):
        fwd = self.mod.current_stream()
        upstream.spec_utils.record_stream_for_v2_verify(batch, None, fwd)
        bs, D = len(batch.reqs), self.D
        kv_check = None
        if batch.forward_mode.is_extend():
            extend = take_staged_extend(batch, fwd)
            meta = self.attn.init_forward_metadata(batch.req_pool_indices, batch.reqs,
                                                   extend.ids.shape[1], prefill=True,
                                                   prefix_lens=extend.prefix_lens)
            ran = upstream_forward.extend(self.model_runner, batch)  # None: the toy's
            self._record_shared_read_done(replayed=False)  # an extend runs eagerly
            kv_check = self.attn.attend_prefill(meta, extend)
            hidden, logits = ran or self.model.forward_with_hidden(batch.input_ids)
            if batch.has_grammar:
                apply_extend_grammar(batch, logits, self.device)
            predict = logits.argmax(dim=-1)
            new_seq_lens = batch.seq_lens.clone()
            accept_tokens = torch.zeros((bs, D), dtype=torch.int32, device=self.device)
            accept_tokens[:, 0] = predict.to(torch.int32)
            accept_tokens = accept_tokens.flatten()
            accept_lens = torch.ones((bs,), dtype=torch.int32, device=self.device)
            next_token_ids = predict
        elif bs == 0:  # a DP-idle rank: empty tensors all the way
            hidden = None
            accept_tokens = torch.empty((0,), dtype=torch.int32, device=self.device)
            accept_lens = torch.empty((0,), dtype=torch.int32, device=self.device)
            new_seq_lens = torch.empty((0,), dtype=torch.int64, device=self.device)
            next_token_ids = accept_tokens
        else:
            if self.device_drafted:
                drafts, nt, ns, tree = self._device_tree(batch)
            else:
                drafts, nt, ns, tree = self._prepare_for_speculative_decoding(batch)
            meta = self.attn.init_forward_metadata(batch.req_pool_indices, batch.reqs, D,
                                                   prefill=False)
            ran = upstream_forward.verify(self.model_runner, batch, drafts, meta.window)
            self._record_shared_read_done(replayed=self._replays(bs))
            kv_check = self.attn.attend(meta, drafts.view(bs, D), None, meta.n)
            runner = self.verify_graphs
            if ran is None and runner is not None and runner.can_run(bs):  # the verify
                hidden, logits = runner.replay(drafts)
            else:
                hidden, logits = ran or self.model.forward_with_hidden(drafts)
            self._sample_masks(batch, logits, tree)
            accept_tokens, accept_lens = verify_and_accept(self.attn, meta, logits, drafts,
                                                           nt, ns, bs, D)
            new_seq_lens = batch.seq_lens + accept_lens
            next_token_ids = accept_tokens
        if on_publish is not None:
            on_publish(new_seq_lens)
        next_draft_input = upstream.NgramVerifyInput(
            draft_token_num=D, new_seq_lens=new_seq_lens, accept_tokens=accept_tokens,
            accept_lens=accept_lens)
        result = upstream.GenerationBatchResult(
            next_token_ids=next_token_ids, accept_lens=accept_lens,
            new_seq_lens=new_seq_lens, next_draft_input=next_draft_input,
            speculative_num_draft_tokens=D)
        if batch.return_hidden_states and hidden is not None:
            result.logits_output = upstream.LogitsProcessorOutput(
                next_token_logits=logits, hidden_states=hidden)
        return finish_result(result, batch, D, kv_check)

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
        drafts, next_token, next_sibling = propose_host_trees(
            self.proposer, batch.reqs, prev_tokens, prev_lens, D)
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
        # The root is the last accepted token of the relayed accept state, on the device (as
        # EAGLE's draft input carries it): right whether or not the host committed it yet.
        spec, bs, D = batch.spec_info, len(batch.reqs), self.D
        last = (spec.accept_lens.to(torch.int64) - 1).clamp(min=0).view(bs, 1)
        roots = spec.accept_tokens.view(bs, D).to(torch.int64).gather(1, last).view(bs)
        drafts, next_token, next_sibling = draft_tree(roots, self.D, self.model.vocab_size)
        self.draft_runner.publish_read_done()
        fault_point("forward.after_draft")
        tree = None
        if batch.has_grammar:
            tree = upstream.GrammarTree.from_device(next_token, next_sibling,
                                                    drafts.view(len(batch.reqs), self.D))
        return drafts, next_token, next_sibling, tree

    def _sample_masks(self, batch, logits, tree) -> None:
        """Upstream's verify mask first (it clears the stale extend-stage mask), then
        whatever ``sampling_info`` still carries, then the verify mask itself."""
        info = batch.sampling_info
        grammar_mask = None
        if tree is not None:
            grammar_mask = upstream.spec_utils.build_grammar_vocab_mask(
                reqs=batch.reqs, tree=tree, sampling_info=info, device=self.device,
                barrier=None)
        else:
            # the batch's grammar requests left it before their first verify: nothing
            # upstream runs here clears the extend stage's mask (0.5.23's own sampler drops
            # it once the extend applied it; the toy extend keeps it for this verify)
            info.grammar_mask = None
        if info.grammar_mask is not None:
            apply_vocab_mask(logits, info.grammar_mask.vocab_mask)
        if grammar_mask is not None:
            apply_vocab_mask(logits, grammar_mask.vocab_mask)


def sampling_info_for(batch, vocab_size: int):
    """The batch's sampling state: upstream's ``SamplingBatchInfo.from_schedule_batch``
    where the requests are upstream's ``Req`` (``requests.fits``; a test may run
    specrace's ``Req`` on such a release) -- so the per-request
    sampling tensors are built, filtered and merged on the schedule stream by upstream's
    code -- else ``SamplingInfo``. Both are greedy (the requests ask temperature 0)."""
    from targets.sglang.engine import requests
    if not requests.fits() or not all(hasattr(r, "sampling_params") for r in batch.reqs):
        return SamplingInfo(vocab_size)
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    return SamplingBatchInfo.from_schedule_batch(batch, vocab_size)


def penalties_run_eagerly() -> None:
    """The repetition penalty's ``apply_scaling_penalties`` is torch.compile'd (an
    optimisation of a plain-torch ``where``); inductor has no simulator backend, so it runs
    as written -- its eager original, bound where the penalizer and the EAGLE verify look
    it up (a run-time patch of the module's name, idempotent; as the draft's top-k:
    ``slices.eagle_kernels.install_rest``)."""
    import importlib
    from seams import process
    rp = importlib.import_module("sglang.srt.sampling.penaltylib.repetition_penalty")
    f = rp.apply_scaling_penalties
    rp.apply_scaling_penalties = getattr(f, "_torchdynamo_orig_callable", f)
    process.note("sglang-kernel-seams")
