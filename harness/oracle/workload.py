"""Workloads: which requests arrive when, with what prompt, budget and grammar.

A workload is plain data (JSON-able), generated from a seed, so a report can carry it
and ``replay`` can rebuild the exact run.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import List, Optional

from impl.vocab import VOCAB_SIZE


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

    def to_json(self) -> dict:
        return {"draft_token_num": self.draft_token_num,
                "requests": [asdict(r) for r in self.requests]}


def random_workload(seed: int, n_requests: int = 6, draft_token_num: int = 4,
                    max_arrive: int = 6, min_tokens: int = 4, max_tokens: int = 18,
                    schemas: Optional[List[str]] = None, grammar_fraction: float = 0.0) -> Workload:
    """Staggered arrivals and budgets, so requests finish while others' forwards are in
    flight and new ones merge into the running batch -- the seed race's setting."""
    rng = random.Random(seed)
    reqs = []
    for rid in range(n_requests):
        # repetitive prompts: n-gram drafts get accepted
        period = rng.randint(2, 4)
        motif = [rng.randrange(1, VOCAB_SIZE) for _ in range(period)]
        prompt = (motif * 4)[: rng.randint(period + 1, 4 * period)]
        schema = None
        if schemas and rng.random() < grammar_fraction:
            schema = rng.choice(schemas)
        reqs.append(RequestSpec(rid, rng.randint(0, max_arrive) if rid > 1 else 0, prompt,
                                rng.randint(min_tokens, max_tokens), schema))
    reqs.sort(key=lambda r: (r.arrive, r.rid))
    return Workload(reqs, draft_token_num)
