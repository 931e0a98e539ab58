"""The DSpark slice: upstream's DSpark overlap code under upstream's loop, with a toy
worker shaped like ``DSparkWorkerV2`` (``--spec dspark``: ``spec_algorithm="dspark"``).

Upstream's, unmodified: the ``FutureMap`` of ``SpeculativeAlgorithm.DSPARK`` (bonus-token
relay, seq-lens publish, and -- in a ragged verify mode -- the ``ConfidenceRelay`` ring
with its private D2H stream and ``copy_done[slot].query()`` poll), ``run_batch``'s
``_confidence_budget_prepare`` hook bound to ``DSparkVerifyPlanner.prepare_verify_budget``
(``resolve_confidence_cpu`` -> ``HostConfidenceBudgetPlanner.compute_budget``: survival,
lag carry, ``compute_verify_token_budget``; all torch on the host), ``DFlashDraftInputV2``
(made by ``make_draft_input_v2``; its ``filter_batch`` / ``merge_batch`` run inside
``ScheduleBatch``'s), ``RelayPayload.from_draft_input``, ``_copy_result_to_cpu`` /
``GenerationBatchResult.copy_to_cpu``.

Ours (``ToyDSparkWorker``), because the real worker needs the DeepSeek-V4 target, the MoE
draft and their GPU kernels: the draft (a chain of ``gamma`` tokens from the relayed bonus
token, by the toy model's successor table with deterministic misses), the confidence head
(a float per draft position, published on decode steps only, as DSpark does), the verify
(greedy chain accept) and -- with ``folded_accept`` -- the verify *epilogue captured in the
verify graph*: the accept writes persistent static buffers (``out_tokens``,
``commit_lens``, ``new_seq_lens``, ``bonus``) and the result hands out views of them, as
``DsparkVerifyEpilogue.read_accept`` does (``dspark_verify.py``). The planner object is
built as the scheduler is (``__new__`` plus the attributes its methods read), with a small
profiled-looking SPS table in place of ``--speculative-dspark-sps-table-path``.

Two probe shims sit on the FutureMap instance, each calling upstream's method unchanged:
``publish`` marks a fault point on the private D2H stream before the ring copy is queued
(``d2h.before_ring_copy``: a stall there is a busy copy engine), and
``resolve_confidence_cpu`` reports what the planner got (``observe``); a third, on the
budget planner's survival step, reports which rows it used (``_install_budget_probe``).
"""
from __future__ import annotations

import contextlib
import functools
import types
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from seams.faults import fault_point, observe
from toys.graph_runner import CAPTURE_BS, VerifyGraphRunner, capture_graphs, graphs_supported
from toys.model import ToyTargetModel, successor

from targets.sglang.boundary import upstream
from targets.sglang.engine.worker import SharedReadRunner, finish_result


def modules() -> Dict[str, Any]:
    """DSpark's upstream modules, imported on first use (releases before 0.5.16 have no
    DSpark: ``contract.features``)."""
    return upstream.import_named({
        "planner": "sglang.srt.speculative.dspark_components.dspark_planner",
        "sps": "sglang.srt.speculative.dspark_components.dspark_sps",
        "ragged": "sglang.srt.speculative.ragged_verify",
        "draft_common": "sglang.srt.speculative.draft_worker_common"})


@contextlib.contextmanager
def server_context(args, device) -> Iterator[None]:
    """What DSpark's code reads of the server's config, for one run: upstream's runtime
    context for ``speculative_algorithm="DSPARK"``, made current the way the release's
    source does (``upstream.server_config``: ``use_context``, or on 0.5.19-0.5.21 the
    process's context snapshotted, reset and restored), and ``SGLANG_RAGGED_VERIFY_MODE``
    set to the run's mode (``envs...override``)."""
    if args.spec_algorithm != "dspark":
        yield
        return
    with upstream.envs.SGLANG_RAGGED_VERIFY_MODE.override(args.ragged_verify_mode), \
            upstream.server_config("DSPARK", device):
        yield


