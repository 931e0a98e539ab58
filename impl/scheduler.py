"""The overlap scheduler: schedule, forward and copy streams around the NGRAM worker.

One ``step()`` is one iteration of the server's ``event_loop_overlap``, on the host with
the schedule stream current:

1. ``get_next_batch_to_run`` (schedule stream): merge the last prefill batch into the
   running batch, filter requests found finished, or form a new prefill batch;
2. ``run_batch``: the forward stream waits on the schedule stream, resolves the relayed
   inputs, runs the worker, stashes the relay payload (``_relay_forward_payload``), and the
   copy stream copies the result to pinned host memory and records ``copy_done``;
3. the WAR barrier: the schedule stream waits on the shared-read-done event (fine) or on
   the whole forward stream (coarse);
4. ``pop_and_process`` the *previous* batch's result: ``copy_done.synchronize()``, then the
   host commits tokens, advances grammars and finds finished requests.

With ``overlap=False`` each result is processed right after its launch and nothing is
spliced: the synchronous reference the oracle compares against. A decode batch with a
grammar is also processed synchronously (NGRAM has no device draft phase to hide the
grammar work under: ``grammar_needs_sync``).
"""
from __future__ import annotations

import collections
from typing import Any, Deque, List, Optional, Tuple

import torch

from seams.faults import ask, fault_point, observe
from seams.vocab import Fence, Relay

from toys.attention import ToyPagedAttention
from toys.engine import EngineLoop
from toys.graph_runner import VerifyGraphRunner, graphs_supported
from toys.mem_cache import build_kv_cache
from toys.memory import mark_used_on
from toys.model import ToyTargetModel
from toys.ngram import NgramProposer
from toys.requests import (accept_tokens, extend_last_tokens, form_prefill, middle_chunk,
                           prefill_due, retract_due, retract_for_memory, stage_extend)
from toys.server_args import ServerArgs

from impl.overlap import FutureMap, RelayPayload
from impl.schedule_batch import Req, ScheduleBatch
from impl.spec_info import NgramVerifyInput
from impl.worker import GenerationBatchResult, NgramWorker

