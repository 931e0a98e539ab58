"""The seed race end to end on the simulator: pre-fix + fine fence reproduces (stale value
at draft prep AND the detector's schedule-gather vs forward-write pair), the coarse fence
hides it, the FutureMap relay removes it -- under every policy."""
import pytest

from harness.trials.drive import server_args
from harness.trials.trial import run_trial
from harness.policies import parse_policy
from scenarios.registry import get
import targets

SC = get("ngram-filter-race")
POLICIES = ["eager", "lazy", "stall(forward)", "random(3)", "pct(5,3)"]


def trial(variant, war_barrier, policy, seed, stall_ms=None):
    wl = SC.workload(seed)
    args = server_args(wl, {**SC.variants[variant].args, "war_barrier": war_barrier}, targets.get("impl"))
    return run_trial("sim", parse_policy(policy), wl, args, SC.stalls(stall_ms), target=targets.get("impl"))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prefix_fine_fence_reproduces_with_stall(seed):
    res = trial("pre-fix", "fine", "eager", seed)
    assert res.divergence is not None
    assert res.divergence.kind in ("accept_lens", "accept_tokens")
    assert "draft prep" in res.divergence.where
    pairs = {(r.first.actor, r.first.access_kind(), r.second.actor, r.second.op.split(".")[0],
              r.second.where().split(" ")[0]) for r in res.races}
    # the schedule stream's gather in filter_batch races the forward stream's write
    assert any(a == "forward" and b == "schedule" and "spec_info.py" in site
               for a, _, b, _, site in pairs), pairs


@pytest.mark.parametrize("policy", POLICIES)
def test_prefix_race_is_reported_under_every_policy(policy):
    """Happens-before does not depend on the schedule: even where no stale value shows."""
    res = trial("pre-fix", "fine", policy, 0)
    # filter_batch or merge_batch, whichever the run reached first
    assert any(r.first.actor == "forward" and r.second.actor == "schedule"
               and "impl/spec_info.py" in r.second.where() for r in res.races), \
        [r.summary() for r in res.races]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_coarse_fence_hides_prefix_race(policy, seed):
    res = trial("pre-fix", "coarse", policy, seed)
    assert res.divergence is None and res.races == []


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fixed_relay_is_clean(policy, seed):
    res = trial("fixed", "fine", policy, seed)
    assert res.divergence is None, res.divergence
    assert res.races == []
    assert res.checked > 0  # the oracle really compared values


def test_fixed_outputs_equal_reference_token_for_token():
    from harness.trials.reference import reference
    wl = SC.workload(4)
    args = server_args(wl, {"relay": "future_map", "war_barrier": "fine"}, targets.get("impl"))
    res = run_trial("sim", parse_policy("lazy"), wl, args, SC.stalls(None), target=targets.get("impl"))
    ref = reference(wl, args, "sim", targets.get("impl"))
    assert res.outputs == ref.outputs
    assert all(len(v) > 0 for v in res.outputs.values())


def test_timed_stall_shorter_than_host_progress_can_hide_the_race():
    """A 0-ms stall on the simulator is no amplification: the eager device finishes the
    verify before the schedule stream gathers -- stale values need the stall."""
    res = trial("pre-fix", "fine", "eager", 0, stall_ms=0.0)
    assert res.divergence is None
    assert res.races  # ... but the detector still sees the missing edge


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", ["mixed-overlap", "dp-idle"])
def test_host_order_and_dp_idle_scenarios(name, policy):
    """Fixed code stays clean when host steps are reordered or batches are empty; the
    pre-fix relay races there too (the detector, whatever the schedule)."""
    sc = get(name)
    wl = sc.workload(0)
    for variant, clean in (("fixed", True), ("pre-fix", False)):
        args = server_args(wl, {**sc.variants[variant].args, "war_barrier": "fine"}, targets.get("impl"))
        res = run_trial("sim", parse_policy(policy), wl, args, sc.stalls(None), answers=sc.answers, target=targets.get("impl"))
        if clean:
            assert res.divergence is None and res.races == [], (res.divergence, res.races)
        else:
            assert res.races
