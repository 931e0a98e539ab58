"""Declared native writes: xgrammar fills the pinned bitmask from C++, and the detector
sees it as the host write it is ("upload before fill" is a happens-before finding)."""
from __future__ import annotations

import json

import pytest
import torch
import xgrammar

from harness.detect import detect
from harness.policies import parse_policy
from harness.runtime import hostmem, native
from harness.runtime.sim.runtime import sim_runtime
from harness.runtime.trace import COPY_H2D, HostAccess
from impl.grammar import GrammarBackend
from toys.bitmask import allocate_vocab_mask, bitmask_width
from toys.vocab import EOS_ID, VOCAB, VOCAB_SIZE

SCHEMA = json.dumps({"type": "array", "items": {"type": "boolean"}})
W = bitmask_width(VOCAB_SIZE)


def _grammar():
    return GrammarBackend(VOCAB, EOS_ID).grammar_for_json_schema(SCHEMA)


def test_fill_is_a_host_write_of_the_row_it_fills():
    g = _grammar()
    with sim_runtime() as rt:
        mask = allocate_vocab_mask(VOCAB_SIZE, 3, rt.device)  # pinned: watched
        g.fill_vocab_mask(mask, 1)
        g.fill_vocab_mask(mask[2:], 0)  # a view: row 0 of it is row 2 of the mask
    writes = [r for r in rt.trace.log if isinstance(r, HostAccess) and r.write]
    assert [(w.access[1], w.access[2]) for w in writes] == [(4 * W, 8 * W),
                                                            (8 * W, 12 * W)]
    assert all(w.frame[2] == "fill_vocab_mask" for w in writes)  # the caller, not the wrapper
    assert len({w.access[0] for w in writes}) == 1


@pytest.mark.parametrize("policy", ["eager", "lazy"])
@pytest.mark.parametrize("upload_first", [False, True])
def test_upload_before_fill_is_a_race_fill_then_upload_is_clean(policy, upload_first):
    g = _grammar()
    with sim_runtime(parse_policy(policy)) as rt:
        mask = allocate_vocab_mask(VOCAB_SIZE, 1, rt.device)
        if upload_first:
            dev = mask.to(rt.device, non_blocking=True)
            g.fill_vocab_mask(mask, 0)
        else:
            g.fill_vocab_mask(mask, 0)
            dev = mask.to(rt.device, non_blocking=True)
        rt.module.synchronize()
        del dev
    races = detect(rt.trace)
    if upload_first:
        assert [(r.kind, r.first.op, r.second.actor) for r in races] == [
            ("WAR", COPY_H2D, "host")]
    else:
        assert races == []


def test_wrapped_once_and_silent_outside_a_run():
    native.ensure_wrapped(hostmem.note_host)
    first = xgrammar.GrammarMatcher.fill_next_token_bitmask
    native.ensure_wrapped(hostmem.note_host)
    assert xgrammar.GrammarMatcher.fill_next_token_bitmask is first
    assert getattr(first, "_specrace_native", False)
    row = torch.full((1, W), 0, dtype=torch.int32)
    _grammar().fill_vocab_mask(row, 0)  # no run recording: a plain call, and it still works
    assert row.ne(0).any()