class Scheduler(EngineLoop):
    def __init__(self, args: ServerArgs, device, grammar_backend: Any = None,
                 model: Optional[ToyTargetModel] = None) -> None:
        args.validate()
        if args.spec_algorithm in ("dspark", "eagle-v2"):
            raise ValueError(f"impl/ has no {args.spec_algorithm} worker: run it with "
                             f"--target sglang")
        self.args = args
        self.device = torch.device(device)
        self.mod = torch.get_device_module(self.device)
        self.schedule_stream = self.mod.Stream()
        self.forward_stream = self.mod.Stream()
        self.copy_stream = self.mod.Stream()
        self.model = model or ToyTargetModel(self.device)
        self.vocab_size = self.model.vocab_size
        self.graph_runner: Optional[VerifyGraphRunner] = None
        if args.cuda_graph and graphs_supported(self.device):
            self.graph_runner = VerifyGraphRunner(self.model, self.device, args.draft_token_num,
                                                  args.cuda_graph_max_bs)
        self.kv_cache, kv_pool = build_kv_cache(args, self.device)
        self.worker = NgramWorker(self.model, NgramProposer(args.draft_token_num), self.device,
                                  args.draft_token_num, args.relay, args.overlap,
                                  grammar_backend, args.spec_algorithm, self.graph_runner,
                                  ToyPagedAttention(self.kv_cache.req_to_token_pool, kv_pool))
        self.future_map = FutureMap(args.req_pool_size, self.device)
        self.waiting: Deque[Req] = collections.deque()
        self.running_batch: Optional[ScheduleBatch] = None
        self.last_batch: Optional[ScheduleBatch] = None
        self.chunked_req: Optional[Req] = None  # mid-prefill: its next chunk comes next
        # (batch, its requests at launch, their step numbers, the result)
        self.result_queue: Deque[Tuple[ScheduleBatch, List[Req], List[int],
                                       GenerationBatchResult]] = collections.deque()
        self.read_done: Any = None
        self.finished: List[Req] = []
        self.iteration = 0

    @property
    def streams(self) -> dict:
        streams = {"schedule": self.schedule_stream, "forward": self.forward_stream,
                   "copy": self.copy_stream}
        if self.graph_runner is not None:
            streams["graph"] = self.graph_runner.stream
        return streams

    # --- requests -----------------------------------------------------------------------
    def add_request(self, req: Req) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running_batch or self.result_queue or self.chunked_req
                    or (self.last_batch is not None and self.last_batch.reqs))

    # --- the event loop -----------------------------------------------------------------
    def step(self) -> None:
        self.iteration += 1
        with self.mod.stream(self.schedule_stream):
            batch = self.get_next_batch_to_run()
            sync_step = batch is not None and self._needs_sync(batch)
            if sync_step:
                while self.result_queue:
                    self.pop_and_process()
                batch.sync_processed = True
                batch = self._retract_after_sync(batch)
            if batch is not None:
                result = self.run_batch(batch)
                self._apply_war_barrier()
                if batch.reqs:  # an idle (DP) batch has no result to process
                    self.result_queue.append((batch, list(batch.reqs),
                                              [r.launched - 1 for r in batch.reqs], result))
            if not self.args.overlap or sync_step:
                while self.result_queue:
                    self.pop_and_process()
            elif len(self.result_queue) > 1 or (self.result_queue and not (batch and batch.reqs)):
                # the previous batch's result; with nothing (or an idle batch) launched this
                # iteration, the last result is the one to process
                self.pop_and_process()
            self.last_batch = batch

    def close(self) -> None:
        """Nothing to stop: ``step`` is the loop's body (the sglang target's loop is
        upstream's own ``while True``, which ``close`` ends)."""

    def drain(self) -> None:
        """The results still queued when the last step ran (``EngineLoop``)."""
        with self.mod.stream(self.schedule_stream):
            while self.result_queue:
                self.pop_and_process()

    def _needs_sync(self, batch: ScheduleBatch) -> bool:
        """Process the previous result before launching (``is_disable_overlap_for_batch``):
        NGRAM grammar batches (``grammar_needs_sync``) and the device-drafted path, which
        keeps the host tree in sync. A fault plan may also reorder these host steps."""
        if batch.forward_mode != "decode":
            return False
        default = batch.has_grammar or self.args.spec_algorithm == "eagle"
        return bool(ask("schedule.disable_overlap", default, batch=batch))

    def get_next_batch_to_run(self) -> Optional[ScheduleBatch]:
        """Schedule stream: merge the last prefill, filter finished, pick the next batch."""
        last = self.last_batch
        chunked = self.chunked_req
        if chunked is not None:
            self.kv_cache.checkpoint(chunked)  # its next chunk resumes where this one ended
        if last is not None and last.forward_mode == "extend":
            # the request being chunked stays out of the running batch until its last chunk
            self._filter_finished(last, exclude=chunked)
            if last.reqs:
                if self.running_batch is None:
                    self.running_batch = last
                else:
                    fault_point("schedule.before_merge")
                    self.running_batch.merge_batch(last)
                self.running_batch.forward_mode = "decode"
        if self.running_batch is not None:
            self._filter_finished(self.running_batch)
            if not self.running_batch.reqs:
                self.running_batch = None
        retracted = self._retract_due()
        prefill = prefill_due(self.waiting, chunked, self.kv_cache)
        batch = self._new_prefill_batch() if prefill else None
        self.waiting.extendleft(reversed(retracted))  # prefilled again next time, not now
        if prefill:
            return batch
        if self.running_batch is not None and self.args.admission == "optimistic":
            self._retract_for_memory()
        if self.running_batch is not None:
            self.running_batch.sync_processed = False
            for r in self.running_batch.reqs:
                r.launched += 1
            # prepare_for_decode: the step's KV reserve, written into req_to_token here
            self.kv_cache.prepare_decode(self.running_batch)
            return self.running_batch
        if self.args.dp_attention:
            return self._idle_batch()
        return None

    def _retract_due(self) -> List[Req]:
        """Retract the running requests ``retract_at`` names now. They wait at the queue's
        front, but not for this scheduling point: the result of a step of theirs still in
        flight is processed (and dropped) first."""
        batch = self.running_batch
        # (after a synchronous step's processing, the batch holds requests it finished)
        live = [r for r in batch.reqs if not r.finished] if batch else []
        due = retract_due(live, self.args.retract_at, self.kv_cache)
        if due:
            batch.filter_batch([i for i, r in enumerate(batch.reqs) if not r.is_retracted],
                               self.device)
            if not batch.reqs:
                self.running_batch = None
        return due

    def _retract_for_memory(self) -> None:
        """The decode's reserve does not fit the pool (optimistic admission): retract
        under that pressure, as upstream's ``update_running_batch`` does
        (``retract_for_memory``); they wait at the queue's front."""
        batch = self.running_batch
        due = retract_for_memory(batch.reqs, self.kv_cache)
        if due:
            batch.filter_batch([i for i, r in enumerate(batch.reqs) if not r.is_retracted],
                               self.device)
            self.waiting.extendleft(reversed(due))

    def _retract_after_sync(self, batch: ScheduleBatch) -> Optional[ScheduleBatch]:
        """A retraction the results just processed made due, before the launch: the
        synchronous reference processes each result right after its launch, so it sees
        them at this scheduling point (without this, the request would retract one step
        later, with nothing in flight to give the step back). None: no one is left."""
        due = self._retract_due()  # a synchronous step is a decode: the running batch
        self.waiting.extendleft(reversed(due))
        return batch if batch.reqs else None

    def _filter_finished(self, batch: ScheduleBatch, exclude: Optional[Req] = None) -> None:
        keep = [i for i, r in enumerate(batch.reqs) if not r.finished and r is not exclude]
        if len(keep) < len(batch.reqs):
            fault_point("schedule.before_filter", batch=batch)
            batch.filter_batch(keep, self.device)

    def _new_prefill_batch(self) -> Optional[ScheduleBatch]:
        reqs, self.chunked_req = form_prefill(self.waiting, self.chunked_req,
                                              self.args.max_prefill_reqs,
                                              self.args.chunked_prefill_size, self.kv_cache)
        if not reqs:
            return None  # the KV pool cannot take the next request yet
        batch = ScheduleBatch(reqs, None, "extend", self.vocab_size)
        # prepare_for_extend: the forward's inputs are built here, on the schedule stream
        batch.input_ids = torch.tensor(extend_last_tokens(reqs), dtype=torch.int64,
                                       device=self.device)
        batch.extend = stage_extend(reqs, self.device)
        self.kv_cache.prepare_extend(batch)  # the rows' indices, the chunks' columns
        return batch

    def _idle_batch(self) -> ScheduleBatch:
        return ScheduleBatch([], torch.empty((0,), dtype=torch.int64, device=self.device),
                             "idle", self.vocab_size)

    # --- forward ------------------------------------------------------------------------
    def run_batch(self, batch: ScheduleBatch) -> GenerationBatchResult:
        fi = batch.req_pool_indices
        fwd = self.forward_stream
        with self.mod.stream(fwd):
            fwd.wait_stream(self.schedule_stream)
            self._record_forward_inputs(batch, fwd)
            if batch.forward_mode == "decode" and self.args.relay == Relay.FUTURE_MAP:
                self.future_map.resolve_spec_extras(batch.spec_info)
            if batch.forward_mode == "extend":
                result = self.worker.forward_extend(batch)
            else:
                result = self.worker.forward_decode(batch)
            self._relay_forward_payload(fi, result)
            # A request whose finish a synchronous step processed before this launch is
            # in it with its KV already released (as upstream's loop launches it): what
            # its attention reads is no longer its own, and the KV oracle does not judge it
            result.released_at_launch = [r.finished for r in batch.reqs]
            result.prefill = batch.forward_mode == "extend"
            if result.prefill:  # where each chunk ends: the KV oracle's context
                result.extend_ends = [r.extend_end for r in batch.reqs]
            result.copy_done = self.mod.Event()
            self.copy_stream.wait_stream(fwd)
            with self.mod.stream(self.copy_stream):
                result.copy_to_cpu()
                result.copy_done.record()
        # consumed: the batch lets go of them at once, as upstream
        batch.input_ids = batch.extend = None
        batch.spec_info = result.next_draft_input
        batch.spec_info.future_indices = fi
        self.read_done = result.read_done
        return result

    @staticmethod
    def _record_forward_inputs(batch: ScheduleBatch, fwd) -> None:
        """The forward reads these after the fine WAR fence (the extend's embedding, the
        stash), and the schedule stream drops them (``input_ids`` right after this launch,
        ``req_pool_indices`` at the next filter or merge) while this forward may still be
        queued: tell the allocator they are in use here (upstream:
        ``record_stream_for_v2_verify``)."""
        extend = batch.extend.tensors() if batch.extend is not None else ()
        for t in (batch.req_pool_indices, batch.input_ids) + extend:
            mark_used_on(t, fwd)

    def _relay_forward_payload(self, future_indices: torch.Tensor,
                               result: GenerationBatchResult) -> None:
        """Forward stream, right after the worker returns: stash for the next resolve."""
        if self.args.relay != Relay.FUTURE_MAP:
            return  # pre-#35198: ngram state rides on batch.spec_info instead
        if result.next_draft_input is not None:
            self.future_map.stash(future_indices, RelayPayload.from_ngram(result.next_draft_input))

    def _apply_war_barrier(self) -> None:
        """Order the schedule stream's next writes after the forward's shared reads."""
        event, self.read_done = self.read_done, None  # consumed once
        if self.args.war_barrier == Fence.FINE and event is not None:
            self.schedule_stream.wait_event(event)
        else:
            self.schedule_stream.wait_stream(self.forward_stream)

    # --- results ------------------------------------------------------------------------
    def pop_and_process(self) -> None:
        batch, reqs, steps, result = self.result_queue.popleft()
        result.copy_done.synchronize()
        tokens = result.next_token_ids.tolist()
        lens = result.accept_lens.tolist()
        kv_checks = result.kv_check.tolist()
        D = result.stride
        for i, req in enumerate(reqs):
            if not result.released_at_launch[i]:  # (see run_batch)
                observe("kv_context", req=req, step=steps[i], n=kv_checks[i][0],
                        checksum=kv_checks[i][1], past_finish=req.finished,
                        prefill=result.prefill,
                        extend_end=result.extend_ends[i] if result.prefill else None)
            if req.finished or req.is_retracted:
                continue  # a step past its finish or before its retraction: dropped
            if result.prefill and middle_chunk(req):
                continue
            accepted = tokens[i * D: i * D + lens[i]]
            observe("result", req=req, step=steps[i], accept_len=lens[i],
                        tokens=accepted)
            req.committed_step = steps[i]
            self.kv_cache.on_commit(req, lens[i], result.prefill)
            self._commit(req, accepted)

    def _commit(self, req: Req, tokens: List[int]) -> None:
        if accept_tokens(req, tokens):
            self._finish(req)

    def _finish(self, req: Req) -> None:
        req.finished = True
        self.kv_cache.release(req)  # release_kv_cache: slots first, then the row
        self.finished.append(req)
