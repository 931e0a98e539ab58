"""Ours, for the EAGLE v2 slice (``targets/sglang/slices/eagle.py``): the model runners the
two workers call (the toy model: embedding and projection; the draft follows the target
except at deterministic misses) and the target worker's prefill and verify (the graphs:
``eagle_graphs``). Each runner's forward reads its rows of ``req_to_token`` (its
attention metadata) and then publishes read-done, as upstream's runners do.
"""
from __future__ import annotations

import dataclasses
import inspect
import types

import torch

from seams.faults import fault_point

from targets import static
from targets.sglang.boundary import upstream
from targets.sglang.runner import ranks
from targets.sglang.runner.build import HFConfig
from targets.sglang.engine.worker import SharedReadRunner, apply_extend_grammar, take_staged_extend


# Where upstream's runner builds a KV index translator (0.5.19 on), which the release's
# forward batch reads off the runner (``rebind_write_loc``) and later releases' EAGLE code
# and graph runners plan and bind through; before it the runner has none and nothing asks
TRANSLATOR_INIT = "sglang.srt.model_executor.model_runner:ModelRunner.init_kv_index_translator"


def builds_translator(root=None) -> bool:
    """Does the release at ``root`` (default: the installed one) build a KV index
    translator in its ``ModelRunner``? Read from its source: the toy runner has one
    exactly where upstream's does."""
    return static.find(root or static.package_root("sglang"), TRANSLATOR_INIT)[0] is not None


def _modules():
    return upstream.import_named({
        "forward_batch": "sglang.srt.model_executor.forward_batch_info",
        **({"translator": "sglang.srt.mem_cache.kv_index_translator"}
           if builds_translator() else {})})


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

    def __init__(self, context_len: int, needs_cpu_seq_lens: bool) -> None:
        # the backend's answer, an axis: FlashInfer's True (the relay mirrors seq_lens to
        # the host each step), FA3's, Triton's and TRT-LLM MHA's False (the draft extend
        # then takes its GPU-only path: no host read of the lengths before it plans)
        self.needs_cpu_seq_lens = needs_cpu_seq_lens
        self.verify_mask = None
        self.max_context_len = context_len
        self.attn_backends = [self]  # the draft's per-step backends

    def init_forward_metadata(self, forward_batch) -> None:
        pass

    def get_verify_buffers_to_fill_after_draft(self):
        # the same answer as verify_mask's, asked the way 0.5.16 asks it (the base
        # backend's: no tree-mask or position buffer of its own)
        return [None, None]

    def update_verify_buffers_to_fill_after_draft(self, verify_input, bs) -> None:
        pass


