"""The EAGLE v2 slice: upstream's EAGLE overlap orchestration under upstream's loop, with
toy target and draft models (``--spec eagle-v2``: ``spec_algorithm="eagle-v2"``).

Upstream's, unmodified: ``EAGLEWorkerV2.forward_batch_generation`` (prefill:
``_forward_prefill_batch`` -> publish -> ``_draft_extend_for_prefill``; decode: the draft's
``EagleDraftWorker.draft`` -> ``run_eagle_verify`` -> publish -> ``_draft_extend_for_decode``),
``prepare_for_draft`` / ``build_eagle_verify_input`` / ``eagle_prepare_for_verify`` /
``eagle_sample`` / ``prepare_for_draft_extend``, ``ForwardBatch.init_new``, the
``KVIndexTranslator`` and ``KVLocPlan``, the plan stream (``get_plan_stream``, under
``SGLANG_ENABLE_OVERLAP_PLAN_STREAM``), ``record_stream_for_v2_verify``, the FutureMap's
EAGLE relay (``RelayPayload.from_draft_input``, the lazy relay buffers, the
``future_indices`` resolve) and ``EagleDraftInput.filter_batch`` / ``merge_batch``. The
worker objects are built with ``__new__`` plus the attributes their methods read (their
constructors load models and capture graphs).

Ours: the two model runners (``ToyModelRunner``: the toy model's embedding and
projection; the draft proposes the target's successor except at deterministic misses),
the target worker's two calls (prefill, verify), and the GPU kernels without a torch path
(``eagle_kernels``: declared stand-ins). Each runner's forward reads its rows of
``req_to_token`` (its attention metadata) and then publishes read-done, as upstream's
runners do; the draft runner is the step's last shared reader
(``EAGLEWorkerV2.last_shared_read_runner``, upstream's).

The target's verify runs as CUDA graph replays where the device captures graphs
(``ToyVerifyGraphs``: upstream's ``eagle_prepare_for_verify`` loads them, on the plan
stream when there is one). Not modelled yet (README "EAGLE v2"): graphs for the draft
and the draft extend (so not the
``draft_probs.clone()`` reuse), grammar, non-greedy sampling. EAGLE3 (``eagle3``) is its
aux-hidden-state shape: the target hands the draft three layers' hidden states; the toy
draft reads them and ignores their values.
"""
from __future__ import annotations

import contextlib
import dataclasses
import types
from typing import Any, Iterator

import torch

from harness.faults import fault_point, observe
from impl.graph_runner import graphs_supported
from impl.memory import mark_used_on

from . import eagle_kernels, upstream
from .worker import SharedReadRunner, finish_result


def modules():
    return upstream.import_named({
        "v2": "sglang.srt.speculative.eagle_worker_v2",
        "utils": "sglang.srt.speculative.eagle_utils",
        "translator": "sglang.srt.mem_cache.kv_index_translator",
        "forward_batch": "sglang.srt.model_executor.forward_batch_info"})


def algorithm(args):
    """EAGLE, or EAGLE3 (``eagle3``: the draft reads several target layers' hidden
    states -- the aux-hidden-state shape -- through the same v2 worker)."""
    A = upstream.SpeculativeAlgorithm
    return A.EAGLE3 if args.eagle3 else A.EAGLE


@contextlib.contextmanager
def server_context(args) -> Iterator[None]:
    """What EAGLE's code reads of the server's config, for one run: upstream's runtime
    context projected from ``ServerArgs(speculative_algorithm="EAGLE", ...)`` and made
    current with ``use_context``; the plan stream switch set to the run's
    (``envs...override``)."""
    if args.spec_algorithm != "eagle-v2":
        yield
        return
    from sglang.srt import runtime_context as rc
    from sglang.srt.server_args import ServerArgs
    ctx = rc.RuntimeContext(parallel=rc.ParallelContext())
    ctx.set_server_args(ServerArgs(
        model_path="specrace-toy", speculative_algorithm=algorithm(args).name,
        speculative_eagle_topk=args.eagle_topk,
        speculative_num_steps=args.draft_token_num - 1,
        speculative_num_draft_tokens=args.draft_token_num))
    with upstream.envs.SGLANG_ENABLE_OVERLAP_PLAN_STREAM.override(args.plan_stream), \
            rc.use_context(ctx):
        # the MoE runtime flags the draft's contexts read, seeded as the scheduler's
        # init seeds them (the toy has no MoE: only the defaults are looked up)
        from sglang.srt.layers.moe.utils import initialize_moe_config
        initialize_moe_config()
        yield


