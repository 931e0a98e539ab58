"""A gate's expectation is met only by what it names: a race expected is not met by an
engine that crashes without any overlap (the synchronous reference run)."""
import collections

import impl.scheduler
from harness.trials import reference as reference_module
from scenarios.resolve import run_scenario_result


def _crashing_repro(monkeypatch, expect):
    def broken(*args, **kwargs):
        raise RuntimeError("the engine is broken in every run")
    monkeypatch.setattr(impl.scheduler, "accept_tokens", broken)
    monkeypatch.setattr(reference_module, "_REFERENCE_CACHE", collections.OrderedDict())
    return run_scenario_result("ngram-filter-race", variant="fixed", backend="sim",
                               trials=2, expect=expect)


def test_a_crashing_reference_does_not_pass_for_a_race(monkeypatch):
    res = _crashing_repro(monkeypatch, "race")
    assert res.outcome == "race" and res.reference_crashed  # it did diverge ...
    assert res.matches_expectation is False  # ... but that is not the race expected
    assert "MISMATCH" in res.verdict_line()


def test_a_crashing_reference_fails_a_clean_gate_too(monkeypatch):
    res = _crashing_repro(monkeypatch, "clean")
    assert res.matches_expectation is False


def test_a_real_race_still_meets_a_race_expectation():
    res = run_scenario_result("ngram-filter-race", variant="pre-fix", war_barrier="fine",
                              backend="sim", trials=2, expect="race")
    assert not res.reference_crashed and res.matches_expectation is True
