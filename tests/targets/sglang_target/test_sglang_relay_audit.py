"""The upstream audit's finding, as a test (it flags any change in upstream's behaviour):
the confidence relay's ring copy (private D2H stream) reads ``confidence_buf`` unordered
with the next forward's scatter into it -- a WAR race -- unless ``resolve_seq_lens_cpu``
synchronizes the D2H stream first, which it does only when ``needs_cpu_seq_lens``."""
import pytest

import targets
from harness.runtime.trace import HOST_READ
from scenarios.sglang_relay import confidence_ring


pytestmark = pytest.mark.usefixtures("sglang")


@pytest.mark.parametrize("policy", ["eager", "stall(forward)", "random(1)"])
def test_ring_is_race_free_and_exact_with_cpu_seq_lens(policy):
    r = confidence_ring(policy, needs_cpu_seq_lens=True)
    assert r["resolved"] > 0 and r["mismatches"] == [] and r["races"] == []


def test_ring_copy_races_the_next_scatter_without_cpu_seq_lens():
    r = confidence_ring("eager", needs_cpu_seq_lens=False)
    assert any(s.startswith("WAR") and "issue_ring_copy" in s and "scatter" in s
               for s in r["races"]), r["races"]


def test_the_race_is_value_visible_under_some_schedule():
    """A schedule where the D2H copy lands after the next scatter: the slot labelled step
    k holds step k+1's confidence (found by the audit's random search; pinned here)."""
    r = confidence_ring("random(16)", needs_cpu_seq_lens=False, steps=10)
    assert r["mismatches"], r
    m = r["mismatches"][0]
    assert m["observed"][0][0] == m["expected"][0][0] + 10  # one step too new


def test_control_resolving_without_the_poll_is_a_host_read_race():
    r = confidence_ring("lazy", needs_cpu_seq_lens=False, trust_slot=True)
    assert any(s.startswith("RAW on pinned") and HOST_READ in s for s in r["races"])