class _HFConfig(types.SimpleNamespace):
    """The fields of a Hugging Face config that ``ForwardBatch.init_new`` and the EAGLE
    code look up (a toy decoder: none of the multimodal or rope-scaling ones)."""

    def __init__(self) -> None:
        super().__init__(architectures=["SpecraceToyForCausalLM"], dtype=None,
                         language_config=None, llm_config=None, model_type="specrace-toy",
                         rope_scaling=None, text_config=None, thinker_config=None,
                         vision_config=None)

    def get_text_config(self):
        return self


def aux_hidden(hidden: torch.Tensor, layers: int) -> torch.Tensor:
    """The hidden states the target hands the draft: with EAGLE3's aux layers, the toy's
    "layers" side by side (the last one and scalings of it)."""
    if layers == 1:
        return hidden
    return torch.cat([hidden * (1.0 + k) for k in range(layers)], dim=1)


class ToyAttnBackend:
    """What the EAGLE code asks of an attention backend: no verify mask buffer (the toy
    attends to nothing a mask would restrict), the context length, metadata init (the
    runner's forward does its reads), and the plan stream's post-draft fix-up."""

    needs_cpu_seq_lens = True  # FlashInfer's answer: seq_lens are mirrored to the host

    def __init__(self, context_len: int) -> None:
        self.verify_mask = None
        self.max_context_len = context_len
        self.attn_backends = [self]  # the draft's per-step backends

    def init_forward_metadata(self, forward_batch) -> None:
        pass

    def update_verify_buffers_to_fill_after_draft(self, verify_input, bs) -> None:
        pass


class ToyModelRunner(SharedReadRunner):
    """A model runner's face, for the target or the draft (module docstring)."""

    def __init__(self, model, device, req_to_token_pool, args, draft: bool) -> None:
        self.model = model
        self.device = str(device)
        self.mod = torch.get_device_module(torch.device(device))
        self.req_to_token = req_to_token_pool.req_to_token
        self.is_draft_worker = draft
        V, H = model.vocab_size, model.embed.shape[1]
        self.model_config = types.SimpleNamespace(
            model_is_mrope=False, vocab_size=V, hf_config=_HFConfig(), is_draft_model=draft,
            spec_hidden_size=H, dtype=model.embed.dtype, linear_attn_registry_result=None,
            requires_mm_token_modalities=None, hidden_size=H)
        T = modules()["translator"]
        # upstream's translator, non-translating (page size 1, no SWA): it plans and binds
        # the KV locations the draft and the verify write
        self.kv_index_translator = T.KVIndexTranslator(
            req_to_token=req_to_token_pool.req_to_token, token_to_kv_pool_allocator=object(),
            token_to_kv_pool=object(), page_size=1, device=self.device)
        self.ngram_embedding_manager = types.SimpleNamespace(enabled=False)
        self.lora_manager = None
        self.spec_algorithm = algorithm(args)
        # EAGLE3: the target hands the draft three layers' hidden states side by side
        self.aux_layers = 3 if self.spec_algorithm.is_eagle3() and not draft else 1
        self.decode_cuda_graph_runner = None
        self.attn_backend = ToyAttnBackend(args.context_len)
        self.watermark_state = None
        self.prefill_attention_backend_str = "specrace-toy"
        self.canary_manager = None
        self._init_shared_read()
        self.last_shared_read_runner = None  # a runner is not a worker

    def forward(self, forward_batch, **kw):
        """Attention metadata (this forward's reads of its ``req_to_token`` rows), then
        read-done, then the toy model. A prefill extend returns each request's last row
        (upstream's logits processor keeps only those)."""
        fb = forward_batch
        hidden, logits = self.forward_all(fb)
        if fb.forward_mode == upstream.ForwardMode.EXTEND:  # not a verify or draft extend
            last = torch.cumsum(fb.extend_seq_lens, 0) - 1
            hidden, logits = hidden[last], logits[last]
        return types.SimpleNamespace(logits_output=upstream.LogitsProcessorOutput(
            next_token_logits=logits, hidden_states=hidden))

    def forward_all(self, fb):
        """``(hidden, logits)`` of every input row. The draft's logits follow the
        target's except at its misses (after a token that ``% 5 == 0`` it ranks a wrong
        guess first): acceptance varies, the output never does."""
        rows = fb.req_pool_indices.to(torch.int64)
        # the attention metadata: the rows' slots up to each sequence's length (a real
        # backend's gather; what the plan stream prepares, the forward reads here)
        self.req_to_token[rows].sum()
        fb.seq_lens.sum()
        self._record_shared_read_done()
        fb.positions.sum()  # the rotary embedding's read of the positions
        ids = fb.input_ids.to(torch.int64)
        hidden, logits = self.model.forward_with_hidden(ids)
        hidden = aux_hidden(hidden, self.aux_layers)
        if self.is_draft_worker:
            # a miss ranks a wrong token just above the right one: a chain draft takes
            # the wrong one, a tree draft keeps both (and its accepted path leaves the
            # front of the tree when the right one is the second child)
            V = logits.shape[1]
            wrong = torch.nn.functional.one_hot((ids + 2) % V, V).to(torch.bool)
            lift = logits.max(dim=1, keepdim=True).values + 0.05
            miss = (ids % 5 == 0).unsqueeze(1) & wrong
            logits = torch.where(miss, lift, logits)
        return hidden, logits


