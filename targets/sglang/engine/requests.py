"""The request the sglang target runs: upstream's own ``Req`` where the release's fits.

On a release whose ``Req`` takes 0.5.23's constructor (``fits``), a request *is* one of
upstream's: built by its ``__init__`` with upstream's ``SamplingParams`` (the budget as
``max_new_tokens``, EOS as the stop token, normalised as the tokenizer manager does;
no tokenizer, so no stop strings), so its finish logic (``update_finish_state``,
``finished_len``, ``output_ids_through_stop``), its KV record (``req.kv``), retraction
(``reset_for_retract``) and every field upstream's batch and result code reads are
upstream's. What the class adds is the harness's bookkeeping -- ``RequestState``'s
fields upstream's ``Req`` has no name for (the step counters the oracles key on, the
columns the admission reserved) -- and ``mark_finished``, the finish a result
processor of ours makes where upstream's is not driven (``loop.UpstreamLoop.commit``).

Older releases (another constructor) run ``Req`` below, specrace's request carrying the
attributes their batch code reads.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from array import array
from typing import Any, List, Optional

from toys.requests import RequestState
from toys.vocab import EOS_ID, VOCAB_SIZE

from targets.sglang.boundary import upstream

_CLASS: Any = None
# What a request asks in a sampling-penalties configuration (``UpstreamReq.ask_penalties``)
PENALTIES = {"frequency_penalty": 0.01, "presence_penalty": 0.01, "repetition_penalty": 1.01,
             "min_new_tokens": 1, "logit_bias": {"1": 0.01}}
# RequestState's fields that upstream's Req (0.5.22 on) sets in its constructor, under the
# same names and meaning
_UPSTREAM_FIELDS = ("is_retracted", "prefix_len", "extend_end", "inflight_middle_chunks")


@functools.lru_cache(maxsize=None)
def fits() -> bool:
    """Has this release 0.5.23's ``Req``: its constructor's keywords, the finish state
    the result processor reads and sets, and ``SamplingParams`` with stop token ids?"""
    try:
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams
        inspect.signature(Req.__init__).bind(
            None, 0, "", array("q"), None, eos_token_ids=set(), vocab_size=1)
        inspect.signature(SamplingParams.__init__).bind(None, max_new_tokens=1,
                                                        stop_token_ids=[])
        # the fields the harness takes as upstream's own (``_define``) are set by its
        # constructor (0.5.21's has no prefix_len / extend_end yet)
        if not set(_UPSTREAM_FIELDS) <= set(Req.__init__.__code__.co_names):
            return False
        return all(hasattr(Req, m) for m in ("update_finish_state", "finished",
                                             "output_ids_through_stop", "reset_for_retract",
                                             "owned_kv_len"))
    except (ImportError, TypeError, AttributeError):  # AttributeError: a wrapped __init__
        return False


def request_class():
    """``UpstreamReq``: upstream's ``Req`` with the harness's bookkeeping (made once,
    when first asked for: the class derives from the installed package's)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _define()
    return _CLASS


def _define():
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH, FINISH_MATCHED_TOKEN, Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    # the harness's fields upstream's Req has no attribute for (the rest -- rid,
    # output_ids, grammar and _UPSTREAM_FIELDS -- are upstream's own, under the same
    # names and meaning)
    own = [f for f in dataclasses.fields(RequestState)
           if f.name not in ("rid", "prompt", "max_new_tokens", "grammar", "output_ids",
                             *_UPSTREAM_FIELDS)]

    class UpstreamReq(Req):
        """Upstream's ``Req`` plus ``RequestState``'s bookkeeping (module docstring)."""

        def __init__(self, rid: int, prompt: List[int], max_new_tokens: int,
                     grammar: Any = None) -> None:
            # greedy, as the toy models decode (normalize makes temperature 0 top_k 1)
            params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=[EOS_ID],
                                    temperature=0.0)
            params.normalize(None)
            super().__init__(rid, "", array("q", prompt), params,
                             eos_token_ids={EOS_ID}, vocab_size=VOCAB_SIZE)
            self.grammar = grammar
            self.prompt = list(prompt)
            self.max_new_tokens = max_new_tokens
            for f in own:
                value = f.default_factory() if f.default_factory is not dataclasses.MISSING \
                    else f.default
                setattr(self, f.name, value)
            self.grammar_seen = 0  # the grammar barrier of a result processor of ours

        needs_splice = RequestState.needs_splice
        context = RequestState.context

        @property
        def done(self) -> bool:
            return self.finished()

        def output(self) -> List[int]:
            """What the client gets: up to and including the stop (``finished_len``)."""
            return list(self.output_ids_through_stop)

        def ask_hidden_states(self, wanted: bool) -> None:
            """What the client asked (``return_hidden_states``), as upstream's
            constructor records it: the flag and the capture mode batches are formed by."""
            from sglang.srt.managers.schedule_batch import get_return_hidden_states_mode
            self.return_hidden_states = wanted
            self.return_hidden_states_mode = get_return_hidden_states_mode(wanted)

        def ask_penalties(self) -> None:
            """What the client asked (``PENALTIES``): every penalty upstream's penalizers
            keep state for, and a logit bias (the tokenizer manager leaves these as
            sent). Small against the toy model's logit margin (its successor's logit
            4.0, the rest about -1.0: a frequency and presence penalty of 0.01 a token,
            a repetition factor of 1.01 and a bias of 0.01 move no argmax), so the greedy
            output stays
            the target model's and the output oracle stays exact; ``min_new_tokens=1``
            is met by the prefill's token. There is no tokenizer: the min-new-tokens
            penalizer reads its stop ids from ``req.tokenizer``, here the stop token
            alone."""
            import types
            for name, value in PENALTIES.items():
                setattr(self.sampling_params, name, value)
            self.tokenizer = types.SimpleNamespace(additional_stop_token_ids=None,
                                                   eos_token_id=EOS_ID)

        def mark_finished(self) -> None:
            """A commit of ours finished it on its last token (EOS) or its budget: the
            finish reason upstream's ``update_finish_state`` gives those."""
            n = len(self.output_ids)
            if self.output_ids and self.output_ids[-1] == EOS_ID:
                self.finished_reason = FINISH_MATCHED_TOKEN(matched=EOS_ID)
            else:
                self.finished_reason = FINISH_LENGTH(length=self.max_new_tokens)
            self.finished_len = n

    return UpstreamReq


