"""Retraction under real memory pressure: requests admitted on their prefill
alone (``ServerArgs.admission="optimistic"``) run the KV pool short in decode, and the
scheduler chooses whom to retract (``impl.schedule_batch.retract_for_memory``, upstream's
``check_decode_mem`` / ``retract_decode`` order). Whom and when differs between an
overlapped trial and its synchronous reference, so the per-step oracle stands down for
such a request from the first point the runs part (``StaleValueOracle.lined_up``); its
outputs, the model oracle and the KV it read still judge it. The helpers take a target:
``tests/targets/sglang_target/test_sglang_pressure.py`` runs them on upstream's ``retract_decode``."""
from __future__ import annotations

import collections
import dataclasses

import pytest

from seams.faults.plan import FaultPlan
from harness.oracle import stale
from harness.oracle.model import greedy_continuation
from harness.policies import parse_policy
from harness.runtime import open_runtime
from harness.trials.drive import drive, server_args
from matrix.run import PROBES, run_probe
from tests.impl.test_retraction import (POLICIES, assert_clean, assert_every_seed_decides,
                                        run_retract)
from scenarios.registry import get
import targets


def retraction_points(target: str, seed: int, overlap: bool):
    """``{rid: [from_step, ...]}`` of one run of the pressure variant, and its outputs."""
    sc = get("kv-pressure")
    wl = sc.workload(seed)
    args = dataclasses.replace(server_args(wl, sc.variants["fixed"].args, targets.get(target)),
                               overlap=overlap)
    seen = collections.defaultdict(list)

    def observer(name, ctx):
        if name == "retracted":
            seen[ctx["req"].rid].append(ctx["from_step"])
    with open_runtime("sim", parse_policy("eager")) as rt:
        outputs = drive(rt, wl, args, FaultPlan(observer=observer), target=targets.get(target))
    return dict(seen), outputs, wl


def test_pressure_retracts_and_the_runs_part(target="impl", part: bool = True):
    """The pool runs short in every seed, and on impl the trial and its reference
    retract different requests or at different steps in some: what the oracle must
    allow (impl's reference commits each result right after its launch, so it decides
    from fewer slots held). On the sglang target they never part (``part`` False):
    upstream's disable path, its reference, also decides before it processes."""
    parted = 0
    for seed in (0, 1, 2):
        trial, outputs, wl = retraction_points(target, seed, overlap=True)
        ref, _, _ = retraction_points(target, seed, overlap=False)
        assert trial, seed
        parted += trial != ref
        for spec in wl.requests:  # the outputs are still the model's
            assert outputs[spec.rid] == greedy_continuation(spec.prompt, spec.max_new_tokens)
    assert bool(parted) == part, parted


@pytest.mark.parametrize("policy", POLICIES)
def test_the_fixed_code_is_clean_under_pressure(policy, target="impl"):
    res = run_retract(target, policy, variant="fixed", scenario="kv-pressure")
    assert_clean(res)


def _oracle(ref_retractions):
    ref = stale.Reference({(7, 1): (1, [5]), (7, 2): (3, [6, 7, 8])}, {},
                          retractions=ref_retractions)
    return stale.StaleValueOracle(ref, stop_early=False)


class _Req:
    rid, prompt = 7, [1, 2, 3, 4]


def test_steps_compare_only_while_the_runs_retracted_alike():
    """The reference retracted request 7 from step 1 (its step 1 a re-prefill: one
    token); a trial that did not numbers a verify step 1 (three tokens). That is not a
    stale value: the per-step comparison stands down from the first step the runs part,
    and resumes nothing after it; where both retracted alike, it compares as before."""
    o = _oracle({7: [1]})
    o("result", {"req": _Req, "step": 1, "accept_len": 3, "tokens": [5, 6, 7]})
    assert o.first is None and not o.lined_up(7, 1) and o.lined_up(7, 0)
    o = _oracle({7: [1]})
    o("retracted", {"req": _Req, "from_step": 1})
    o("result", {"req": _Req, "step": 1, "accept_len": 3, "tokens": [5, 6, 7]})
    assert o.first is not None and o.first.kind == "accept_lens"
    o = _oracle({})  # no retraction in either run: every step compares
    o("result", {"req": _Req, "step": 2, "accept_len": 3, "tokens": [6, 7, 9]})
    assert o.first is not None and o.first.kind == "accept_tokens"


def test_without_the_stand_down_a_parted_run_would_be_called_stale(monkeypatch):
    """Seed 27 on impl: request 5 retracted from steps 0 and 4 in the trial, from 1 and
    3 in its reference. The fixed code is clean; with the comparison forced on for every
    step, its step 4 -- a re-prefill in one run, a verify in the other -- "differs"."""
    assert run_retract("impl", "eager", seed=27, variant="fixed",
                       scenario="kv-pressure").divergence is None
    monkeypatch.setattr(stale.StaleValueOracle, "lined_up", lambda self, rid, step: True)
    d = run_retract("impl", "eager", seed=27, variant="fixed",
                    scenario="kv-pressure").divergence
    assert d is not None and d.rid == 5 and d.kind in ("accept_lens", "accept_tokens"), d


def test_a_missing_barrier_is_killed_under_pressure_on_every_seed(target="impl"):
    assert_every_seed_decides(("kv-pressure", "kv-pressure-lazy"),
                              targets.get(target).mutation("war-barrier-removed"), target)


def test_a_committed_retracted_result_is_killed_under_pressure(target="impl",
                                                               seeds=(0, 1, 2)):
    """Where a retracted request had a decode step in flight (on the sglang target not
    in seed 2: there the pressure retracts only a request whose in-flight step is its
    prefill, which upstream's prefill processing drops unpatched)."""
    m = targets.get(target).mutation("retracted-result-committed")
    for probe in ("kv-pressure", "kv-pressure-lazy"):
        for seed in seeds:
            killed, _, detail = run_probe(dataclasses.replace(PROBES[probe], seeds=(seed,)),
                                          "sim", m, target=target)
            assert killed, (probe, seed, detail)
