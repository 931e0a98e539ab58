"""Upstream's result processor, where the release has 0.5.23's.

``SchedulerBatchResultProcessor`` is what upstream's ``Scheduler.process_batch_result``
hands every result to: after ``copy_done`` it reads the accept state back
(``_resolve_spec_v2_tokens``), advances the grammar (``advance_grammar_fsm``, the one the
EAGLE grammar barrier calls too), appends the tokens to ``req.output_ids``, settles
``req.kv.kv_committed_len``, decides finishes (``Req.update_finish_state``), releases a
finished request's row and slots (``release_kv_cache``), checkpoints a prefill
(``checkpoint_kv_cache``), counts off middle chunks and keeps the hidden states a
request asked for. Built here as ``Scheduler.init_result_processor`` builds it, over the
run's real pools and disabled radix tree, with small fakes only for what leaves the
process: metrics, and output streaming to the detokenizer (``Observability``).

``process`` is ``Scheduler.process_batch_result``'s dispatch by forward mode; the rest of
that method is observability (load publishing, trace flushing, step counters, health
checks), which nothing here reads.

It needs upstream's ``Req`` (``requests``) and upstream's KV lifecycle
(``kv_lifecycle``: the finish releases through ``release_kv_cache``, which reads the
request's ``ReqKvInfo``); a run whose pools are specrace's (the SWA layout, older
releases) keeps the target's own commit (``loop.UpstreamLoop.commit``).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

from seams.faults import observe

from targets.sglang.engine import requests

_MODULE = "sglang.srt.managers.scheduler_components.batch_result_processor"

# the fields the target fills, as 0.5.23's Scheduler.init_result_processor does
FIELDS = frozenset((
    "is_generation", "disaggregation_mode", "enable_overlap", "enable_overlap_mlx",
    "model_config", "token_to_kv_pool_allocator", "tree_cache", "hisparse_coordinator",
    "req_to_token_pool", "decode_offload_manager", "metrics_collector", "metrics_reporter",
    "draft_worker", "model_worker", "logprob_result_processor", "output_streamer",
    "beam_coordinator", "abort_request"))
METHODS = ("process_batch_result_decode", "process_batch_result_prefill",
           "process_batch_result_idle", "advance_grammar_fsm")


@functools.lru_cache(maxsize=None)
def fits() -> bool:
    """Has this release 0.5.23's processor (exactly these fields and methods) and its
    ``Req``?"""
    try:
        import importlib
        cls = importlib.import_module(_MODULE).SchedulerBatchResultProcessor
    except (ImportError, AttributeError):
        return False
    names = {f.name for f in dataclasses.fields(cls)}
    return names == FIELDS and all(hasattr(cls, m) for m in METHODS) and requests.fits()


class Observability:
    """The processor's metrics reporter, metrics collector and output streamer: what
    leaves the process (Prometheus, the detokenizer), nothing under test. The counters
    it updates in place are kept; every other call does nothing."""

    def __init__(self) -> None:
        self.num_generated_tokens = 0
        self.forward_ct_decode = 0

    def __getattr__(self, item: str):
        if item.startswith("__"):
            raise AttributeError(item)
        return lambda *a, **k: None


def _abort_request(*args, **kwargs):
    raise RuntimeError("specrace: upstream's result processor aborted a request (a path "
                       "the sglang target does not model: grammar errors, sampling masks)")


def build(sched, tree_cache, not_modelled):
    """The processor over the scheduler object's pools, worker and beam coordinator."""
    import importlib
    cls = importlib.import_module(_MODULE).SchedulerBatchResultProcessor
    obs = sched.metrics_reporter
    return cls(
        is_generation=True, disaggregation_mode=sched.disaggregation_mode,
        enable_overlap=True, enable_overlap_mlx=False, model_config=sched.model_config,
        token_to_kv_pool_allocator=sched.token_to_kv_pool_allocator, tree_cache=tree_cache,
        hisparse_coordinator=None, req_to_token_pool=sched.req_to_token_pool,
        decode_offload_manager=None, metrics_collector=obs, metrics_reporter=obs,
        # no draft-side per-request bookkeeping (adaptive speculation's finish notes)
        draft_worker=None, model_worker=sched.model_worker,
        logprob_result_processor=not_modelled("logprob_result_processor"),
        output_streamer=obs, beam_coordinator=sched.beam_coordinator,
        abort_request=_abort_request)


def process(processor, batch, result) -> None:
    """``Scheduler.process_batch_result``'s dispatch (module docstring)."""
    mode = batch.forward_mode
    if mode.is_decode():
        processor.process_batch_result_decode(batch, result)
    elif mode.is_extend():
        processor.process_batch_result_prefill(batch, result)
    elif mode.is_idle():
        processor.process_batch_result_idle(batch, result)


def in_use(sched) -> bool:
    import importlib
    if not fits():
        return False
    cls = importlib.import_module(_MODULE).SchedulerBatchResultProcessor
    return isinstance(getattr(sched, "batch_result_processor", None), cls)


def commit_observed(processor, batch, result, rows, loop) -> None:
    """Upstream processes the result; the harness observes what it committed, per row
    of the launch (``worker.launch_rows``): a row whose request upstream appended tokens
    to (none for a row it dropped: a step past its finish, before its retraction, a
    middle chunk), with the accept state that reached the host, and the hidden states
    it kept. The KV bookkeeping follows upstream's: the committed length is
    its ``kv_committed_len``, and a request it finished (and released) gives its
    lifetime's reserve back."""
    before = [(len(req.output_ids), req.finished(), len(req.hidden_states))
              for _, req, _, _, _ in rows]
    process(processor, batch, result)
    for (_, req, step, n, accepted), (n0, was_finished, h0) in zip(rows, before):
        if len(req.output_ids) == n0:
            continue
        # what reached the host (the grammar may keep a prefix of it: the request then
        # finishes), as the draft prep and the reference see it
        observe("result", req=req, step=step, accept_len=n, tokens=accepted)
        if req.return_hidden_states and len(req.hidden_states) > h0:
            observe("hidden_states", req=req, step=step,
                    rows=_row_sums(req.hidden_states[h0:]))
        req.committed_step = step
        if req.finished() and not was_finished:
            loop.kv_cache.released(req)  # release_kv_cache gave the row and slots back
            loop.finished.append(req)
        else:
            req.kv_committed = req.kv.kv_committed_len


def _row_sums(entries) -> list:
    """Each kept hidden-state row's sum (a prefill keeps a list of rows per request)."""
    rows = [r for e in entries for r in (e if e and isinstance(e[0], list) else [e])]
    return [round(sum(r), 5) for r in rows]
