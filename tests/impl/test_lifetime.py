"""Memory lifetime in the engine: each protection impl/ takes (upstream's practice) is needed,
and dropping it is a happens-before finding, not only a lucky stale value.

Under ``lazy`` no stream runs ahead of what the host demands, so the dropped protection
usually shows no wrong value; the detector must still name the race.
"""
import pytest

from harness.trials.drive import server_args
from harness.trials.trial import run_trial
from harness.policies import parse_policy
from harness.runtime.trace import COPY_H2D
from mutations import BY_NAME
from scenarios.registry import get
import targets


def _trial(scenario: str, policy: str, mutation=None, seed: int = 0):
    sc = get(scenario)
    wl = sc.workload(seed)
    args = server_args(wl, {**sc.variants["fixed"].args, "war_barrier": "fine"}, targets.get("impl"))
    return run_trial("sim", parse_policy(policy), wl, args, sc.stalls(None), stop_early=False,
                     mutation=mutation, target=targets.get("impl"))


def test_schedule_inputs_not_recorded_race_across_a_reuse():
    res = _trial("ngram-filter-race", "lazy", BY_NAME["forward-inputs-not-recorded"])
    reuse = [r for r in res.races if r.reuse is not None]
    assert reuse, [r.summary() for r in res.races]
    r = reuse[0]
    # the forward's read of a schedule-stream tensor vs the schedule stream's next owner
    assert (r.first.actor, r.second.actor, r.kind) == ("forward", "schedule", "WAR")
    assert r.reuse.old.stream == r.reuse.new.stream == "schedule"
    # a forward input the schedule stream made (prepare_for_extend's)
    assert any(f in r.reuse.old.where() for f in ("impl/scheduler.py",
                                                   "toys/requests.py"))


def test_copy_sources_freed_early_race_across_a_reuse():
    res = _trial("ngram-filter-race", "lazy", BY_NAME["result-sources-freed-early"])
    reuse = [r for r in res.races if r.reuse is not None]
    assert any(r.first.actor == "copy" and r.second.actor == "forward" for r in reuse), \
        [r.summary() for r in res.races]


def test_upload_before_fill_is_a_happens_before_finding():
    res = _trial("grammar-ngram", "lazy", BY_NAME["extend-mask-upload-before-fill"])
    assert res.divergence is None  # lazy: the copy ran after the fill -- values are fine
    assert any(r.first.op == COPY_H2D and r.second.actor == "host" and r.second.write
               for r in res.races), [r.summary() for r in res.races]


@pytest.mark.parametrize("scenario", ["ngram-filter-race", "grammar-ngram"])
def test_fixed_engine_has_no_reuse_race_under_lazy(scenario):
    res = _trial(scenario, "lazy")
    assert res.races == [] and res.divergence is None
