"""The EAGLE v2 slice: upstream's EAGLE overlap orchestration under upstream's loop, with
toy target and draft models (``--spec eagle-v2``: ``spec_algorithm="eagle-v2"``).

Upstream's, unmodified: ``EAGLEWorkerV2.forward_batch_generation`` (prefill:
``_forward_prefill_batch`` -> publish -> ``_draft_extend_for_prefill``; decode: the draft's
``EagleDraftWorker.draft`` -> ``run_eagle_verify`` -> publish -> ``_draft_extend_for_decode``),
``prepare_for_draft`` / ``build_eagle_verify_input`` / ``eagle_prepare_for_verify`` /
``eagle_sample`` / ``prepare_for_draft_extend``, ``ForwardBatch.init_new``, the
``KVIndexTranslator`` and ``KVLocPlan`` (where the release has them: its runner builds a
translator from 0.5.19), the plan stream (``get_plan_stream``, under
``SGLANG_ENABLE_OVERLAP_PLAN_STREAM``), ``record_stream_for_v2_verify``, the FutureMap's
EAGLE relay (``RelayPayload.from_draft_input``, the lazy relay buffers, the
``future_indices`` resolve) and ``EagleDraftInput.filter_batch`` / ``merge_batch``. The
worker objects are built with ``__new__`` plus the attributes their methods read (their
constructors load models and capture graphs).

Ours (``eagle_runners``): the two model runners (the toy model's embedding and
projection; the draft proposes the target's successor except at deterministic misses),
the target worker's two calls (prefill, verify), and the GPU kernels without a torch path
(``eagle_kernels``: declared stand-ins). Each runner's forward reads its rows of
``req_to_token`` (its attention metadata) and then publishes read-done, as upstream's
runners do; the draft runner is the step's last shared reader
(``EAGLEWorkerV2.last_shared_read_runner``, upstream's).

The verify, the draft (upstream's ``draft_forward`` captured) and the draft extend run
as CUDA graph replays where the device captures graphs (``eagle_graphs``). Not modelled
(docs/sglang-target.md#eagle-v2): non-greedy sampling, so not the ``draft_probs.clone()`` after the
draft replay. Grammar runs upstream's
``GrammarTree`` / ``build_grammar_vocab_mask`` behind the scheduler's grammar barrier,
which advances through ``GrammarAdvance`` (ours). EAGLE3 (``eagle3``) is its
aux-hidden-state shape: the target hands the draft three layers' hidden states; the toy
draft reads them and ignores their values.
"""
from __future__ import annotations

import contextlib
import inspect
import types
from typing import Iterator

import torch

from seams.faults import observe
from toys.graph_runner import graphs_supported

from targets.sglang.slices import eagle_launch
from targets.sglang.boundary import upstream
from targets.sglang.runner import ranks
from targets.sglang.slices.eagle_graphs import ToyDraftExtendGraphs, ToyDraftGraphs, ToyVerifyGraphs
from targets.sglang.slices.eagle_runners import ToyModelRunner, ToyTargetWorker
from targets.sglang.engine.worker import finish_result, launch_rows


def modules():
    return upstream.import_named({
        "v2": "sglang.srt.speculative.eagle_worker_v2",
        "utils": "sglang.srt.speculative.eagle_utils"})


def algorithm(args):
    """EAGLE, or EAGLE3 (``eagle3``: the draft reads several target layers' hidden
    states -- the aux-hidden-state shape -- through the same v2 worker)."""
    A = upstream.SpeculativeAlgorithm
    return A.EAGLE3 if args.eagle3 else A.EAGLE


