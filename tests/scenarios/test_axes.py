"""The workloads a server sees, as axes (scenarios/axes.py): each is driven by a shipped
configuration of a scenario the sglang target runs, or named not modelled with a reason;
a scenario that drops an axis, or drives one undeclared, fails the check."""
import dataclasses

import targets
from harness.run import Variant
from scenarios.axes import AXES, BY_NAME, check, draws, engage
from scenarios.registry import SCENARIOS

SGLANG = {s: SCENARIOS[s] for s in targets.declared("sglang").scenarios}


def test_every_axis_driven_or_not_modelled_and_the_table_matches_the_scenarios():
    assert check(SGLANG) == []
    for axis in AXES:
        assert bool(axis.driven_by) != bool(axis.not_modelled), axis.name
        if axis.not_modelled:  # a reason that names what is missing, not a word
            assert len(axis.not_modelled) > 40, axis.name


def test_the_issue_axes_are_all_declared():
    names = {a.name for a in AXES}
    assert {"overlap-off", "chunked-prefill", "mixed-chunk", "radix-cache", "retraction",
            "pressure", "tree-topk", "grammar", "logprobs", "hidden-states", "page-size",
            "swa", "hybrid", "pd-decode"} <= names


def _without(name: str, variant: str):
    s = SGLANG[name]
    variants = {k: v for k, v in s.variants.items() if k != variant}
    return {**SGLANG, name: dataclasses.replace(s, variants=variants)}


def test_a_scenario_dropping_an_axis_fails_the_check():
    # kv-row-reuse's swa variant is the only SWA configuration: without it the axis is
    # declared driven by a configuration that is gone
    problems = check(_without("kv-row-reuse", "swa"))
    assert problems == ["swa: kv-row-reuse [swa] no longer drives it (not a shipped "
                        "configuration that engages it)"]


def test_a_driver_that_patches_code_does_not_count():
    # the same args behind a seeded bug are not a configuration the server ships
    s = SGLANG["kv-row-reuse"]
    variants = dict(s.variants)
    variants["swa"] = Variant("swa", engage("swa"), mutation="war-barrier-removed")
    problems = check({**SGLANG, "kv-row-reuse": dataclasses.replace(s, variants=variants)})
    assert any(p.startswith("swa: kv-row-reuse [swa] no longer drives it") for p in problems)


def test_an_undeclared_driver_fails_the_check():
    s = SGLANG["slot-reuse"]
    variants = {**s.variants, "swa": Variant("swa", engage("swa"))}
    problems = check({**SGLANG, "slot-reuse": dataclasses.replace(s, variants=variants)})
    assert problems == ["swa: slot-reuse [swa] drives it undeclared"]


def test_scenarios_and_machines_draw_from_the_axes():
    from specrace import machines
    assert machines.KV_LAYOUTS == draws("swa") == ["full", "swa"]
    assert machines.ADMISSIONS == draws("pressure")
    assert machines.CHUNK_SIZES == draws("chunked-prefill") and 0 in machines.CHUNK_SIZES
    assert SGLANG["kv-row-reuse"].variants["swa"].args == {BY_NAME["swa"].arg: "swa"}
