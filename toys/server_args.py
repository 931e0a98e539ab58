"""The server arguments every engine over the toy world reads, once: the draft shape, the
relay and fence, the pools (``toys.mem_cache``) and the scheduling features (chunked
prefill, retraction, admission: ``toys.requests``), as sglang's ``server_args.py`` names
them. Each target extends this with its own fields and its own checks (``impl``'s
``MirrorArgs``, the sglang target's ``SglangArgs``, the vLLM target's ``VllmArgs``), so no
target carries another's; ``harness.target.Target.args_type`` says which a target takes.

A field lives here when the toy world reads it or more than one target does; ``war_barrier``
and ``platform`` are every run's (``harness.run.Run``), whether or not its target reads them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from seams.vocab import Fence, Platform, Relay

RELAY_MODES = tuple(r.value for r in Relay)
WAR_BARRIERS = tuple(f.value for f in Fence)
KV_LAYOUTS = ("full", "swa")
ADMISSIONS = ("lifetime", "optimistic")


@dataclass
class ServerArgs:
    # the speculative algorithms this kind of args takes (a target's class narrows or
    # widens it): "eagle", a device drafter builds the tree
    SPEC_ALGORITHMS = ("ngram", "eagle")

    draft_token_num: int = 4
    relay: str = Relay.FUTURE_MAP.value  # Relay.SPEC_INFO is the pre-#35198 relay
    war_barrier: str = Fence.FINE.value
    overlap: bool = True
    req_pool_size: int = 64  # rows of the request pool; slot 0 is the padding row
    max_prefill_reqs: int = 4
    dp_attention: bool = False  # an idle rank still runs (empty) batches
    spec_algorithm: str = "ngram"
    # The verify forward as CUDA graph replays, where the device module captures graphs
    # (torch.cuda, the simulator); batches above cuda_graph_max_bs run eagerly.
    cuda_graph: bool = True
    cuda_graph_max_bs: int = 8
    # The hardware the code under test reads itself as running on: a run's (``--platform``,
    # checked against the target's ``platforms``); only the sglang target has a second one
    platform: str = Platform.CUDA.value
    # The memory pools (toys.mem_cache): KV slots (slot 0, the padding slot, not counted)
    # and the columns of a req_to_token row. A small pool makes finished requests' slots
    # go to waiting ones within a run.
    kv_pool_size: int = 4096
    context_len: int = 256
    kv_layout: str = "full"  # "swa": KV slots paired with SWA slots by a device mapping
    # Retraction (upstream's retract_decode under memory pressure), at a point the same in
    # a trial and its reference: ((rid, n), ...) retracts request rid once it holds n
    # output tokens (toys.requests.retract)
    retract_at: Tuple[Tuple[int, int], ...] = ()
    # Admission (toys.mem_cache.KVCacheManager): "lifetime" reserves a request's whole
    # lifetime, so the pool never runs short; "optimistic" admits on its prefill alone,
    # as upstream's PrefillAdder does with a low new-token ratio -- decode steps then run
    # the pool short and the scheduler retracts running requests under that pressure
    # (upstream's check_decode_mem / retract_decode), at points that differ between a
    # trial and its reference (the per-step oracle stands down for such requests)
    admission: str = "lifetime"
    # Chunked prefill (upstream's --chunked-prefill-size): a prefill takes at most this
    # many prompt tokens, a longer context goes in chunks (0: off; toys.requests)
    chunked_prefill_size: int = 0

    def validate(self) -> None:
        _one_of("relay", self.relay, RELAY_MODES)
        _one_of("war_barrier", self.war_barrier, WAR_BARRIERS)
        _one_of("spec_algorithm", self.spec_algorithm, self.SPEC_ALGORITHMS)
        _one_of("kv_layout", self.kv_layout, KV_LAYOUTS)
        _one_of("admission", self.admission, ADMISSIONS)
        if not 1 <= self.draft_token_num <= 16:
            raise ValueError("draft_token_num must be in 1..16")
        if not 2 <= self.req_pool_size <= 4096:
            raise ValueError("req_pool_size must be in 2..4096 (slot 0 is the padding row)")
        if not 1 <= self.cuda_graph_max_bs <= 32:
            raise ValueError("cuda_graph_max_bs must be in 1..32")
        if not 1 <= self.kv_pool_size <= 1 << 20:
            raise ValueError("kv_pool_size must be in 1..1048576")
        if not 8 <= self.context_len <= 4096:
            raise ValueError("context_len must be in 8..4096")
        if not 0 <= self.chunked_prefill_size <= 1 << 16:
            raise ValueError("chunked_prefill_size must be in 0..65536 (0: off)")
        if self.admission == "optimistic" and self.chunked_prefill_size:
            raise ValueError("optimistic admission with chunked prefill is not modelled (a "
                             "later chunk's slots are not admitted)")

    def draft_span(self) -> int:
        """The most draft positions one request's verify writes (the KV reserve a decode
        step needs): the draft length; a target with a wider tree says more."""
        return self.draft_token_num


def _one_of(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(str(c) for c in choices)}")
