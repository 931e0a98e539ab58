"""A run is resolved once: ``resolve(RunRequest) -> Run`` takes every default, checks every
name, and ``run_repro`` accepts nothing but the frozen ``Run`` it makes."""
from __future__ import annotations

import dataclasses

import pytest

import targets
from harness.run import AS_INSTALLED, Run, Variant
from harness.trials.repro import run_repro
from scenarios.resolve import ResolveError, RunRequest, resolve
from seams.vocab import Backend, Fence


def test_run_repro_takes_only_a_resolved_run():
    request = RunRequest("ngram-filter-race", backend="sim", trials=1)
    with pytest.raises(TypeError, match="resolved Run"):
        run_repro(request)
    with pytest.raises(TypeError, match="resolved Run"):
        run_repro({"scenario": "ngram-filter-race"})


def test_resolve_takes_every_default_once():
    run = resolve(RunRequest("ngram-filter-race", backend="sim"))
    assert isinstance(run, Run)
    assert run.target is targets.get("impl")  # the object, not a name
    assert run.variant.name == run.scenario.default_variant
    assert run.war_barrier is Fence.FINE and run.backend is Backend.SIM
    assert run.trials == run.scenario.sim_trials
    assert run.policy == run.scenario.default_policy
    assert run.stalls == tuple(run.scenario.stalls(None))
    assert dict(run.host_order) == run.scenario.answers
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.trials = 3


def test_a_run_is_whole_or_refused():
    run = resolve(RunRequest("ngram-filter-race", backend="sim", trials=1))
    with pytest.raises(ValueError, match="sim or cuda"):
        dataclasses.replace(run, backend=Backend.AUTO)
    with pytest.raises(ValueError, match="trials"):
        dataclasses.replace(run, trials=0)
    with pytest.raises(ValueError, match="policy"):
        dataclasses.replace(run, policy=None)


@pytest.mark.parametrize("field,value,message", [
    ("scenario", "ngram-filter-rac", "unknown scenario"),
    ("variant", "prefix", "unknown variant"),
    ("war_barrier", "fin", "unknown --war-barrier"),
    ("backend", "gpu", "unknown --backend"),
    ("expect", "raced", "unknown --expect"),
    ("trials", 10_001, "trials must be"),
])
def test_a_bad_name_is_refused_where_it_comes_in(field, value, message):
    request = dataclasses.replace(RunRequest("ngram-filter-race", backend="sim"),
                                  **{field: value})
    with pytest.raises(ResolveError, match=message):
        resolve(request)


def test_the_target_chooses_its_own_defaults():
    class Released(targets.ImplTarget):
        name = "released"

        def default_variant(self, scenario):
            return AS_INSTALLED

        def default_war_barrier(self):
            return "coarse"

    run = resolve(RunRequest("ngram-filter-race", target="released", backend="sim"),
                  load_target=lambda name: Released())
    assert run.variant.name == AS_INSTALLED and run.war_barrier is Fence.COARSE
    assert run.identity()["target"] == "released"


def test_a_variant_is_a_patch_or_a_fix_never_both():
    with pytest.raises(ValueError, match="not both"):
        Variant("x", {}, mutation="m", fix="f")
    v = Variant("x", {"relay": "spec_info"})
    with pytest.raises(TypeError):
        v.args["relay"] = "future_map"  # read-only: a variant cannot be changed in place
