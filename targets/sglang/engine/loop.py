"""Upstream's own event loop, driven one iteration at a time.

The sequencing is the installed package's: ``Scheduler.event_loop_overlap`` and, through
it, ``run_batch``, ``is_disable_overlap_for_batch``, ``_apply_war_barrier``,
``launch_batch_sample_if_needed``, ``_relay_forward_payload``, ``_copy_result_to_cpu``,
``_forward_isolation`` and ``record_batch_in_overlap`` -- looked up on the class at each
call, unmodified (a variant or a mutation patches the class, and that is the code that
runs). The scheduler object is built the way sglang's own CPU unit tests build one:
``Scheduler.__new__(Scheduler)`` plus the attributes its loop methods read
(``SCHEDULER_ATTRIBUTES``; ``contract`` checks that set against the installed source).

Ours, and only where the whole server would be needed (``Intake``):

* ``ingest_requests`` -- request intake: arrivals by iteration; it is also where one
  iteration ends, so the harness can step the ``while True`` loop (below);
* ``get_next_batch_to_run`` -- batch formation: the last prefill merged into the running
  batch and finished requests filtered with upstream's ``ScheduleBatch.merge_batch`` /
  ``filter_batch``, new prefill batches from ``ScheduleBatch.init_new``;
* ``process_batch_result`` -- result commit (the oracle's observer);
* ``on_idle``.

Three probe shims sit on the instance, each calling upstream's method unchanged: the fault
plan may stall before ``_relay_forward_payload`` and may ask for more synchronous batches
than upstream would (``is_disable_overlap_for_batch``: the mixed-overlap scenario and the
synchronous reference run, which is upstream's own disable path -- the previous result
processed before the launch -- on every batch).

Stepping: upstream's loop is ``while True``. It runs in a greenlet (one OS thread, so
CUDA's per-thread current stream is the loop's own); ``ingest_requests`` hands control
back to ``step()`` at the top of each iteration. ``close()`` sets ``gracefully_exit``,
upstream's own stop flag, and the loop leaves at its next check.
"""
from __future__ import annotations

import collections
import types
from typing import Any, Deque, List, Optional

import greenlet
import torch

from seams.faults import ask, fault_point, observe
from toys.engine import EngineLoop
from toys.model import ToyTargetModel
from toys.requests import (accept_tokens, extend_last_tokens, form_prefill,
                           middle_chunk, prefill_due, retract_due, retract_for_memory,
                                 stage_extend)

from targets.sglang.engine import kv_lifecycle, result_processor
from targets.sglang.boundary import upstream
from targets.sglang.engine.scheduler_object import build_scheduler
from targets.sglang.engine.worker import launch_rows, penalties_run_eagerly, sampling_info_for


_UNSET = object()


def _plan(running_batch, batch_to_run):
    return types.SimpleNamespace(running_batch=running_batch, batch_to_run=batch_to_run)


def observe_kv_reads(result, rows) -> None:
    """What each launch's attention read (the KV oracle), for every request of the launch
    but one whose KV a synchronous step released before it."""
    if result.specrace_kv_check is None:
        return
    kv_checks = result.specrace_kv_check.tolist()
    for i, req, step, _, _ in rows:
        if not result.specrace_released[i]:
            observe("kv_context", req=req, step=step, n=kv_checks[i][0],
                    checksum=kv_checks[i][1], past_finish=req.done,
                    prefill=result.specrace_prefill,
                    extend_end=(result.specrace_extend_ends[i]
                                if result.specrace_prefill else None))