def build_planner(args, req_to_token_pool):
    """Upstream's ``DSparkVerifyPlanner``, without ``__init__`` (which reads the whole
    server's config): the attributes ``prepare_verify_budget`` and the methods it calls
    read. The ragged verify mode is upstream's ``read_ragged_verify_mode`` (inside
    ``server_context``); non-static modes get the budget planner, as in upstream's
    constructor."""
    m = modules()
    P = m["planner"]
    planner = P.DSparkVerifyPlanner.__new__(P.DSparkVerifyPlanner)
    gamma = args.draft_token_num - 1
    planner.gamma = gamma
    planner.verify_num_draft_tokens = args.draft_token_num
    planner.model_runner = types.SimpleNamespace(req_to_token_pool=req_to_token_pool)
    planner._ragged_verify_mode = m["ragged"].read_ragged_verify_mode()
    planner._schedule_cfg = P.DSparkScheduleConfig(gamma=gamma)
    planner._dp_tier_gather_enabled = False
    planner._dynamic_graph_tier = True
    planner._is_verify_all = False
    planner._uniform_layout_cache = {}
    static = planner._ragged_verify_mode is m["ragged"].RaggedVerifyMode.STATIC
    planner._confidence_head = None if static else "toy confidence head"
    planner._budget_planner = None
    if not static:
        # steps/s falling with the batch's tokens: the budget then depends on the
        # confidence (a flat, uninitialised table makes it verify-all)
        cap = max(64, args.req_pool_size * args.draft_token_num)
        sps = m["sps"].SpsCostTable(sample_batch_tokens=[1, 8, 16, 32, cap],
                                    sample_steps_per_sec=[100.0, 96.0, 84.0, 64.0, 40.0],
                                    max_batch_tokens=cap)
        planner._budget_planner = P.HostConfidenceBudgetPlanner(
            sps_table=sps, cfg=planner._schedule_cfg, model_runner=planner.model_runner,
            relay_lag_steps=upstream.overlap_utils.CONFIDENCE_RELAY_RING_LAG)
    return planner


class FoldedVerifyGraphs:
    """The verify forward *and its accept epilogue* as one captured graph per batch-size
    bucket, writing persistent static buffers -- DSpark's folded accept. ``run`` returns
    views of those buffers: the next replay rewrites them."""

    def __init__(self, model, device, D: int, max_bs: int) -> None:
        self.model, self.D = model, D
        self.device = torch.device(device)
        self.mod = torch.get_device_module(self.device)
        self.capture_bs = [bs for bs in CAPTURE_BS if bs <= max_bs]
        top = self.capture_bs[-1]
        z = functools.partial(torch.zeros, dtype=torch.int64, device=self.device)
        # the epilogue's output buffers, allocated once (dspark_verify.py's buffers)
        self.out_tokens, self.commit_lens = z((top, D)), z((top,))
        self.new_seq_lens, self.bonus = z((top,)), z((top,))
        # the block verify's per-block accept lengths: a third epilogue output the result
        # hands out as a view (dspark_verify.py read_block_accept_lens; one block here)
        self.block_accept_lens = z((top,))
        self.verify_ids = {bs: z((bs, D)) for bs in self.capture_bs}
        self.seq_lens = {bs: z((bs,)) for bs in self.capture_bs}
        self.stream = self.mod.Stream()
        self.pool = self.mod.graph_pool_handle()
        self._capture()

    def _capture(self) -> None:
        captured = capture_graphs(self.mod, self.stream, self.pool, self.capture_bs,
                                  self._body)
        self.graphs: Dict[int, Any] = {bs: graph for bs, (graph, _) in captured.items()}

    def _body(self, bs: int) -> None:
        out, commit, new, bonus = greedy_chain_accept(
            self.model, self.verify_ids[bs], self.seq_lens[bs])
        self.out_tokens[:bs].copy_(out)
        self.commit_lens[:bs].copy_(commit)
        self.new_seq_lens[:bs].copy_(new)
        self.bonus[:bs].copy_(bonus)
        self.block_accept_lens[:bs].copy_(commit)

    def can_run(self, bs: int) -> bool:
        return 0 < bs <= self.capture_bs[-1]

    def run(self, verify_ids: torch.Tensor, seq_lens: torch.Tensor):
        bs = verify_ids.shape[0]
        bucket = next(b for b in self.capture_bs if b >= bs)
        self.verify_ids[bucket][:bs].copy_(verify_ids)
        self.seq_lens[bucket][:bs].copy_(seq_lens)
        self.graphs[bucket].replay()
        return (self.out_tokens[:bs], self.commit_lens[:bs], self.new_seq_lens[:bs],
                self.bonus[:bs])

    def block_accept(self, bs: int) -> torch.Tensor:
        return self.block_accept_lens[:bs]


def greedy_chain_accept(model, verify_ids: torch.Tensor, seq_lens: torch.Tensor,
                        logits: Optional[torch.Tensor] = None):
    """Greedy accept of a chain ``[bonus, d1..d_gamma]``: draft ``d_{j+1}`` is accepted
    while the target's prediction after position ``j`` equals it; the committed tokens are
    the target's predictions up to and including the first miss (the new bonus)."""
    bs, D = verify_ids.shape
    if logits is None:
        logits = model.forward(verify_ids.reshape(-1))
    predict = logits.argmax(dim=-1).view(bs, D)
    match = (predict[:, :-1] == verify_ids[:, 1:]).to(torch.int64)
    commit = 1 + torch.cumprod(match, dim=1).sum(dim=1)
    bonus = predict.gather(1, (commit - 1).view(bs, 1)).view(bs)
    return predict, commit, seq_lens + commit, bonus