class ToyVerifyGraphs:
    """The target's decode graph runner for the verify (``decode_cuda_graph_runner``): one
    captured toy forward per batch-size bucket. ``load_batch`` -- which upstream's
    ``eagle_prepare_for_verify`` calls on the plan stream when there is one -- copies the
    verify's input ids into the bucket's static buffer and gathers the rows' metadata;
    ``replay`` (the verify forward, on the forward stream) runs the graph and hands out
    views of its static outputs."""

    def __init__(self, model, device, D: int, max_bs: int, req_to_token,
                 aux_layers: int = 1) -> None:
        from impl.graph_runner import VerifyGraphRunner

        def forward(ids):
            hidden, logits = model.forward_with_hidden(ids)
            return aux_hidden(hidden, aux_layers), logits
        self.graphs = VerifyGraphRunner(model, device, D, max_bs, forward=forward)
        self.D = D
        self.req_to_token = req_to_token
        self.bs = None  # the loaded bucket (upstream's runner exposes it)
        self.loaded = None  # the forward batch last loaded

    def can_run_graph(self, forward_batch) -> bool:
        return self.graphs.can_run(forward_batch.batch_size)

    def load_batch(self, forward_batch) -> None:
        fb = forward_batch
        n = fb.input_ids.shape[0]
        self.bs = next(b for b in self.graphs.capture_bs if b * self.D >= n)
        self.graphs.input_ids[self.bs][:n].copy_(fb.input_ids)
        self.req_to_token[fb.req_pool_indices.to(torch.int64)].sum()  # the metadata
        self.loaded = fb

    def replay(self, forward_batch):
        n = forward_batch.input_ids.shape[0]
        self.graphs.graphs[self.bs].replay()
        hidden, logits = self.graphs.logits[self.bs]
        return hidden[:n], logits[:n]