@contextlib.contextmanager
def server_context(args, device) -> Iterator[None]:
    """What EAGLE's code reads of the server's config, for one run: upstream's runtime
    context for ``speculative_algorithm="EAGLE"`` and the run's draft shape
    (``upstream.server_config``); the plan stream switch set to the run's
    (``envs...override``); where a release keeps a one-rank server's groups in module
    globals, those the run publishes restored after it (``ranks.scope``)."""
    if args.spec_algorithm != "eagle-v2":
        yield
        return
    with upstream.envs.SGLANG_ENABLE_OVERLAP_PLAN_STREAM.override(args.plan_stream), \
            upstream.server_config(algorithm(args).name, device,
                                   speculative_eagle_topk=args.eagle_topk,
                                   speculative_num_steps=args.draft_token_num - 1,
                                   speculative_num_draft_tokens=args.draft_token_num), \
            ranks.scope():
        # the MoE runtime flags the draft's contexts read, seeded as the scheduler's
        # init seeds them (the toy has no MoE: only the defaults are looked up)
        from sglang.srt.layers.moe.utils import initialize_moe_config
        upstream.with_server_args(initialize_moe_config)  # 0.5.16-0.5.18: passed its args
        yield


class GrammarAdvance:
    """The scheduler's ``batch_result_processor`` as far as the grammar barrier uses it
    (``_advance_pending_grammar`` -> ``advance_grammar_fsm``; upstream's processor needs
    the whole server): advance each request's grammar over the tokens a result still in
    the queue will commit, once (``result.grammar_advanced``), so the next verify's mask
    sees them -- the commit then leaves the grammar alone (``UpstreamLoop.commit``)."""

    def advance_grammar_fsm(self, result, batch) -> None:
        launch = getattr(result, "specrace_launch", None)
        if getattr(result, "grammar_advanced", False) or launch is None \
                or not batch.has_grammar:
            return
        for _, req, _, _, accepted in launch_rows(result)[1]:
            if req.grammar is None or req.done:
                continue
            for tok in accepted:
                # what the commit will keep: up to EOS or the budget
                if req.grammar.is_terminated() or req.grammar_seen >= req.max_new_tokens:
                    break
                req.grammar.accept_token(tok)
                req.grammar_seen += 1
        result.grammar_advanced = True


def build_worker(args, device, model, pools, attention):
    """``EAGLEWorkerV2`` and its ``EagleDraftWorker``, built with ``__new__`` plus the
    attributes their methods read; upstream's plan streams (one each, as their
    constructors make them); the stand-in kernels bound into upstream's modules."""
    eagle_launch.install()
    if ranks.way() == "parallel_state_globals":
        # 0.5.19/0.5.20 read a one-rank server's groups through parallel_state's getters
        # (the forward batch asks get_parallel().moe_ep_size): published as
        # init_torch_distributed leaves them, for the run (server_context restores them).
        # Releases that keep them on the context answer what the slice reaches unstamped.
        ranks.publish(device)
    m = modules()
    V2 = m["v2"]
    dev = str(torch.device(device))
    steps, D, topk = args.draft_token_num - 1, args.draft_token_num, args.eagle_topk
    EAGLE = algorithm(args)
    spec_utils = upstream.spec_utils
    target_runner = ToyModelRunner(model, device, pools.req_to_token_pool, args, False, EAGLE)
    draft_runner = ToyModelRunner(model, device, pools.req_to_token_pool, args, True, EAGLE)
    graphs = args.cuda_graph and graphs_supported(device)
    if graphs:
        target_runner.decode_cuda_graph_runner = ToyVerifyGraphs(
            model, device, D, args.cuda_graph_max_bs, pools.req_to_token_pool.req_to_token,
            target_runner.aux_layers)
    target = ToyTargetWorker(target_runner, attention)
    dw = V2.EagleDraftWorker.__new__(V2.EagleDraftWorker)
    get_plan_stream = _plan_stream_maker(V2, spec_utils)
    dw.plan_stream, dw.plan_stream_ctx = get_plan_stream(dev)
    dw.__dict__.update(
        device=dev, topk=topk, speculative_num_steps=steps, speculative_num_draft_tokens=D,
        speculative_algorithm=EAGLE, target_worker=target, draft_runner=draft_runner,
        req_to_token_pool=pools.req_to_token_pool, cuda_graph_runner=None,
        cuda_graph_runner_for_draft_extend=None, hot_token_id=None,
        index_share_for_mtp_iteration=False, seed_dsa_topk_from_draft_extend=False,
        tree_mask_mode=m["utils"].TreeMaskMode.QLEN_ONLY,
        # the server's args its constructor keeps (0.5.16's draft extend reads
        # speculative_use_rejection_sampling off them; later releases the context)
        server_args=draft_runner.server_args,
        **_draft_placement(V2, spec_utils.draft_tp_context, draft_runner),
        draft_attn_backend=types.SimpleNamespace(
            attn_backends=[draft_runner.attn_backend] * max(steps, 1),
            init_forward_metadata=draft_runner.attn_backend.init_forward_metadata),
        draft_extend_attn_backend=draft_runner.attn_backend)
    dev_t = torch.device(device)
    if topk == 1:  # the chain's parent lists, preallocated (its constructor's buffers)
        rows = args.req_pool_size
        dw._topk1_parents_prealloc = torch.arange(-1, steps - 1, device=dev_t).repeat(rows, 1)
        dw._topk1_score_indices_prealloc = torch.arange(steps, device=dev_t).repeat(rows, 1)
    if graphs:  # captured once the worker is whole: the draft graph is its draft_forward
        dw.cuda_graph_runner = ToyDraftGraphs(dw, args.cuda_graph_max_bs)
        dw.cuda_graph_runner_for_draft_extend = ToyDraftExtendGraphs(
            draft_runner, D, target_runner.model_config.spec_hidden_size
            * target_runner.aux_layers, args.cuda_graph_max_bs, _extend_selects())
    if pools.allocator.get_kvcache() is None:
        # the KV pool upstream's allocator is constructed with (ours: built after it):
        # a tree draft's accepted path moves in it
        pools.allocator._kvcache = pools.kv
    w = V2.EAGLEWorkerV2.__new__(V2.EAGLEWorkerV2)
    w.plan_stream, w.plan_stream_ctx = get_plan_stream(dev)
    w.__dict__.update(
        topk=topk, speculative_num_steps=steps, speculative_num_draft_tokens=D, device=dev,
        _target_worker=target, _draft_worker=dw, speculative_algorithm=EAGLE,
        enable_dp_spec_prefill_coordination=False, adaptive_controller=None,
        req_to_token_pool=pools.req_to_token_pool,
        token_to_kv_pool_allocator=pools.allocator, page_size=1)
    torch.get_device_module(dev_t).synchronize()  # the tables are part of "the checkpoint"
    _install_result_shim(w, target, D)
    return w


