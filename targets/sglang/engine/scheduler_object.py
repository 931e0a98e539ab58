"""The ``Scheduler`` object upstream's loop runs on, built without ``__init__``.

Built the way sglang's own CPU unit tests build one: ``Scheduler.__new__(Scheduler)`` plus
the attributes its loop methods read (``contract.SCHEDULER_ATTRIBUTES``; a test holds
``build_scheduler`` to exactly that set): real values -- streams, the request pool, a real
``FutureMap``, the toy worker, upstream's own WAR-barrier decision -- and, for paths the
target does not take, a ``NotModelled`` value that fails loudly if touched.
"""
from __future__ import annotations

import collections
import types
from typing import Any, Optional

import torch

from toys.attention import ToyPagedAttention
from toys.graph_runner import VerifyGraphRunner, graphs_supported
from toys.model import ToyTargetModel

from targets.sglang.engine import result_processor
from targets.sglang.boundary import upstream
from targets.sglang.engine.pools import build_pools
from targets.sglang.engine.result_processor import Observability
from targets.sglang.engine.worker import ToyNgramWorker
from targets.sglang.runner.build import ngram_model_runner

# The scheduler attributes (of ``contract.SCHEDULER_ATTRIBUTES``) read only on paths the
# target does not take: each a ``NotModelled`` value, loud if read
NOT_MODELLED = ("tp_worker", "pp_group", "tree_cache", "invariant_checker",
                "batch_result_processor", "ps")


class NotModelled:
    """The value of a scheduler attribute read only on a path this target does not take
    (pipeline parallelism, disaggregation, ...): touching it is a loud harness error."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, item: str) -> Any:
        raise RuntimeError(f"specrace: upstream read Scheduler.{self._name}.{item}, on a path "
                           f"the sglang target does not model")

    def __bool__(self) -> bool:
        raise RuntimeError(f"specrace: upstream tested Scheduler.{self._name}, on a path the "
                           f"sglang target does not model")


class _ServerArgsView(NotModelled):
    """``Scheduler.server_args`` as releases before 0.5.16 read it inside the loop (later
    ones read the flags off ``self``): a single-rank server with overlap and no extras.
    Any other field is a path the target does not model."""

    VALUES = {"enable_dp_attention": False, "enable_unified_memory": False}

    def __init__(self) -> None:
        super().__init__("server_args")

    def __getattr__(self, item: str) -> Any:
        if item in _ServerArgsView.VALUES:
            return _ServerArgsView.VALUES[item]
        return super().__getattr__(item)


def build_scheduler(args, device, model: Optional[ToyTargetModel] = None):
    """A ``Scheduler`` without ``__init__``: the attributes its loop methods read; and the
    memory pools (``pools.Pools``: our batch formation allocates from them)."""
    Scheduler = upstream.Scheduler
    s = Scheduler.__new__(Scheduler)
    dev = torch.device(device)
    mod = torch.get_device_module(dev)
    model = model or ToyTargetModel(dev)
    _set_streams(s, dev, mod)
    # the memory pools (upstream's where the release has them) and the relay: a real
    # FutureMap over the request pool
    pools = build_pools(args, dev)
    s.req_to_token_pool = pools.req_to_token_pool
    s.token_to_kv_pool_allocator = pools.allocator
    attention = ToyPagedAttention(pools.req_to_token_pool, pools.kv)
    _set_spec_worker(s, args, dev, model, pools, attention)
    _set_read_done_fence(s, args)
    # the model's config as the loop and the result processor read it: not a reasoning
    # model (no think-start / think-end tokens to count)
    s.model_config = types.SimpleNamespace(is_encoder_decoder=False,
                                           vocab_size=model.vocab_size, think_end_ids=None,
                                           self_opened_think_start_ids=None)
    s._war_barrier_enabled = _war_barrier_on(args, dev)
    _set_modes(s)
    _set_loop_state(s)
    _set_observability(s)
    for name in NOT_MODELLED:  # read only on paths the target does not take: loud if so
        setattr(s, name, NotModelled(name))
    s.beam_coordinator = _idle_beam_coordinator(s)
    _set_result_processor(s, args, pools)
    return s, pools


def _set_streams(s, dev, mod) -> None:
    """The device and the three streams, as ``Scheduler.init_overlap`` makes them."""
    s.device = str(dev)
    s.device_module = mod
    s.schedule_stream, s.forward_stream, s.copy_stream = mod.Stream(), mod.Stream(), mod.Stream()
    s.forward_stream_ctx = mod.stream(s.forward_stream)
    s.copy_stream_ctx = mod.stream(s.copy_stream)


def _set_spec_worker(s, args, dev, model, pools, attention) -> None:
    """The speculative algorithm the run names, its ``FutureMap`` (the relay) and its
    worker: DSpark's or EAGLE v2's slice, else NGRAM with the toy worker."""
    s._confidence_budget_prepare = None
    if args.spec_algorithm == "dspark":
        from targets.sglang.slices import dspark
        s.spec_algorithm = upstream.SpeculativeAlgorithm.DSPARK
        planner = dspark.build_planner(args, s.req_to_token_pool)
        # as Scheduler.init_overlap: upstream decides whether the relay carries
        # confidence; needs_cpu_seq_lens is the attention backend's answer (an axis)
        s.future_map = s.spec_algorithm.create_future_map(
            dev, s.req_to_token_pool, needs_cpu_seq_lens=args.needs_cpu_seq_lens,
            needs_confidence_relay=upstream.with_server_args(
                upstream.overlap_utils.decide_needs_confidence_relay))
        s._confidence_budget_prepare = planner.confidence_budget_prepare()
        s.model_worker = dspark.ToyDSparkWorker(model, dev, args, planner)
        dspark.install_probes(s, s.model_worker)
    elif args.spec_algorithm == "eagle-v2":
        from targets.sglang.slices import eagle
        s.spec_algorithm = eagle.algorithm(args)
        # the attention backend's answer (an axis), as Scheduler.init_overlap passes it
        s.future_map = upstream.FutureMap(dev, s.spec_algorithm, s.req_to_token_pool,
                                          needs_cpu_seq_lens=args.needs_cpu_seq_lens)
        s.model_worker = eagle.build_worker(args, dev, model, pools, attention)
    else:
        s.spec_algorithm = upstream.SpeculativeAlgorithm.NGRAM
        s.future_map = upstream.FutureMap(dev, s.spec_algorithm, s.req_to_token_pool)
        graphs = None
        if args.return_hidden_states and args.cuda_graph and graphs_supported(dev):
            graphs = VerifyGraphRunner(model, dev, args.draft_token_num,
                                       args.cuda_graph_max_bs, forward=model.forward_with_hidden)
        s.model_worker = ToyNgramWorker(model, dev, args.draft_token_num, args.overlap,
                                        args.spec_algorithm == "eagle", graphs, attention)
        s.model_worker.model_runner = ngram_model_runner(args, dev, model, pools)


def _set_read_done_fence(s, args) -> None:
    """Whether the worker's forward publishes read-done (``--war-barrier fine``)."""
    # the fine fence engages only where the forward publishes read-done; the coarse one
    # is upstream's own fallback for a forward that does not (and its switch, where the
    # release has it: targets.sglang.boundary.patches)
    publish = getattr(s.model_worker, "set_publish_read_done", None)
    if publish is not None:  # the EAGLE slice: upstream's worker, our runners publish
        publish(args.war_barrier == "fine")
    else:
        s.model_worker.publish_read_done = args.war_barrier == "fine"
        # the graph runner's reach: batches up to its size replay (and publish) when
        # graphs are on; an extend, a larger batch, or graphs off run eagerly
        s.model_worker.graph_max_bs = args.cuda_graph_max_bs if args.cuda_graph else 0


