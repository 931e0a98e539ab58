"""impl/grammar.py: the tree traversal against a brute-force reference, the staging
helpers, and the D2H staging race on the simulated device."""
from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Dict, List, Optional

import pytest
import torch
import xgrammar
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.detect import detect
from seams.faults import installed
from harness.oracle.grammar import allowed_tokens as oracle_allowed_tokens
from harness.oracle.grammar import bitmask_row, brute_force_rows
from harness.policies import Eager, Lazy, Stall
from harness.runtime.sim.runtime import sim_runtime
from harness.runtime.trace import COPY_D2H, COPY_H2D, HOST_READ, EventRecord, SyncRecord
from toys.drafter import derive_tree_links, draft_tree
from impl.grammar import (Grammar, GrammarBackend, GrammarMask, GrammarTree,
                          build_grammar_vocab_mask, generate_token_bitmask, traverse_tree)
from toys.bitmask import apply_vocab_mask, bitmask_width
from toys.vocab import EOS_ID, TOKEN_ID, VOCAB, VOCAB_SIZE

V = VOCAB_SIZE
W = bitmask_width(V)
POISON = 0x5A5A5A5A  # the simulator's int64 poison: what an unfinished copy reads as

SPECS: Dict[str, tuple] = {
    "person": ("json", json.dumps({
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"]})),
    "bools": ("json", json.dumps({"type": "array", "items": {"type": "boolean"}})),
    "ab_or_digits": ("ebnf", 'root ::= "ab" | "a" [0-9]+'),
}

BACKEND = GrammarBackend(VOCAB, EOS_ID)


def make_grammar(key: str, prefix: List[int] = ()) -> Grammar:
    kind, spec = SPECS[key]
    g = (BACKEND.grammar_for_json_schema(spec) if kind == "json"
         else BACKEND.grammar_for_ebnf(spec))
    for tok in prefix:
        g.accept_token(tok)
    return g


def fill_row(g: Grammar) -> List[int]:
    return bitmask_row(g, W)


def state_of(g: Grammar):
    """What a matcher's state decides: terminated, else the allowed-token row."""
    return "terminated" if g.is_terminated() else fill_row(g)


def allowed_tokens(g: Grammar) -> List[int]:
    return oracle_allowed_tokens(g, V)


class Req(SimpleNamespace):
    grammar: Optional[Grammar] = None


# ---------------------------------------------------------------------------------------
# (a) traversal vs brute force

def reference_rows(key: str, prefix: List[int], parents: List[int],
                   tokens: List[int]) -> List[List[int]]:
    return brute_force_rows(lambda: make_grammar(key, prefix), parents, tokens, V)


@st.composite
def bfs_parents(draw, num_draft: int) -> List[int]:
    parents = [-1]
    for i in range(1, num_draft):
        lo = parents[-1] if i > 1 else 0  # BFS order: parents are non-decreasing
        parents.append(draw(st.integers(lo, i - 1)))
    return parents


@st.composite
def grammar_request(draw, num_draft: int):
    """(key, committed prefix, parents, tokens) with tokens biased toward valid ones."""
    key = draw(st.sampled_from(sorted(SPECS)))
    walker = make_grammar(key)
    prefix: List[int] = []
    for _ in range(draw(st.integers(0, 12))):
        if walker.is_terminated():
            break
        allowed = allowed_tokens(walker)
        # Mostly keep the request alive: a committed EOS leaves nothing to traverse.
        if EOS_ID in allowed and draw(st.integers(0, 9)) > 0:
            allowed = [t for t in allowed if t != EOS_ID]
            if not allowed:
                break
        tok = draw(st.sampled_from(allowed))
        walker.accept_token(tok)
        prefix.append(tok)
    parents = draw(bfs_parents(num_draft))
    tokens = [prefix[-1] if prefix else EOS_ID]
    valid_path: List[Optional[List[int]]] = [[]]  # tokens root->node if all valid
    for i in range(1, num_draft):
        ppath = valid_path[parents[i]]
        allowed: List[int] = []
        if ppath is not None:
            g = make_grammar(key, prefix + ppath)
            if not g.is_terminated():
                allowed = allowed_tokens(g)
        kind = draw(st.integers(0, 7))
        if kind <= 4 and allowed:
            tok = draw(st.sampled_from(allowed))
        elif kind == 5:
            tok = draw(st.sampled_from([V - 1, V, V + 31, POISON, EOS_ID]))
        else:
            tok = draw(st.integers(0, V + 4))
        tokens.append(tok)
        valid_path.append(ppath + [tok] if ppath is not None and tok in allowed else None)
    return key, prefix, parents, tokens


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_bitmask_matches_brute_force(data):
    num_draft = data.draw(st.integers(1, 8), label="D")
    bs = data.draw(st.integers(1, 3), label="bs")
    reqs, specs = [], []
    nt, ns, dt = [], [], []
    for _ in range(bs):
        key, prefix, parents, tokens = data.draw(grammar_request(num_draft))
        has_grammar = data.draw(st.booleans()) or bs == 1
        specs.append((key, prefix, parents, tokens) if has_grammar else None)
        reqs.append(Req(grammar=make_grammar(key, prefix) if has_grammar else None))
        a, b = derive_tree_links(parents)
        nt.append(a)
        ns.append(b)
        dt.extend(tokens)

    before = [None if r.grammar is None else state_of(r.grammar) for r in reqs]
    mask = generate_token_bitmask(reqs, torch.tensor(nt), torch.tensor(ns), torch.tensor(dt),
                                  V, "cpu")
    if all(spec is None for spec in specs):
        assert mask is None  # no grammar in the batch: no mask at all
        return
    assert mask is not None and mask.shape == (bs * num_draft, W)
    assert mask.dtype == torch.int32
    for b, spec in enumerate(specs):
        got = mask[b * num_draft:(b + 1) * num_draft].tolist()
        if spec is None:
            assert got == [[-1] * W] * num_draft
            continue
        assert got == reference_rows(*spec)
        # every accept was rolled back: the matcher is where it started
        g = reqs[b].grammar
        assert state_of(g) == before[b]


def test_no_grammar_no_mask():
    reqs = [Req(grammar=None), Req(grammar=None)]
    nt = torch.tensor([[1, -1], [1, -1]])
    ns = torch.full((2, 2), -1)
    assert generate_token_bitmask(reqs, nt, ns, torch.zeros(4, dtype=torch.int64), V,
                                  "cpu") is None


def test_traverse_known_tree():
    # Grammar "ab" | "a" [0-9]+, with "a" committed. Root children: "b" (spells "ab"),
    # "1" and "ab" (rejected: "aab"); "1" -> "2"; "ab" -> EOS (below a rejected node);
    # "b" -> EOS (terminates: no row, and "z" below it is never visited).
    a, b, one, two, ab = (TOKEN_ID[c] for c in ("a", "b", "1", "2", "ab"))
    parents = [-1, 0, 0, 0, 1, 2, 3, 4]
    tokens = [a, b, one, ab, EOS_ID, two, EOS_ID, TOKEN_ID["z"]]
    g = make_grammar("ab_or_digits")
    assert allowed_tokens(g) == sorted([a, ab])
    g.accept_token(a)
    nt, ns = derive_tree_links(parents)
    mask = torch.full((len(parents), W), -1, dtype=torch.int32)
    traverse_tree(nt, ns, tokens, g, mask, V)
    rows = mask.tolist()

    def allowed(row):
        return sorted(t for t in range(V) if (row[t // 32] >> (t % 32)) & 1)

    digits = sorted(TOKEN_ID[c] for c in "0123456789") + [TOKEN_ID["42"], TOKEN_ID["10"]]
    untouched = [-1] * W
    assert allowed(rows[0]) == sorted(digits + [b])  # after "a"
    assert allowed(rows[1]) == [EOS_ID]  # after "ab"
    assert allowed(rows[2]) == sorted([EOS_ID] + digits)  # after "a1"
    assert rows[3] == untouched  # "ab" after "a" is rejected
    assert rows[4] == untouched  # EOS accepted: terminated, nothing to fill
    assert allowed(rows[5]) == sorted([EOS_ID] + digits)  # after "a12"
    assert rows[6] == untouched  # below a rejected node
    assert rows[7] == untouched  # below a terminated grammar
    assert allowed_tokens(g) == sorted(digits + [b])  # rolled back to just after "a"


def test_terminated_grammar_leaves_rows_untouched():
    g = make_grammar("ab_or_digits", [TOKEN_ID["ab"]])
    nt, ns = derive_tree_links([-1, 0, 1])
    mask = torch.full((3, W), -1, dtype=torch.int32)
    traverse_tree(nt, ns, [TOKEN_ID["ab"], EOS_ID, TOKEN_ID["a"]], g, mask, V)
    rows = mask.tolist()
    assert rows[0] == [1 << EOS_ID, 0, 0]  # only EOS after "ab"
    assert rows[1] == [-1] * W and rows[2] == [-1] * W  # EOS terminates: no fill, no descent
    assert not g.is_terminated()


def test_grammar_accept_semantics():
    g = make_grammar("ab_or_digits")
    with pytest.raises(ValueError):
        g.accept_token(TOKEN_ID["b"])
    g.accept_token(TOKEN_ID["ab"])
    g.accept_token(EOS_ID)
    assert g.is_terminated()
    g.accept_token(TOKEN_ID["z"])  # terminated: a no-op, not an error
    g.rollback(1)
    assert not g.is_terminated()


def test_backend_caches_compiled_grammars():
    kind, spec = SPECS["bools"]
    g1, g2 = BACKEND.grammar_for_json_schema(spec), BACKEND.grammar_for_json_schema(spec)
    assert g1 is not g2 and g1._matcher is not g2._matcher  # one matcher per request
    assert len([k for k in BACKEND._cache if k == ("json", spec)]) == 1
    g1.accept_token(TOKEN_ID["["])
    assert allowed_tokens(g2) == [TOKEN_ID["["]]  # independent state


# ---------------------------------------------------------------------------------------
# (b) staging helpers on the host; apply_vocab_mask against xgrammar

def test_from_host_resolve_is_identity():
    t = (torch.tensor([[1, -1]]), torch.tensor([[-1, -1]]), torch.tensor([5, 6]))
    tree = GrammarTree.from_host(*t)
    assert tree._done is None
    assert all(a is b for a, b in zip(tree.resolve(), t))
    # from_device with only host tensors: nothing to copy, no event
    tree = GrammarTree.from_device(*t)
    assert tree._done is None
    assert all(a is b for a, b in zip(tree.resolve(), t))


def test_allocate_vocab_mask_on_cpu_is_unpinned_all_ones():
    m = Grammar.allocate_vocab_mask(V, 5, "cpu")
    assert m.shape == (5, W) and m.dtype == torch.int32 and m.device.type == "cpu"
    assert not m.is_pinned()
    assert bool((m == -1).all())


@pytest.mark.parametrize("vocab", [V, 64, 33])
def test_apply_vocab_mask_matches_xgrammar(vocab):
    gen = torch.Generator().manual_seed(vocab)
    rows, width = 6, bitmask_width(vocab)
    mask = torch.randint(-2**31, 2**31, (rows, width), generator=gen,
                         dtype=torch.int64).to(torch.int32)
    mask[0] = -1
    mask[1] = 0
    mask[2] = torch.iinfo(torch.int32).min  # only bit 31 set in every word
    logits = torch.randn(rows, vocab, generator=gen)
    expect = logits.clone()
    xgrammar.apply_token_bitmask_inplace(expect, mask)
    got = logits.clone()
    apply_vocab_mask(got, mask)
    assert torch.equal(got, expect)
    assert torch.isinf(got[1]).all() and not torch.isinf(got[0]).any()


def test_apply_vocab_mask_on_sim_matches_cpu():
    gen = torch.Generator().manual_seed(0)
    mask = torch.randint(-2**31, 2**31, (4, W), generator=gen, dtype=torch.int64).to(
        torch.int32)
    logits = torch.randn(4, V, generator=gen)
    expect = logits.clone()
    apply_vocab_mask(expect, mask)
    with sim_runtime(Lazy()) as rt:
        dl = logits.to(rt.device)
        GrammarMask(mask.to(rt.device)).apply(dl)
        got = dl.cpu()
        assert detect(rt.trace) == []
    assert torch.equal(got, expect)


# ---------------------------------------------------------------------------------------
# (c) build_grammar_vocab_mask: order and the stale extend-stage mask

class LoggingGrammar:
    """A Grammar proxy that logs fills, to observe what ran before the traversal."""

    def __init__(self, inner: Grammar, log: List[str]) -> None:
        self.inner, self.log = inner, log

    def fill_vocab_mask(self, mask, row):
        self.log.append("fill")
        self.inner.fill_vocab_mask(mask, row)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_build_mask_runs_barrier_first_and_clears_stale_mask():
    log: List[str] = []
    inner = make_grammar("ab_or_digits")
    req = Req(grammar=LoggingGrammar(inner, log))

    def barrier():
        # the scheduler commits last step's token "a" before the traversal reads the state
        log.append("barrier")
        inner.accept_token(TOKEN_ID["a"])

    stale = object()
    info = SimpleNamespace(vocab_size=V, vocab_mask=stale)
    nt, ns = derive_tree_links([-1, 0])
    tree = GrammarTree.from_host(torch.tensor([nt]), torch.tensor([ns]),
                                 torch.tensor([TOKEN_ID["a"], TOKEN_ID["7"]]))
    out = build_grammar_vocab_mask(reqs=[req], tree=tree, sampling_info=info, device="cpu",
                                   barrier=barrier)
    assert isinstance(out, GrammarMask)
    assert log[0] == "barrier" and log.count("barrier") == 1 and "fill" in log
    assert info.vocab_mask is None
    # the mask reflects the advanced state: after "a" digits or "b"; "7" is accepted
    after_a = {TOKEN_ID[c] for c in "0123456789b"} | {TOKEN_ID["42"], TOKEN_ID["10"]}
    row0 = out.vocab_mask[0].tolist()
    assert {t for t in range(V) if (row0[t // 32] >> (t % 32)) & 1} == after_a
    assert out.vocab_mask[1].tolist() != [-1] * W


def test_build_mask_without_grammar_returns_none():
    calls = []
    info = SimpleNamespace(vocab_size=V, vocab_mask="extend-mask")
    tree = GrammarTree.from_host(torch.tensor([[1, -1]]), torch.tensor([[-1, -1]]),
                                 torch.tensor([3, 4]))
    out = build_grammar_vocab_mask(reqs=[Req(grammar=None)], tree=tree, sampling_info=info,
                                   device="cpu", barrier=lambda: calls.append(1))
    assert out is None and calls == [1]
    assert info.vocab_mask == "extend-mask"  # nothing to replace it with


# ---------------------------------------------------------------------------------------
# (d) GrammarTree.from_device on the simulated device

LINKS = ([[1, 3, -1, -1], [1, 2, 3, -1]], [[-1, 2, -1, -1], [-1, -1, -1, -1]],
         [11, 12, 13, 14, 21, 22, 23, 24])


def _device_tree(dev):
    return tuple(torch.tensor(x, dtype=torch.int64, device=dev) for x in LINKS)


@pytest.mark.parametrize("policy", [Eager, Lazy], ids=["eager", "lazy"])
def test_from_device_resolve_gives_copied_values(policy):
    with sim_runtime(policy()) as rt:
        tree = GrammarTree.from_device(*_device_tree(rt.device))
        assert tree._done is not None
        host = tree.resolve()
        assert all(h.device.type == "cpu" and h.is_pinned() for h in host)
        assert [h.tolist() for h in host] == list(LINKS)
        assert detect(rt.trace) == []


def test_reading_tree_before_resolve_is_a_race():
    with sim_runtime(Lazy()) as rt:
        tree = GrammarTree.from_device(*_device_tree(rt.device))
        # The bug class: the host reads the pinned buffers while the D2H copies are still
        # queued. Under a lazy schedule it sees the garbage of fresh pinned memory.
        early = tree._host[0].tolist()
        assert early == [[POISON] * 4] * 2
        races = detect(rt.trace)
        assert any(r.kind == "RAW" and r.first.op == COPY_D2H and r.second.op == HOST_READ
                   for r in races), [r.summary() for r in races]
        assert [h.tolist() for h in tree.resolve()] == list(LINKS)


def test_reading_tree_after_resolve_is_race_free():
    with sim_runtime(Lazy()) as rt:
        tree = GrammarTree.from_device(*_device_tree(rt.device))
        host = tree.resolve()
        assert [h.tolist() for h in host] == list(LINKS)
        assert detect(rt.trace) == []


def test_resolve_waits_only_for_the_copies():
    # Under stall(forward) the verify forward queued after from_device never runs on its
    # own; resolve must still return (it waits on the copy event, not the forward).
    with sim_runtime(Stall(["forward"])) as rt:
        fwd = rt.module.Stream()
        rt.label(fwd, "forward")
        with rt.module.stream(fwd):
            tree = GrammarTree.from_device(*_device_tree(rt.device))
            verify = torch.ones(8, device=rt.device) * 2  # the "target verify" launch
            assert [h.tolist() for h in tree.resolve()] == list(LINKS)
            assert fwd.pending  # the forward is still queued
            assert verify.cpu().tolist() == [2.0] * 8
        assert detect(rt.trace) == []


def test_build_mask_on_sim_overlaps_the_forward():
    """Host work only: build_grammar_vocab_mask waits for the tree copies and nothing else,
    and stages the mask with an async copy from pinned memory."""
    with sim_runtime(Stall(["forward"])) as rt:
        fwd = rt.module.Stream()
        rt.label(fwd, "forward")
        with rt.module.stream(fwd):
            nt, ns, dt = _device_tree(rt.device)  # blocking H2Ds: they sync, as on CUDA
            setup = len(rt.trace.log)
            tree = GrammarTree.from_device(nt, ns, dt)
            logits = torch.zeros(8, V, device=rt.device) + 1.0  # the "target verify" launch
            forward_op = fwd.pending[-1]
            reqs = [Req(grammar=make_grammar("person")), Req(grammar=None)]
            info = SimpleNamespace(vocab_size=V, vocab_mask=None)
            mask = build_grammar_vocab_mask(reqs=reqs, tree=tree, sampling_info=info,
                                            device=rt.device)
            assert mask.vocab_mask.device.type == "sim"
            syncs = [r.label for r in rt.trace.log[setup:] if isinstance(r, SyncRecord)]
            assert syncs == ["event.synchronize"]  # resolve only
            assert forward_op in fwd.pending  # the forward is still queued: overlapped
            h2d = [op for op in rt.trace.ops() if op.name == COPY_H2D][-1]
            assert h2d.reads, "the mask upload must read pinned memory when it executes"
            mask.apply(logits)
            row0 = logits[0].cpu()
        assert detect(rt.trace) == []
    assert torch.isinf(row0).sum() == V - 1  # person schema: only "{" at the root


def test_fault_points_sit_after_the_event_and_before_the_upload():
    hits = []

    class Recorder:
        def hit(self, name, ctx):
            hits.append((name, len(rt.trace.log)))

    with sim_runtime(Lazy()) as rt, installed(Recorder()):
        tree = GrammarTree.from_device(*_device_tree(rt.device))
        info = SimpleNamespace(vocab_size=V, vocab_mask=None)
        build_grammar_vocab_mask(reqs=[Req(grammar=make_grammar("bools")), Req(grammar=None)],
                                 tree=tree, sampling_info=info, device=rt.device)
        log = rt.trace.log
    assert [name for name, _ in hits] == ["grammar.after_tree_copy",
                                          "grammar.before_mask_upload"]
    before_hit = log[:hits[0][1]]
    assert isinstance(before_hit[-1], EventRecord)  # the copies, then the event, then us
    assert sum(1 for r in before_hit if getattr(r, "name", "") == COPY_D2H) == 3
    upload = next(i for i, r in enumerate(log) if getattr(r, "name", "") == COPY_H2D
                  and i > hits[0][1])
    assert hits[1][1] <= upload


def test_allocate_vocab_mask_pins_for_a_device():
    with sim_runtime(Lazy()) as rt:
        m = Grammar.allocate_vocab_mask(V, 3, rt.device)
        assert m.is_pinned() and m.device.type == "cpu" and bool((m == -1).all())


def test_mixed_host_and_device_sources():
    with sim_runtime(Lazy()) as rt:
        nt, ns, dt = _device_tree(rt.device)
        host_ns = torch.tensor(LINKS[1])
        tree = GrammarTree.from_device(nt, host_ns, dt)
        out = tree.resolve()
        assert out[1] is host_ns
        assert [h.tolist() for h in out] == list(LINKS)


# ---------------------------------------------------------------------------------------
# End to end: drafter -> from_device -> build mask -> apply, sim vs cpu

LOWER = 'root ::= [a-z0-9 ]+'


def _pipeline(dev, roots, num_draft, policy_stream=None):
    reqs = []
    for b, _ in enumerate(roots):
        g = None
        if b % 3 != 2:  # every third request is unconstrained
            g = BACKEND.grammar_for_ebnf(LOWER)
            g.accept_token(roots[b])  # the root is the token committed last step
        reqs.append(Req(grammar=g))
    info = SimpleNamespace(vocab_size=V, vocab_mask="extend-mask")
    last = torch.tensor(roots, device=dev)
    tree = draft_tree(last, num_draft, V)
    gtree = GrammarTree.from_device(tree.retrieve_next_token, tree.retrieve_next_sibling,
                                    tree.draft_token)
    logits = (torch.arange(len(roots) * num_draft * V, device=dev, dtype=torch.float32)
              .reshape(-1, V) % 13)  # the "target verify" output
    gmask = build_grammar_vocab_mask(reqs=reqs, tree=gtree, sampling_info=info, device=dev)
    assert info.vocab_mask is None
    gmask.apply(logits)
    return logits.argmax(-1).cpu(), logits.cpu()


@pytest.mark.parametrize("policy", [Lazy, lambda: Stall(["forward"])], ids=["lazy", "stall"])
def test_pipeline_on_sim_matches_cpu(policy):
    # roots: committed tokens the grammar accepts (letters, digits), even and odd
    roots = [TOKEN_ID[c] for c in "a7kq2x"]
    num_draft = 8
    ref_argmax, ref_logits = _pipeline("cpu", roots, num_draft)
    assert torch.isinf(ref_logits).any(dim=1).sum() > num_draft  # the mask did something
    with sim_runtime(policy()) as rt:
        fwd = rt.module.Stream()
        rt.label(fwd, "forward")
        with rt.module.stream(fwd):
            got_argmax, got_logits = _pipeline(rt.device, roots, num_draft)
        assert detect(rt.trace) == []
    assert torch.equal(got_logits, ref_logits)
    assert torch.equal(got_argmax, ref_argmax)