class ToyTargetWorker:
    """The target worker's two calls from the EAGLE worker: the prefill (with the full
    hidden states the draft extends from) and the verify forward. Both attend through the
    toy paged attention over the pools (``impl.attention``), as the NGRAM toy does: the
    prefill writes the prompt's KV; the verify writes its ``D`` nodes' KV into the slots
    upstream planned (``out_cache_loc``) and reads the context up to the length upstream
    resolved (``seq_lens``) -- what it read is the KV oracle's (``kv_check``). A tree
    draft's accepted path then moves in the same KV pool (upstream's
    ``move_accept_tokens_to_target_kvcache``)."""

    def __init__(self, runner: ToyModelRunner, attention) -> None:
        self.model_runner = runner
        self.model_config = runner.model_config
        self.attn = attention
        self.batch = None  # the launch's ScheduleBatch (the EAGLE worker's shim sets it)
        self.kv_check = None  # what this launch's attention read, for the result

    def forward_batch_generation(self, batch=None, forward_batch=None, is_verify=False,
                                 pp_proxy_tensors=None, capture_hidden_mode=None,
                                 return_kv_loc_plan=False, **kw):
        if is_verify:
            return self._verify(forward_batch)
        fb = modules()["forward_batch"].ForwardBatch.init_new(
            batch, self.model_runner, return_hidden_states_before_norm=False)
        fwd = torch.get_device_module(torch.device(self.model_runner.device)).current_stream()
        prompt_ids, prompt_lens = batch.specrace_prompt_ids, batch.specrace_prompt_lens
        for t in (prompt_ids, prompt_lens):
            mark_used_on(t, fwd)  # staged on the schedule stream, dropped below
        batch.specrace_prompt_ids = batch.specrace_prompt_lens = None
        meta = self.attn.init_forward_metadata(batch.req_pool_indices, batch.reqs,
                                               prompt_ids.shape[1], prefill=True)
        self.kv_check = self.attn.attend_prefill(meta, prompt_ids, prompt_lens)
        hidden, logits = self.model_runner.forward_all(fb)
        last = torch.cumsum(fb.extend_seq_lens, 0) - 1
        next_token_ids = logits[last].argmax(dim=-1).to(torch.int32)
        return upstream.GenerationBatchResult(
            logits_output=upstream.LogitsProcessorOutput(next_token_logits=logits[last],
                                                         hidden_states=hidden),
            next_token_ids=next_token_ids, kv_loc_plan=None, can_run_cuda_graph=False)

    def _verify(self, fb):
        batch = self.batch
        bs = fb.seq_lens.shape[0]
        meta = self.attn.init_forward_metadata(fb.req_pool_indices.to(torch.int64),
                                               batch.reqs, fb.input_ids.shape[0] // bs,
                                               prefill=False)
        meta = dataclasses.replace(meta, window=fb.out_cache_loc.to(torch.int64).view(bs, -1))
        self.kv_check = self.attn.attend(meta, fb.input_ids.view(bs, -1), None,
                                         fb.seq_lens.to(torch.int64))
        fault_point("forward.before_verify")
        graphs = self.model_runner.decode_cuda_graph_runner
        if graphs is not None and graphs.loaded is fb:
            self.model_runner._record_shared_read_done()  # load_batch read the rows
            hidden, logits = graphs.replay(fb)
            out = types.SimpleNamespace(logits_output=upstream.LogitsProcessorOutput(
                next_token_logits=logits, hidden_states=hidden))
        else:
            out = self.model_runner.forward(fb)
        out.routed_experts_output = out.indexer_topk_output = None
        return out