class ToyDSparkWorker(SharedReadRunner):
    """Stands in for ``DSparkWorkerV2`` + its target worker (module docstring)."""

    def __init__(self, model: ToyTargetModel, device, args, planner) -> None:
        self.model = model
        self.device = torch.device(device)
        self.mod = torch.get_device_module(self.device)
        self.D = args.draft_token_num
        self.planner = planner
        self.carries_confidence = planner.carries_confidence
        # DSpark keeps the target runner as the one whose read-done the WAR barrier waits
        # on (base_spec_worker.py); the toy's runner is itself
        self._init_shared_read()
        V = model.vocab_size
        self.succ = torch.tensor([successor(t, V) for t in range(V)], dtype=torch.int64,
                                 device=self.device)
        self.mod.synchronize()  # the table is part of "the checkpoint"
        use_graphs = args.cuda_graph and graphs_supported(self.device)
        self.folded: Optional[FoldedVerifyGraphs] = None
        self.forward_graphs: Optional[VerifyGraphRunner] = None
        if use_graphs and args.folded_accept:
            self.folded = FoldedVerifyGraphs(model, self.device, self.D,
                                             args.cuda_graph_max_bs)
        elif use_graphs:
            self.forward_graphs = VerifyGraphRunner(model, self.device, self.D,
                                                    args.cuda_graph_max_bs)
        self.draft_common = modules()["draft_common"]
        # host bookkeeping, for the oracle: which (request, step) each confidence publish
        # carried per pool row (publish k fills ring slot k % depth)
        self.confidence_publishes: List[Dict[int, Tuple[Any, int]]] = []
        self.resolved_rows = None  # the last resolve: (request, its row's publisher) per row

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None):
        bs = len(batch.reqs)
        if batch.forward_mode.is_extend():
            result = self._prefill(batch, on_publish)
        elif bs == 0:
            result = self._idle(on_publish)
        else:
            result = self._decode(batch, on_publish)
        return finish_result(result, batch, self.D)

    def _prefill(self, batch, on_publish):
        self._record_shared_read_done(replayed=False)  # an extend runs eagerly
        logits = self.model.forward(batch.input_ids)
        next_token_ids = logits.argmax(dim=-1)
        new_seq_lens = batch.seq_lens
        if on_publish is not None:
            on_publish(new_seq_lens)
        bs = next_token_ids.shape[0]
        return self._result(next_token_ids, torch.ones((bs,), dtype=torch.int64,
                                                       device=self.device),
                            new_seq_lens, next_token_ids)

    def _idle(self, on_publish):
        empty = torch.empty((0,), dtype=torch.int64, device=self.device)
        if on_publish is not None:
            on_publish(empty)
        return self._result(empty, empty, empty, empty)

    def _decode(self, batch, on_publish):
        bs = len(batch.reqs)
        if batch.seq_lens_cpu is not None:
            # the host mirror upstream's resolve_seq_lens_cpu made of what the previous
            # verify published, and its sum: what the launch plans with (the oracle's
            # "seq_lens", judged against the synchronous reference)
            observe("seq_lens", reqs=list(batch.reqs),
                    steps=[r.launched - 1 for r in batch.reqs],
                    lens=batch.seq_lens_cpu.tolist(), total=batch.seq_lens_sum)
        bonus_in = batch.spec_info.bonus_tokens.view(bs)
        verify_ids, confidence = self._draft(bonus_in)
        self._record_shared_read_done(replayed=self._replays(bs))
        fault_point("forward.before_verify")
        block = None
        if self.folded is not None and self.folded.can_run(bs):
            out, commit, new_seq_lens, bonus = self.folded.run(verify_ids, batch.seq_lens)
            block = self.folded.block_accept(bs)
        else:
            logits = None
            if self.forward_graphs is not None and self.forward_graphs.can_run(bs):
                logits = self.forward_graphs.replay(verify_ids.reshape(-1))
            out, commit, new_seq_lens, bonus = greedy_chain_accept(
                self.model, verify_ids, batch.seq_lens, logits)
        if on_publish is not None:
            if self.carries_confidence:
                self.confidence_publishes.append(
                    {r.pool_idx: (r, r.launched - 1) for r in batch.reqs})
                observe("confidence_published", reqs=list(batch.reqs),
                        steps=[r.launched - 1 for r in batch.reqs], confidence=confidence)
                on_publish(new_seq_lens, confidence=confidence)
            else:
                on_publish(new_seq_lens)
        return self._result(out.reshape(-1), commit, new_seq_lens, bonus, block)

    def _draft(self, bonus: torch.Tensor):
        """The draft block from the bonus token, and its confidence, on this stream. The
        draft follows the target's successor except where ``(token + position) % 5 == 0``
        (a miss: the verify rejects it); the confidence head says so."""
        gamma = self.D - 1
        tokens = [bonus.to(torch.int64)]
        conf = []
        V = self.model.vocab_size
        for k in range(gamma):
            prev = tokens[-1]
            miss = (prev + k) % 5 == 0
            tokens.append(torch.where(miss, (prev + 2) % V, self.succ[prev]))
            conf.append(torch.where(miss, 0.25, 0.9 - 0.1 * k) + (prev % 7).float() * 0.01)
        return torch.stack(tokens, dim=1), torch.stack(conf, dim=1).to(torch.float32)

    def _result(self, next_token_ids, accept_lens, new_seq_lens, bonus, block=None):
        draft_input = self.draft_common.make_draft_input_v2(bonus_tokens=bonus,
                                                            new_seq_lens=new_seq_lens)
        result = upstream.GenerationBatchResult(
            next_token_ids=next_token_ids, accept_lens=accept_lens,
            new_seq_lens=new_seq_lens, next_draft_input=draft_input,
            speculative_num_draft_tokens=self.D)
        if block is not None and hasattr(result, "block_accept_lens"):
            result.block_accept_lens = block  # a release with the field copies it too
        return result