@dataclasses.dataclass
class Req(RequestState):
    """A request, with the attributes upstream's batch code reads of sglang's ``Req``
    (``finished`` is upstream's method there: the flag is ``done``)."""

    done: bool = False
    # read by ScheduleBatch.init_new / filter_batch / merge_batch
    return_logprob: bool = False
    is_prefill_only: bool = False
    return_hidden_states: bool = False  # releases before 0.5.17 read it (later: the mode)
    session: Any = None  # no streaming session (0.5.23's UnifiedRadixCache asks)

    grammar_seen: int = 0  # tokens its grammar has accepted (the EAGLE grammar barrier)
    decode_batch_idx: int = 0  # counted by upstream's prepare_for_decode
    # read by ForwardBatch.init_new (the EAGLE slice): the prefill is never chunked
    lora_id: Any = None
    token_type_ids: Any = None

    # (prefix_len / extend_end / inflight_middle_chunks are RequestState's, in upstream's
    # names: upstream's checkpoint_kv_cache and reset_for_retract set them)
    # read by upstream's release_kv_cache / release_req / owned_kv_len / reset_for_retract
    # (targets.sglang.engine.kv_lifecycle): no stop string cut the output, no tree lock, no
    # reasoning tokens, text prompts (a retraction keeps the tokens it had)
    kv: Any = None  # upstream's ReqKvInfo, bound at admission
    finished_len: Optional[int] = None
    lock: Any = None
    skip_radix_cache_insert: bool = False
    reasoning_tokens: int = 0
    input_embeds: Any = None
    retraction_count: int = 0

    @property
    def origin_input_ids(self) -> List[int]:
        return self.prompt

    @property
    def full_untruncated_fill_ids(self) -> List[int]:
        return self.context()

    def refresh_fill_ids(self) -> None:
        """Upstream's keeps the fill ids in step with the output; ours are computed
        (``context()``), and the disabled tree's checkpoint reads none."""

    @property
    def extend_range(self):
        """Upstream's ``Req.extend_range`` (0.5.17 on: ``run_batch`` reads its length for a
        batch returning hidden states or logprobs): the last extend, ``prefix_len ->
        extend_end``, kept through the decode steps after it as upstream keeps it; None
        after a retraction, as ``reset_for_retract`` leaves it."""
        if self.extend_end is None or upstream.Range is None:
            return None
        return upstream.Range(self.prefix_len, self.extend_end)

    @property
    def return_hidden_states_mode(self):
        mode = upstream.CaptureHiddenMode
        return mode.FULL if self.return_hidden_states else mode.NULL

    def finished(self) -> bool:
        return self.done

    def ask_hidden_states(self, wanted: bool) -> None:
        self.return_hidden_states = wanted  # the capture mode is computed from it

    def ask_penalties(self) -> None:
        # the sampling state before 0.5.22 is specrace's inert one: nothing would apply
        # them (the target refuses the configuration there: ``variant_problem``)
        raise TypeError("sampling penalties need upstream's Req and SamplingBatchInfo")

    def mark_finished(self) -> None:
        """The commit finished it (EOS or its budget)."""
        self.done = True



def make_request(rid: int, prompt, max_new_tokens: int, grammar: Any = None):
    """The target's request: upstream's where the release's fits, else ``Req``."""
    if fits():
        return request_class()(rid, list(prompt), max_new_tokens, grammar)
    return Req(rid, list(prompt), max_new_tokens, grammar)
