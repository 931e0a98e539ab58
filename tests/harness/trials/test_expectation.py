"""A run whose synchronous reference crashes has no verdict: the code does not fit the
target (exit 2 from the CLI), never a race (nor a clean run), whatever was expected."""
import collections

import pytest

import impl.scheduler
from harness.target import DoesNotFit
from harness.trials import reference as reference_module
from scenarios.resolve import run_scenario_result
from specrace import cli


@pytest.fixture
def broken_engine(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the engine is broken in every run")
    monkeypatch.setattr(impl.scheduler, "accept_tokens", broken)
    monkeypatch.setattr(reference_module, "_REFERENCE_CACHE", collections.OrderedDict())


@pytest.mark.parametrize("expect", ["race", "clean", None])
def test_a_crashing_reference_is_no_verdict(broken_engine, expect):
    with pytest.raises(DoesNotFit, match="does not fit the impl target: engine crashed "
                                         "in the synchronous reference run"):
        run_scenario_result("ngram-filter-race", variant="fixed", backend="sim",
                            trials=2, expect=expect)


def test_the_cli_says_so_in_one_line_and_exit_2(broken_engine, capsys, tmp_path):
    assert cli.main(["repro", "ngram-filter-race", "--trials", "2", "--backend", "sim",
                     "--report-dir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert "reproduced" not in captured.out + captured.err
    assert "does not fit the impl target" in captured.err
    assert list(tmp_path.iterdir()) == []  # no report of a verdict that never was


def test_a_real_race_still_meets_a_race_expectation():
    res = run_scenario_result("ngram-filter-race", variant="pre-fix", war_barrier="fine",
                              backend="sim", trials=2, expect="race")
    assert not res.reference_crashed and res.matches_expectation is True
