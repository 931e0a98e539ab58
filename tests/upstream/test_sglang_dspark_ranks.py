"""Two TP ranks of the DSpark slice take the same control decisions per step
(``scenarios/dspark_ranks.py``): the budget upstream's planner computes from each rank's
own confidence ring, and whether the rank takes part in the ``DSPARK_PLAN`` broadcast."""
import pytest

import targets
from scenarios.dspark_ranks import run_two_ranks


@pytest.fixture(scope="module", autouse=True)
def sglang():
    targets.get("sglang")


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