def install_probes(sched, worker: ToyDSparkWorker) -> None:
    """The two FutureMap probe shims (module docstring)."""
    fm = sched.future_map
    mod = sched.device_module
    publish = type(fm).publish
    resolve = type(fm).resolve_confidence_cpu
    lag = upstream.overlap_utils.CONFIDENCE_RELAY_RING_LAG

    def publish_shim(future_indices, new_seq_lens, confidence=None):
        if confidence is not None and fm.fwd_prepare_d2h_stream is not None:
            with mod.stream(fm.fwd_prepare_d2h_stream):
                fault_point("d2h.before_ring_copy")
        return publish(fm, future_indices, new_seq_lens, confidence)

    def resolve_shim(batch, *a, **kw):
        slot_publish = fm.confidence_relay.ring_pos - lag
        got = resolve(fm, batch, *a, **kw)
        worker.resolved_rows = None
        if got is not None and 0 <= slot_publish < len(worker.confidence_publishes):
            labels = worker.confidence_publishes[slot_publish]
            rows = batch.req_pool_indices_cpu.tolist()
            observe("confidence_resolved", labels=[labels.get(p) for p in rows],
                    confidence=got.confidence.tolist())
            # for the budget probe: whose confidence each batch row was handed
            worker.resolved_rows = [(req, labels.get(p)) for req, p in zip(batch.reqs, rows)]
        return got

    fm.publish = publish_shim
    fm.resolve_confidence_cpu = resolve_shim
    _install_budget_probe(sched, worker)


def _install_budget_probe(sched, worker) -> None:
    """A shim on the budget planner's survival step (upstream's, called unchanged) that
    reports, for each row of the batch, whose published confidence the planner handed
    it and whether it *used* it (a row of survival probabilities, not the all-ones of a
    row the generation check found stale). The budget itself is not comparable with the
    synchronous reference -- the ring is lagged and polled (``copy_done.query()``), the
    reference reads the fresh buffer -- so the oracle judges the use instead: a request's
    budget must come from its own confidence, never from the previous occupant's of a
    pool slot reused within the ring's lag. Only without a carry (the default lag of 2
    steps equals the ring's): with one, the rows used are older resolves' (not reported)."""
    prepare = getattr(sched, "_confidence_budget_prepare", None)
    bp = getattr(getattr(prepare, "__self__", None), "_budget_planner", None)
    survival = getattr(type(bp), "_two_steps_prior_survival", None) if bp else None
    if survival is None or getattr(bp, "carry_steps", 0):
        return

    def survival_shim(**kw):
        out = survival(bp, **kw)
        rows = worker.resolved_rows
        if rows is not None and len(rows) == out.shape[0]:
            used = (out != 1).any(dim=1).tolist()
            observe("confidence_used", rows=[(req, label, u)
                                             for (req, label), u in zip(rows, used)])
        return out

    bp._two_steps_prior_survival = survival_shim
