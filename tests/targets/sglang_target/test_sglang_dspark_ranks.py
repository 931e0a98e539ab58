"""Two TP ranks of the DSpark slice take the same control decisions per step
(``scenarios/dspark_ranks.py``): the budget upstream's planner computes from each rank's
own confidence ring, and whether the rank takes part in the ``DSPARK_PLAN`` broadcast."""
import pytest

import targets
from scenarios.dspark_ranks import run_two_ranks


pytestmark = pytest.mark.usefixtures("sglang")


@pytest.mark.parametrize("policy", ["eager", "random(1)"])
def test_ranks_agree_when_nothing_rank_local_differs(policy):
    r = run_two_ranks(policy)
    assert r["first_difference"] is None, r
    assert r["steps"][0] == r["steps"][1] > 3 and r["participation"][0] > 0


def test_the_oracle_fails_on_a_seeded_divergence():
    """Rank 1's draft confidence perturbed: its budget differs, and the oracle says when."""
    r = run_two_ranks(confidence_skew=0.9)
    assert r["first_difference"] is not None, r
    assert r["rank0"]["budget"] != r["rank1"]["budget"]


def test_rank_local_d2h_timing_steers_budget_and_broadcast_participation():
    """The finding: without CPU seq lens nothing synchronizes the ring copy, so one rank's
    late D2H stream makes its copy_done.query() say "not yet" where the other rank's says
    done -- one rank computes a budget and joins the broadcast, the other does not."""
    r = run_two_ranks(stall_rank=1)
    assert r["first_difference"] is not None, r
    assert r["rank0"]["participates"] and not r["rank1"]["participates"], r
    assert r["participation"][1] < r["participation"][0]


def test_cpu_seq_lens_synchronize_keeps_the_ranks_together():
    r = run_two_ranks(stall_rank=1, needs_cpu_seq_lens=True)
    assert r["first_difference"] is None, r


def test_a_skipped_broadcast_is_a_collective_mismatch_a_hang():
    """Collectives are matched calls: the rank that got no budget skips its DSPARK_PLAN
    broadcast, and from that call on the ranks' collectives part -- one waits for ever."""
    r = run_two_ranks(stall_rank=1)
    m = r["collective_mismatch"]
    assert m is not None and m["kind"] == "collective-mismatch", r
    assert m["rank0"] is not None and m["rank0"][:3] == ("broadcast", "tp", "DSPARK_PLAN")


@pytest.mark.parametrize("stall_rank", [1, 0])
def test_broadcasting_the_budget_keeps_the_collectives_matched(stall_rank):
    """Upstream PR #31195's fix: every rank takes rank 0's budget, so every rank calls the
    same collectives, whichever rank's D2H stream was late."""
    r = run_two_ranks(stall_rank=stall_rank, broadcast_budget=True)
    assert r["collective_mismatch"] is None, r


def test_matched_calls_are_compared_call_for_call():
    from scenarios.dspark_ranks import collective_mismatch
    call = ("broadcast", "tp", "DSPARK_PLAN", (3,))
    assert collective_mismatch([call, call], [call, call]) is None
    assert collective_mismatch([call, call], [call])["rank1"] is None
    other = ("broadcast", "tp", "DSPARK_PLAN", (2,))
    assert collective_mismatch([call], [other])["call"] == 0
