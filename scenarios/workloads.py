"""The scenarios' workload generators: a seed in, a ``Workload`` out (plain data, so a
report can carry it and ``replay`` rebuild the run)."""
from __future__ import annotations

import random
from typing import List, Optional

from harness.oracle.workload import RequestSpec, Workload
from toys.vocab import EOS_ID, VOCAB_SIZE


def _prompt(rng: random.Random) -> List[int]:
    """A repetitive prompt: n-gram drafts get accepted."""
    period = rng.randint(2, 4)
    motif = [rng.randrange(1, VOCAB_SIZE) for _ in range(period)]
    return (motif * 4)[: rng.randint(period + 1, 4 * period)]


def random_workload(seed: int, n_requests: int = 6, draft_token_num: int = 4,
                    max_arrive: int = 6, min_tokens: int = 4, max_tokens: int = 18,
                    schemas: Optional[List[str]] = None, grammar_fraction: float = 0.0) -> Workload:
    """Staggered arrivals and budgets, so requests finish while others' forwards are in
    flight and new ones merge into the running batch -- the seed race's setting."""
    rng = random.Random(seed)
    reqs = []
    for rid in range(n_requests):
        prompt = _prompt(rng)
        schema = None
        if schemas and rng.random() < grammar_fraction:
            schema = rng.choice(schemas)
        reqs.append(RequestSpec(rid, rng.randint(0, max_arrive) if rid > 1 else 0, prompt,
                                rng.randint(min_tokens, max_tokens), schema))
    reqs.sort(key=lambda r: (r.arrive, r.rid))
    return Workload(reqs, draft_token_num)


def _cycle_prompt(rng: random.Random, draft_token_num: int) -> List[int]:
    """A prompt made of one of the toy model's successor cycles, so the n-gram drafts
    are accepted whole and it decodes for as long as its budget lasts (the cycle never
    leads to EOS). The cycle's length does not divide the draft length: splicing an
    accepted run twice then breaks the context's period and changes the next draft."""
    from toys.model import successor  # torch: imported when a workload is made
    while True:
        cycle = [rng.randrange(1, VOCAB_SIZE)]
        while successor(cycle[-1]) not in cycle:  # an orbit ends in a cycle, or at EOS
            cycle.append(successor(cycle[-1]))
        if successor(cycle[-1]) == cycle[0] and EOS_ID not in cycle \
                and draft_token_num % len(cycle):
            return (cycle * 3)[: 2 * len(cycle) + 1]


def _stops_within(token: int, n: int) -> bool:
    """Does the toy model's greedy continuation of ``token`` reach EOS within ``n``
    tokens?"""
    from toys.model import successor  # torch: imported when a workload is made
    for _ in range(n):
        token = successor(token)
        if token == EOS_ID:
            return True
    return False


def slot_reuse_workload(seed: int, n_requests: int = 12, draft_token_num: int = 4,
                        req_pool_size: int = 4, max_tokens: int = 3,
                        long_tokens: int = 40) -> Workload:
    """Many short requests through a small pool (``req_pool_size`` rows: slot 0 is the
    padding row, so ``req_pool_size - 1`` slots), beside one long request.

    All arrive at once, so requests are always waiting for a slot: each slot a finished
    request releases goes to the next request in the very next iteration, while the
    finished one's last forward (the step it ran past its finish under overlap) may still
    be in flight, and the pool's last slot is handed out early. Budgets of 1..3 tokens
    make finishes land on fixed iterations whatever the drafts accept (a prefill gives one
    token, every verify step at least one), so requests finish in the iterations others
    join. The long request (rid 0, the first slot) decodes through all of it, beside
    the short ones (filters keep two requests): every admission is a prefill between two
    of its verify steps, so its previous step is already committed when the next one
    launches."""
    rng = random.Random(seed)
    reqs = [RequestSpec(0, 0, _cycle_prompt(rng, draft_token_num), long_tokens)]
    # Budgets 1, 2, .., max_tokens in turn. The first wave (rids 0..2, into the three
    # slots of the default pool at once) thus holds a request that finishes at its
    # prefill's result and one that finishes at its first verify step's -- in the
    # iteration whose prefill refills the first one's slot, so its own slot is released
    # while a prefill merges and goes to the next request at once. Every run.
    for rid in range(1, n_requests):
        budget = 1 + (rid - 1) % max_tokens
        prompt = _prompt(rng)
        while _stops_within(prompt[-1], budget):  # the budget, not EOS, ends each one
            prompt = _prompt(rng)
        reqs.append(RequestSpec(rid, 0, prompt, budget))
    return Workload(reqs, draft_token_num, req_pool_size)