def _plan_stream_maker(V2, spec_utils):
    """The function the workers' constructors make their plan streams with: spec_utils'
    ``get_plan_stream`` (0.5.16 on), or the worker module's own ``_get_plan_stream``
    (0.5.15) -- the same switch, read where the release has it."""
    return getattr(spec_utils, "get_plan_stream", None) or V2._get_plan_stream


def _extend_selects() -> bool:
    """Does the release's draft-extend graph runner select the rows inside its graph
    (``execute(forward_batch, select_index)``: 0.5.20 on), as its worker calls it?"""
    from sglang.srt.speculative import eagle_draft_extend_cuda_graph_runner as r
    execute = r.EAGLEDraftExtendCudaGraphRunner.execute
    return "select_index" in inspect.signature(execute).parameters


def _draft_placement(V2, draft_tp_context, draft_runner) -> dict:
    """The draft worker's TP placement on a one-rank server, as its constructor resolves
    it, in the form the release's ``draft_tp_context`` takes (its parameters say which):
    a resolved layout with no group of its own (0.5.23); whether the draft owns
    attention -- it does not: attention DP is off on one rank (0.5.22); or, where the
    context takes the runner's group (0.5.19-0.5.21), the context the worker keeps for
    its methods -- upstream's ``empty_context`` without DP attention, which ignores the
    group it is handed (the runner's ``tp_group``: none of its own here)."""
    params = tuple(inspect.signature(draft_tp_context).parameters)
    if params == ("layout",):
        return {"parallel_layout": types.SimpleNamespace(tp_group=None, disable_cp=False,
                                                         local_dp=True)}
    if params == ("owns_attention",):
        return {"draft_owns_attention": False}
    if params in (("tp_group",), ("tp_group", "owns_attention")):
        draft_runner.tp_group = None
        return {"draft_tp_context": V2.empty_context,
                **({"draft_owns_attention": False} if "owns_attention" in params else {})}
    raise NotImplementedError(f"specrace: a draft TP placement taking {params} is not "
                              f"modelled")


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