def build_worker(args, device, model, pools, attention):
    """``EAGLEWorkerV2`` and its ``EagleDraftWorker``, built with ``__new__`` plus the
    attributes their methods read; upstream's plan streams (one each, as their
    constructors make them); the stand-in kernels bound into upstream's modules."""
    eagle_kernels.install()
    m = modules()
    V2 = m["v2"]
    dev = str(torch.device(device))
    steps, D, topk = args.draft_token_num - 1, args.draft_token_num, args.eagle_topk
    EAGLE = algorithm(args)
    spec_utils = upstream.spec_utils
    target_runner = ToyModelRunner(model, device, pools.req_to_token_pool, args, draft=False)
    draft_runner = ToyModelRunner(model, device, pools.req_to_token_pool, args, draft=True)
    if args.cuda_graph and graphs_supported(device):
        target_runner.decode_cuda_graph_runner = ToyVerifyGraphs(
            model, device, D, args.cuda_graph_max_bs, pools.req_to_token_pool.req_to_token,
            target_runner.aux_layers)
    target = ToyTargetWorker(target_runner, attention)
    dw = V2.EagleDraftWorker.__new__(V2.EagleDraftWorker)
    dw.plan_stream, dw.plan_stream_ctx = spec_utils.get_plan_stream(dev)
    dw.__dict__.update(
        device=dev, topk=topk, speculative_num_steps=steps, speculative_num_draft_tokens=D,
        speculative_algorithm=EAGLE, target_worker=target, draft_runner=draft_runner,
        req_to_token_pool=pools.req_to_token_pool, cuda_graph_runner=None,
        cuda_graph_runner_for_draft_extend=None, hot_token_id=None,
        index_share_for_mtp_iteration=False, seed_dsa_topk_from_draft_extend=False,
        tree_mask_mode=m["utils"].TreeMaskMode.QLEN_ONLY, server_args=types.SimpleNamespace(),
        parallel_layout=types.SimpleNamespace(tp_group=None, disable_cp=False, local_dp=True),
        draft_attn_backend=types.SimpleNamespace(
            attn_backends=[draft_runner.attn_backend] * max(steps, 1),
            init_forward_metadata=draft_runner.attn_backend.init_forward_metadata),
        draft_extend_attn_backend=draft_runner.attn_backend)
    dev_t = torch.device(device)
    if topk == 1:  # the chain's parent lists, preallocated (its constructor's buffers)
        rows = args.req_pool_size
        dw._topk1_parents_prealloc = torch.arange(-1, steps - 1, device=dev_t).repeat(rows, 1)
        dw._topk1_score_indices_prealloc = torch.arange(steps, device=dev_t).repeat(rows, 1)
    if pools.allocator.get_kvcache() is None:
        # the KV pool upstream's allocator is constructed with (ours: built after it):
        # a tree draft's accepted path moves in it
        pools.allocator._kvcache = pools.kv
    w = V2.EAGLEWorkerV2.__new__(V2.EAGLEWorkerV2)
    w.plan_stream, w.plan_stream_ctx = spec_utils.get_plan_stream(dev)
    w.__dict__.update(
        topk=topk, speculative_num_steps=steps, speculative_num_draft_tokens=D, device=dev,
        _target_worker=target, _draft_worker=dw, speculative_algorithm=EAGLE,
        enable_dp_spec_prefill_coordination=False, adaptive_controller=None,
        req_to_token_pool=pools.req_to_token_pool,
        token_to_kv_pool_allocator=pools.allocator, page_size=1)
    torch.get_device_module(dev_t).synchronize()  # the tables are part of "the checkpoint"
    _install_result_shim(w, target, D)
    return w


def _install_result_shim(worker, target: ToyTargetWorker, D: int) -> None:
    """A probe shim on the instance, calling upstream's method unchanged: what the commit
    and the oracle need of the launch (``worker.finish_result``)."""
    forward = type(worker).forward_batch_generation

    def forward_batch_generation(batch, *a, **kw):
        # upstream leaves the batch in DRAFT_EXTEND_V2 (the loop's _forward_isolation
        # restores it): the launch's mode is the one it came with
        decode = batch.forward_mode.is_decode()
        if decode and batch.reqs and batch.seq_lens_cpu is not None:
            # the lengths the launch plans with: the host mirror resolve_seq_lens_cpu made
            # of what the previous verify published (the oracle's "seq_lens")
            observe("seq_lens", reqs=list(batch.reqs),
                    steps=[r.launched - 1 for r in batch.reqs],
                    lens=batch.seq_lens_cpu.tolist())
        target.batch, target.kv_check = batch, None
        result = forward(worker, batch, *a, **kw)
        kv_check, target.batch, target.kv_check = target.kv_check, None, None
        return finish_result(result, batch, D, kv_check, decode=decode)
    worker.forward_batch_generation = forward_batch_generation

    # the fine fence's switch (``--war-barrier``) reaches both runners
    def set_publish(value: bool) -> None:
        for runner in (worker._target_worker.model_runner, worker._draft_worker.draft_runner):
            runner.publish_read_done = value
    worker.set_publish_read_done = set_publish