class Intake:
    """The four server-facing methods upstream's loop calls, ours (module docstring)."""

    def __init__(self, loop: "UpstreamLoop") -> None:
        self.loop = loop

    def ingest_requests(self, stop_at_pause: bool = False) -> List:
        """The top of an iteration (0.5.20+; older loops call ``recv_requests``)."""
        loop = self.loop
        if loop.started:
            loop.parent.switch()  # the iteration ended: back to step()
        loop.started = True
        if loop.stopping:
            loop.sched.gracefully_exit = True
        else:
            loop.iteration += 1
        return []

    recv_requests = ingest_requests  # releases before 0.5.20: request_receiver.recv_requests

    def process_input_requests(self, recv_reqs) -> None:
        pass

    def get_next_batch_to_run(self, running_batch=_UNSET, last_batch=_UNSET):
        """Releases from 0.5.16 pass the batches and take a plan back; older ones take
        no arguments and get the batch (the running batch kept on ``self``)."""
        s = self.loop.sched
        if running_batch is _UNSET:
            plan = self._next(s.running_batch, s.last_batch)
            s.running_batch = plan.running_batch
            return plan.batch_to_run
        return self._next(running_batch, last_batch)

    def _next(self, running_batch, last_batch):
        loop = self.loop
        if loop.stopping:
            return _plan(running_batch, None)
        chunked = loop.chunked_req
        if chunked is not None:  # upstream's stash_chunked_request
            loop.kv_cache.checkpoint(chunked)  # its next chunk resumes where this one ended
        if last_batch is not None and last_batch.forward_mode.is_extend():
            # the request being chunked stays out of the running batch until its last chunk
            loop.filter_finished(last_batch, exclude=chunked)
            if last_batch.reqs:
                if running_batch is None:
                    running_batch = last_batch
                else:
                    fault_point("schedule.before_merge")
                    running_batch.merge_batch(last_batch)
                running_batch.forward_mode = upstream.ForwardMode.DECODE
        if running_batch is not None:
            loop.filter_finished(running_batch)
            if not running_batch.reqs:
                running_batch = None
        running_batch, retracted = loop.retract_due(running_batch)
        prefill = prefill_due(loop.waiting, chunked, loop.kv_cache)
        batch = loop.new_prefill_batch() if prefill else None
        loop.waiting.extendleft(reversed(retracted))  # prefilled again next time, not now
        if prefill:
            return _plan(running_batch, batch)
        if running_batch is not None and loop.args.admission == "optimistic":
            running_batch = loop.retract_for_memory(running_batch)
        if running_batch is not None:
            for r in running_batch.reqs:
                r.launched += 1
            running_batch.extend_num_tokens = 0
            # prepare_for_decode: the step's KV reserve, written into req_to_token here
            loop.kv_cache.prepare_decode(running_batch)
            return _plan(running_batch, running_batch)
        if loop.args.dp_attention:
            return _plan(None, loop.idle_batch())
        return _plan(None, None)

    def process_batch_result(self, batch, result) -> None:
        loop = self.loop
        processor = loop.upstream_processor
        if getattr(result, "specrace_launch", None) is None:  # an idle (DP) batch
            if processor is not None:
                result_processor.process(processor, batch, result)
            return
        stride, rows = launch_rows(result)
        observe_kv_reads(result, rows)
        if processor is not None:  # upstream's processing, observed
            result_processor.commit_observed(processor, batch, result, rows, loop)
            return
        hidden = (result.logits_output.hidden_states
                  if result.logits_output is not None else None)
        for i, req, step, n, accepted in rows:
            if req.done or req.is_retracted:
                continue  # a step past its finish or before its retraction: dropped
            if result.specrace_prefill and middle_chunk(req):
                continue
            observe("result", req=req, step=step, accept_len=n, tokens=accepted)
            # the host copy (pinned, after copy_done), for a request that asked for them
            # (an EAGLE result always carries the verify's hidden states, on the device)
            if hidden is not None and req.return_hidden_states:
                hrows = hidden[i * stride: i * stride + n]
                observe("hidden_states", req=req, step=step,
                        rows=[round(float(x), 5) for x in hrows.sum(dim=1)])
            req.committed_step = step
            loop.kv_cache.on_commit(req, n, result.specrace_prefill)
            # the EAGLE grammar barrier may have advanced the grammar over it already
            loop.commit(req, accepted,
                        advance_grammar=not getattr(result, "grammar_advanced", False))

    def on_idle(self) -> None:
        pass