def _war_barrier_on(args, dev) -> bool:
    """Whether the loop runs the WAR barrier."""
    # upstream's own decision (Scheduler.run_event_loop): the barrier is on under CUDA, or
    # where SGLANG_ENABLE_WAR_BARRIER says so -- the simulator stands for a CUDA device,
    # unless the run reads upstream as on ROCm (--platform rocm: is_cuda() is False there)
    return upstream.scheduler.is_cuda() or \
        (dev.type != "cpu" and args.platform == "cuda") or \
        upstream.envs.SGLANG_ENABLE_WAR_BARRIER.get()


def _set_modes(s) -> None:
    # modes, as a single-rank generation server with overlap and no extras runs
    s.enable_overlap = True
    s.is_generation = True
    s.enable_pdmux = False
    s.enable_unified_memory = False
    s.enable_unified_cache_external_linker = False
    s.enable_async_d2h_copy = False
    s.async_d2h_worker = None
    s.attn_dp_enabled = False
    s.require_mlp_sync = False
    s.disaggregation_mode = upstream.DisaggregationMode.NULL


def _set_loop_state(s) -> None:
    """The loop's state as before its first iteration: no batch, no pause, no exit."""
    s.chunked_req = None
    s.gracefully_exit = False
    s._engine_paused = False
    s.running_batch = None
    s.last_batch = None
    s.cur_batch_for_debug = None
    s.result_queue = collections.deque()  # the loop makes its own at entry


def _set_observability(s) -> None:
    # observability and counters
    s.scheduler_stage_metrics = None
    s.scripted_scheduler_hook = None
    s.forward_sleep_time = None
    s.metrics_reporter = Observability()
    s.profiler_manager = Observability()
    s.forward_ct = 0
    s.processed_tokens_counter = 0
    s._sched_idled = False
    s.batch_record_buf = [None, None]
    s.batch_record_ct = 0
    s.enable_dp_attention = False
    s.cur_batch = None
    s.server_args = _ServerArgsView()


def _set_result_processor(s, args, pools) -> None:
    """The batch result processor, where the run has one: upstream's, or EAGLE's grammar
    advance (otherwise it stays ``NotModelled``)."""
    if pools.lifecycle == "upstream" and result_processor.fits():
        # upstream's own result processing (and the EAGLE grammar barrier's advance)
        s.batch_result_processor = result_processor.build(s, pools.manager.tree_cache,
                                                          NotModelled)
    elif args.spec_algorithm == "eagle-v2":  # EAGLE's grammar barrier advances through it
        from targets.sglang.slices.eagle import GrammarAdvance
        s.batch_result_processor = GrammarAdvance()


def _idle_beam_coordinator(s):
    """Upstream's ``BeamCoordinator`` with no live beam group: its per-forward relay hook
    returns at once, as on a server with no beam-search request (releases before it have
    no such hook to call)."""
    try:
        from sglang.srt.beam_search.coordinator import BeamCoordinator
    except ImportError:
        return NotModelled("beam_coordinator")
    return BeamCoordinator(
        model_config=s.model_config, spec_algorithm=s.spec_algorithm, dllm_enabled=False,
        max_req_len=1 << 20, req_to_token_pool=s.req_to_token_pool,
        token_to_kv_pool_allocator=s.token_to_kv_pool_allocator, tree_cache=s.tree_cache,
        future_map=s.future_map)
