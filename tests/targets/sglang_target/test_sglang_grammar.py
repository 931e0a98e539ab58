"""Upstream's grammar staging on the simulator: sglang's own bitmask over a verify tree
equals the brute-force per-node reference, its matchers are left where they started, and
its GrammarTree staging (from_device + event, from_host) behaves on the sim device."""
from __future__ import annotations

import json
from types import SimpleNamespace
from typing import List

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import targets
from harness.detect import detect
from harness.oracle.grammar import allowed_tokens, bitmask_row, brute_force_rows
from harness.policies import Lazy
from harness.runtime.sim.runtime import sim_runtime
from toys.tree import derive_tree_links
from toys.vocab import EOS_ID, VOCAB_SIZE

V = VOCAB_SIZE
W = (V + 31) // 32
POISON = 0x5A5A5A5A
SCHEMAS = [
    json.dumps({"type": "object", "properties": {"name": {"type": "string"},
                                                 "age": {"type": "integer"}},
                "required": ["name", "age"]}),
    json.dumps({"type": "array", "items": {"type": "boolean"}}),
]


@pytest.fixture(scope="module")
def up():
    targets.get("sglang")
    from targets.sglang.boundary import upstream
    from targets.sglang.engine.grammar import UpstreamGrammarBackend
    return SimpleNamespace(spec_utils=upstream.spec_utils, backend=UpstreamGrammarBackend(),
                           GrammarTree=upstream.GrammarTree)


def _walk(backend, schema: str, prefix: List[int]):
    g = backend.grammar_for_json_schema(schema)
    for tok in prefix:
        g.accept_token(tok)
    return g


@st.composite
def tree_request(draw, backend, num_draft: int):
    schema = draw(st.sampled_from(SCHEMAS))
    walker = _walk(backend, schema, [])
    prefix: List[int] = []
    for _ in range(draw(st.integers(0, 10))):
        allowed = [t for t in allowed_tokens(walker, V) if t != EOS_ID]
        if walker.is_terminated() or not allowed:
            break
        tok = draw(st.sampled_from(allowed))
        walker.accept_token(tok)
        prefix.append(tok)
    parents = [-1]
    for i in range(1, num_draft):
        parents.append(draw(st.integers(parents[-1] if i > 1 else 0, i - 1)))
    tokens = [prefix[-1] if prefix else EOS_ID]
    for i in range(1, num_draft):
        g = _walk(backend, schema, prefix)
        allowed = [] if g.is_terminated() else allowed_tokens(g, V)
        kind = draw(st.integers(0, 5))
        if kind <= 3 and allowed:
            tokens.append(draw(st.sampled_from(allowed)))
        elif kind == 4:
            tokens.append(draw(st.sampled_from([V - 1, V, POISON, EOS_ID])))
        else:
            tokens.append(draw(st.integers(0, V + 4)))
    return schema, prefix, parents, tokens


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_upstream_bitmask_matches_brute_force(up, data):
    num_draft = data.draw(st.integers(1, 6), label="D")
    bs = data.draw(st.integers(1, 2), label="bs")
    specs = [data.draw(tree_request(up.backend, num_draft)) for _ in range(bs)]
    reqs = [SimpleNamespace(grammar=_walk(up.backend, s, p)) for s, p, _, _ in specs]
    before = [bitmask_row(r.grammar, W) if not r.grammar.is_terminated() else None
              for r in reqs]
    links = [derive_tree_links(parents) for _, _, parents, _ in specs]
    with sim_runtime():  # upstream pins the bitmask: the simulator's pinned memory
        mask, _ = up.spec_utils.generate_token_bitmask(
            reqs, torch.tensor([a for a, _ in links]), torch.tensor([b for _, b in links]),
            torch.tensor([t for *_, t in specs], dtype=torch.int64), V)
        rows = mask.tolist()
    assert len(rows) == bs * num_draft
    for b, (schema, prefix, parents, tokens) in enumerate(specs):
        want = brute_force_rows(lambda: _walk(up.backend, schema, prefix), parents, tokens, V)
        assert rows[b * num_draft:(b + 1) * num_draft] == want
        g = reqs[b].grammar  # every accept rolled back
        assert (bitmask_row(g, W) if not g.is_terminated() else None) == before[b]


def test_from_device_waits_on_its_event_and_the_race_without_it(up):
    """A tree produced on a stalled side stream: resolve() blocks until the copies land
    (values right, no race); with the event dropped the host reads poison and the
    detector names upstream's async_d2h against the host read."""
    for keep_event in (True, False):
        with sim_runtime(Lazy()) as rt:
            side = rt.module.Stream()
            rt.label(side, "forward")
            with rt.module.stream(side):
                nt = torch.tensor([[1, -1]], device=rt.device)
                ns = torch.full((1, 2), -1, dtype=torch.int64, device=rt.device)
                dt = torch.tensor([[5, 6]], device=rt.device)
                rt.stall(None)
                nt = nt + 0  # written after the stall: pending until something forces it
                tree = up.GrammarTree.from_device(nt, ns, dt)
            if not keep_event:
                tree._done = None
            host = tree.resolve()
            got = host[0].tolist()
            races = detect(rt.trace)
            rt.synchronize()
        if keep_event:
            assert got == [[1, -1]] and races == []
        else:
            assert got != [[1, -1]]
            assert any(r.first.where().startswith("sglang/srt/utils/common.py")
                       and r.second.actor == "host" for r in races), races