class UpstreamLoop(EngineLoop):
    """The harness's handle on upstream's loop, a ``toys.engine.Engine`` as every target's
    scheduler is: ``step`` / ``has_work`` / ``run_to_completion`` / ``streams`` ..."""

    def __init__(self, args, device, grammar_backend: Any = None,
                 model: Optional[ToyTargetModel] = None) -> None:
        args.validate()
        self.args = args
        self.device = torch.device(device)
        self.sched, self.pools = build_scheduler(args, device, model)
        self.kv_cache = self.pools.manager
        # upstream's result processor where the release has it (result_processor.in_use);
        # None: the target's own commit (``commit``)
        self.upstream_processor = (self.sched.batch_result_processor
                                   if result_processor.in_use(self.sched) else None)
        self.future_map = self.sched.future_map
        self.vocab_size = self.sched.model_config.vocab_size
        if args.sampling_penalties:
            penalties_run_eagerly()  # before any verify applies them
        self.waiting: Deque[Any] = collections.deque()
        self.chunked_req: Any = None  # mid-prefill: its next chunk comes next (ours: the
        # scheduler object's chunked_req is upstream's, read on paths not modelled)
        self.finished: List[Any] = []
        self.iteration = 0
        self.started = self.stopping = False
        intake = Intake(self)
        s = self.sched
        for name in ("ingest_requests", "process_input_requests", "get_next_batch_to_run",
                     "process_batch_result", "on_idle"):
            setattr(s, name, getattr(intake, name))
        s.request_receiver = intake  # releases before 0.5.20 call its recv_requests()
        s.is_disable_overlap_for_batch = self._disable_overlap
        s._relay_forward_payload = self._relay_forward_payload
        self.parent = greenlet.getcurrent()
        self.runner = greenlet.greenlet(self._run)
        self._loop_stream = None  # the loop's current stream when it last handed back

    # --- the loop ----------------------------------------------------------------------
    def _run(self) -> None:
        s = self.sched
        with s.device_module.stream(s.schedule_stream):
            type(s).event_loop_overlap(s)

    def step(self) -> None:
        """One iteration of upstream's loop (from one ``ingest_requests`` to the next)."""
        if self.runner.dead:
            raise RuntimeError("upstream's event loop has exited")
        self._switch_in()

    def _switch_in(self) -> None:
        """Run the loop until it hands control back. The current stream is per thread, not
        per greenlet: the loop gets back the stream it left with, and the caller keeps its
        own (two loops stepped in turn -- two ranks -- must not run on each other's)."""
        mod = self.sched.device_module
        outer = mod.current_stream()
        if self._loop_stream is not None:
            mod.set_stream(self._loop_stream)
        self.parent = greenlet.getcurrent()
        try:
            self.runner.switch()
        finally:
            self._loop_stream = mod.current_stream()
            mod.set_stream(outer)

    def close(self) -> None:
        """Upstream's own stop: ``gracefully_exit``, seen at the loop's next check. The
        loop is left this way, never by a ``GreenletExit`` thrown in when the greenlet is
        collected, which would unwind its stream context in the middle of a later run."""
        if self.runner.dead or not self.started:
            return
        self.stopping = True
        self._switch_in()

    def has_work(self) -> bool:
        s = self.sched
        queued = any(getattr(r, "specrace_launch", None) for _, r in s.result_queue)
        return bool(self.waiting or s.running_batch or queued or self.chunked_req
                    or (s.last_batch is not None and s.last_batch.reqs))

    @property
    def streams(self) -> dict:
        s = self.sched
        return {"schedule": s.schedule_stream, "forward": s.forward_stream,
                "copy": s.copy_stream, "d2h": s.future_map.fwd_prepare_d2h_stream}

    @property
    def running_batch(self):
        return self.sched.running_batch

    @property
    def result_queue(self):
        return self.sched.result_queue

    def add_request(self, req) -> None:
        req.ask_hidden_states(self.args.return_hidden_states)  # what the client asked
        if self.args.sampling_penalties:
            req.ask_penalties()
        self.waiting.append(req)

    # --- probe shims: upstream's methods, called unchanged -----------------------------
    def _disable_overlap(self, batch, *rest, **kw) -> bool:
        s = self.sched  # (batch) before 0.5.16, (batch, last_batch=) since
        decided = type(s).is_disable_overlap_for_batch(s, batch, *rest, **kw)
        if decided or batch is None or not s.result_queue:
            return decided
        if not self.args.overlap:  # the synchronous reference: every batch
            return True
        if batch.forward_mode.is_decode():
            return bool(ask("schedule.disable_overlap", False, batch=batch))
        return False

    def _relay_forward_payload(self, *args) -> None:
        fault_point("future_map.before_stash")  # (fi, result) before 0.5.19, batch first since
        s = self.sched
        type(s)._relay_forward_payload(s, *args)

    # --- batch formation and commit (ours) ---------------------------------------------
    def retract_due(self, batch):
        """Retract the running requests ``retract_at`` names now (``toys.requests
        .retract``; on 0.5.23 through upstream's ``release_req``) and filter them out with
        upstream's ``filter_batch``: ``(batch or None, retracted)``. They go back to the
        queue's front after this scheduling point (the result of a step of theirs still
        in flight is processed, and dropped, first)."""
        due = retract_due(batch.reqs, self.args.retract_at, self.kv_cache) if batch else []
        if due:
            batch.filter_batch(keep_indices=[i for i, r in enumerate(batch.reqs)
                                             if not r.is_retracted])
        return (batch if batch is not None and batch.reqs else None), due

    def retract_for_memory(self, batch):
        """The decode's reserve does not fit the pool (optimistic admission): retract
        under that pressure -- on 0.5.23 upstream's own ``check_decode_mem`` and
        ``retract_decode`` choose whom and release them (``UpstreamKVCache``), elsewhere
        ``toys.requests.retract_for_memory`` and upstream's ``filter_batch``. They
        wait at the queue's front (upstream appends them to its waiting queue, which its
        schedule policy orders). The batch, or None when no one is left."""
        if isinstance(self.kv_cache, kv_lifecycle.UpstreamKVCache):
            due = self.kv_cache.retract_for_memory(batch)
        else:
            due = retract_for_memory(batch.reqs, self.kv_cache)
            if due:
                batch.filter_batch(keep_indices=[i for i, r in enumerate(batch.reqs)
                                                 if not r.is_retracted])
        self.waiting.extendleft(reversed(due))
        return batch if batch.reqs else None

    def filter_finished(self, batch, exclude: Any = None) -> None:
        keep = [i for i, r in enumerate(batch.reqs) if not r.finished() and r is not exclude]
        if len(keep) < len(batch.reqs):
            fault_point("schedule.before_filter", batch=batch)
            batch.filter_batch(keep_indices=keep)

    def _init_batch(self, reqs: List[Any], forward_mode):
        batch = upstream.ScheduleBatch.init_new(
            reqs, self.sched.req_to_token_pool, self.sched.token_to_kv_pool_allocator, None,
            self.sched.model_config,
            enable_overlap=True, spec_algorithm=self.sched.spec_algorithm)
        batch.forward_mode = forward_mode
        batch.sampling_info = sampling_info_for(batch, self.vocab_size)
        batch.split_index = 0
        batch.extend_num_tokens = 0
        return batch

    def new_prefill_batch(self):
        """``prepare_for_extend``, as far as the relay needs it: lengths, the prefill input
        ids staged in pinned host memory (resolved on the forward stream), the rows and
        their columns (``prepare_extend``)."""
        reqs, self.chunked_req = form_prefill(self.waiting, self.chunked_req,
                                              self.args.max_prefill_reqs,
                                              self.args.chunked_prefill_size, self.kv_cache)
        batch = self._init_batch(reqs, upstream.ForwardMode.EXTEND)
        lens = [r.extend_end for r in reqs]  # a retracted request's tokens too; a chunk's
        batch.seq_lens = torch.tensor(lens, dtype=torch.int64, device=self.device)
        batch.orig_seq_lens = batch.seq_lens
        batch.seq_lens_cpu = torch.tensor(lens, dtype=torch.int64)
        batch.prefill_input_ids_cpu = torch.tensor(
            extend_last_tokens(reqs), dtype=torch.int64, pin_memory=True)
        batch.extend_num_tokens = sum(lens)
        # the toy prefill forwards each request's last prompt token only (its hidden row);
        # its attention writes and reads the whole prompt's KV
        batch.extend_lens = [1] * len(reqs)
        batch.prefix_lens = [n - 1 for n in lens]
        batch.extend_logprob_start_lens = [0] * len(reqs)
        batch.specrace_extend = stage_extend(reqs, self.device)
        # the rows and the chunks' columns (on 0.5.23 upstream's alloc_for_extend), and
        # the batch's req_pool_indices
        self.kv_cache.prepare_extend(batch)
        if self.args.spec_algorithm == "eagle-v2":
            # the slot the extended token writes (prepare_for_extend's out_cache_loc; the
            # toy workers of the other slices write the prompt's KV themselves)
            batch.out_cache_loc = self.sched.req_to_token_pool.req_to_token[
                batch.req_pool_indices, batch.seq_lens - 1].to(torch.int64)
        return batch

    def idle_batch(self):
        batch = self._init_batch([], upstream.ForwardMode.IDLE)
        batch.req_pool_indices = torch.empty((0,), dtype=torch.int64, device=self.device)
        batch.req_pool_indices_cpu = torch.empty((0,), dtype=torch.int64)
        batch.seq_lens = torch.empty((0,), dtype=torch.int64, device=self.device)
        batch.orig_seq_lens = batch.seq_lens
        batch.input_ids = torch.empty((0,), dtype=torch.int64, device=self.device)
        return batch

    def commit(self, req, tokens: List[int], advance_grammar: bool = True) -> None:
        done = accept_tokens(req, tokens, advance_grammar)
        if advance_grammar:
            req.grammar_seen = len(req.output_ids)
        if done:
            req.mark_finished()
            self.kv_cache.release(req)  # release_kv_cache: slots first, then the row
            self.finished.append(req)