class ToyModelRunner(SharedReadRunner):
    """A model runner's face, for the target or the draft (module docstring)."""

    def __init__(self, model, device, req_to_token_pool, args, draft: bool,
                 spec_algorithm) -> None:
        self.model = model
        # the server's args, which upstream's runner keeps (0.5.16-0.5.18's forward batch
        # reads them off it: enable_lora); the run's, made current by server_context
        self.server_args = upstream.current_server_args()
        self.device = str(device)
        self.mod = torch.get_device_module(torch.device(device))
        self.req_to_token = req_to_token_pool.req_to_token
        self.is_draft_worker = draft
        V, H = model.vocab_size, model.embed.shape[1]
        self.model_config = types.SimpleNamespace(
            model_is_mrope=False, vocab_size=V, hf_config=HFConfig(), is_draft_model=draft,
            spec_hidden_size=H, dtype=model.embed.dtype, linear_attn_registry_result=None,
            requires_mm_token_modalities=None, hidden_size=H)
        if builds_translator():
            # upstream's translator, non-translating (page size 1, no SWA), where the
            # release's runner has one (TRANSLATOR_INIT): it plans and binds the KV
            # locations the draft and the verify write
            T = _modules()["translator"]
            self.kv_index_translator = T.KVIndexTranslator(
                req_to_token=req_to_token_pool.req_to_token,
                token_to_kv_pool_allocator=object(), token_to_kv_pool=object(), page_size=1,
                device=self.device)
        # no n-gram embedding, in each release's spelling (0.5.15 reads a flag)
        self.ngram_embedding_manager = types.SimpleNamespace(enabled=False)
        self.use_ngram_embedding = False
        self.model_is_mrope = False  # 0.5.15 asks the runner, later releases its config
        self.mambaish_config = None  # no mamba state to commit after a verify (0.5.15 asks)
        self.lora_manager = None
        self.spec_algorithm = spec_algorithm
        # EAGLE3: the target hands the draft three layers' hidden states side by side
        self.aux_layers = 3 if self.spec_algorithm.is_eagle3() and not draft else 1
        self.decode_cuda_graph_runner = None
        self.attn_backend = ToyAttnBackend(args.context_len, args.needs_cpu_seq_lens)
        self.watermark_state = None
        # a backend that supports Triton, as every GPU backend but torch_native does: the
        # forward batch's positions come from the Triton kernel (on the simulator its
        # stand-in, eagle_kernels.compute_position_triton), not from the torch path's
        # per-request .item() -- a host sync a server on FA3 or FlashInfer never makes
        self.prefill_attention_backend_str = "specrace-toy"
        self.canary_manager = None
        # a one-rank server's placement, where a release's forward batch reads it off the
        # runner: no decode context parallelism (before 0.5.22; 0.5.15 names it dcp_*),
        # and on 0.5.15-0.5.20 the ParallelState its constructor is handed
        # (runner/ranks.py)
        self.attn_dcp_size, self.attn_dcp_rank = 1, 0
        self.dcp_size, self.dcp_rank = 1, 0
        ps = ranks.parallel_state()
        if ps is not None:
            self.ps = ps
        self.in_capture = False  # a graph runner is capturing this runner's forward
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
        if not self.in_capture:  # a graph runner publishes after its replay
            self._record_shared_read_done(replayed=True)
        fb.positions.sum()  # the rotary embedding's read of the positions
        spec = getattr(fb, "spec_info", None)
        if self.is_draft_worker and getattr(spec, "hidden_states", None) is not None:
            spec.hidden_states.sum()  # the draft's input: the hidden states it extends
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


def _result_fields():
    return {f.name for f in dataclasses.fields(upstream.GenerationBatchResult)}


class ToyTargetWorker:
    """The target worker's two calls from the EAGLE worker: the prefill (with the full
    hidden states the draft extends from) and the verify forward. Both attend through the
    toy paged attention over the pools (``toys.attention``), as the NGRAM toy does: the
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
        init_new = _modules()["forward_batch"].ForwardBatch.init_new
        # as the release's target worker calls it: the keyword where it takes one
        # (0.5.16 on; 0.5.15's has none)
        kw = ({"return_hidden_states_before_norm": False} if "return_hidden_states_before_norm"
              in inspect.signature(init_new).parameters else {})
        fb = init_new(batch, self.model_runner, **kw)
        fwd = torch.get_device_module(torch.device(self.model_runner.device)).current_stream()
        extend = take_staged_extend(batch, fwd)
        meta = self.attn.init_forward_metadata(batch.req_pool_indices, batch.reqs,
                                               extend.ids.shape[1], prefill=True,
                                               prefix_lens=extend.prefix_lens)
        self.kv_check = self.attn.attend_prefill(meta, extend)
        hidden, logits = self.model_runner.forward_all(fb)
        last = torch.cumsum(fb.extend_seq_lens, 0) - 1
        logits = logits[last]
        if batch.has_grammar:  # the first token is constrained too
            apply_extend_grammar(batch, logits, torch.device(self.model_runner.device))
        next_token_ids = logits.argmax(dim=-1).to(torch.int32)
        # no plan of the prefill's KV slots (the toy writes them itself), where the
        # release's result carries one (0.5.22 on: the KVLocPlan)
        plan = {"kv_loc_plan": None} if "kv_loc_plan" in _result_fields() else {}
        return upstream.GenerationBatchResult(
            logits_output=upstream.LogitsProcessorOutput(next_token_logits=logits,
                                                         hidden_states=hidden),
            next_token_ids=next_token_ids, can_run_cuda_graph=False, **plan)

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
        if graphs is not None and graphs.loaded(fb):
            self.model_runner._record_shared_read_done(replayed=True)  # load_batch read the rows
            hidden, logits = graphs.replay(fb)
            out = types.SimpleNamespace(logits_output=upstream.LogitsProcessorOutput(
                next_token_logits=logits, hidden_states=hidden))
        else:
            out = self.model_runner.forward(fb)
        out.routed_experts_output = out.indexer_topk_output = None
        return out
