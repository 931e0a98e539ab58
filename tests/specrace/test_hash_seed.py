"""Every specrace process runs under one Python hash seed (``specrace.console``): code under
test that iterates a set of strings does it in the same order in every process, so a report
replays to its own trace. (vLLM 0.27.1 clears a step's finished rows in the order of the set
of their ids; under a random seed its committed report's trace differed in 3 of 8 seeds.)"""
from __future__ import annotations

import json
import os

import pytest

from specrace_process import specrace


@pytest.mark.parametrize("started_under", ["random", "5", None])
def test_a_run_is_pinned_to_hash_seed_0_and_says_so_in_its_report(tmp_path, monkeypatch,
                                                                  started_under):
    env = {"PYTHONHASHSEED": started_under} if started_under else {}
    if started_under is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)  # none set, as on CI
    p = specrace("repro", "ngram-filter-race", "--backend", "sim", "--trials", "1",
                 "--report-dir", str(tmp_path), **env)
    assert p.returncode == 0, p.stderr[-400:]
    (folder,) = os.listdir(tmp_path)
    with open(os.path.join(tmp_path, folder, "report.json"), encoding="utf-8") as f:
        assert json.load(f)["environment"]["python_hash_seed"] == "0"


def test_the_pin_is_one_exec_and_argv_survives_it():
    """A usage error after the exec is still the one-line error for the arguments given."""
    p = specrace("repro", "no-such-scenario", PYTHONHASHSEED="random")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "no-such-scenario" in p.stderr
