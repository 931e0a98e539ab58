"""Workloads: which requests arrive when, with what prompt, budget and grammar.

A workload is plain data (JSON-able), so a report can carry it and ``replay`` can rebuild
the exact run. The generators that make one from a seed are the scenarios'
(``scenarios/workloads.py``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import List, Optional


@dataclass
class RequestSpec:
    rid: int
    arrive: int  # scheduler iteration at which it arrives
    prompt: List[int]
    max_new_tokens: int
    schema: Optional[str] = None  # JSON schema text; None = unconstrained


@dataclass
class Workload:
    requests: List[RequestSpec] = field(default_factory=list)
    draft_token_num: int = 4
    # Rows of the request pool, slot 0 (the padding row) included; None: the server's
    # default, which no workload here fills. A small pool forces slot reuse: a finished
    # request's slot goes to the next request that waits for one.
    req_pool_size: Optional[int] = None
    # KV slots (toys.mem_cache); None: the server's default, which no workload fills. A
    # small pool makes requests wait for slots and take the ones finished requests freed.
    kv_pool_size: Optional[int] = None

    def to_json(self) -> dict:
        return {"draft_token_num": self.draft_token_num, "req_pool_size": self.req_pool_size,
                "kv_pool_size": self.kv_pool_size,
                "requests": [asdict(r) for r in self.requests]}
