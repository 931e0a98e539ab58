"""The load axis (``--load NAME``): background work beside every trial, in the run's
identity, its report and its replay; a bad name is bad input."""
from __future__ import annotations

import json

import pytest

from harness.runtime.load import LOADS, get_load
from scenarios.resolve import ResolveError, RunRequest, resolve, run_scenario_result
from specrace import cli


def test_every_load_is_named_for_its_cause():
    assert set(LOADS) == {"none", "bulk-d2h", "bulk-h2d", "host-busy"}
    assert all(load.cause for load in LOADS.values())
    assert get_load("bulk-d2h").bulk_us("d2h") > 1000  # 256 MiB: milliseconds of engine
    with pytest.raises(ValueError, match="unknown load"):
        get_load("bulk")


def test_a_bad_load_is_one_line_and_exit_2(capsys):
    assert cli.main(["repro", "ngram-filter-race", "--load", "noisy", "--no-report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--load" in err[0] and "bulk-d2h" in err[0]
    with pytest.raises(ResolveError):
        resolve(RunRequest("ngram-filter-race", backend="sim", load="noisy"))


def test_a_load_is_part_of_the_run_and_its_report(tmp_path, capsys):
    plain = resolve(RunRequest("ngram-filter-race", backend="sim", trials=1))
    loaded = resolve(RunRequest("ngram-filter-race", backend="sim", trials=1,
                                load="bulk-d2h"))
    assert "load" not in plain.identity() and loaded.identity()["load"] == "bulk-d2h"
    assert cli.main(["repro", "ngram-filter-race", "--variant", "pre-fix", "--trials", "2",
                     "--backend", "sim", "--load", "bulk-d2h", "--report-dir",
                     str(tmp_path)]) == 0
    report = next(tmp_path.glob("*/report.json"))
    doc = json.loads(report.read_text())
    assert doc["load"] == "bulk-d2h" and "--load bulk-d2h" in (
        report.parent / "report.md").read_text()
    capsys.readouterr()
    assert cli.main(["replay", str(report)]) == 0
    assert "identical verdict" in capsys.readouterr().out


def test_bulk_d2h_makes_the_result_readback_stale_with_no_stall():
    """The DSpark folded readback with no injected stall: clean without a load (on the
    simulator's eager schedule every copy runs at once), stale behind bulk D2H traffic."""
    pytest.importorskip("targets.sglang")
    import targets
    try:
        targets.get("sglang")
    except targets.TargetError:
        pytest.skip("sglang is not installed (make upstream)")
    run = dict(target="sglang", backend="sim", trials=2, stall_ms=0)
    quiet = run_scenario_result("dspark-result-readback", variant="no-cpu-seq-lens", **run)
    busy = run_scenario_result("dspark-result-readback", variant="no-cpu-seq-lens",
                               load="bulk-d2h", **run)
    assert quiet.first_divergence is None
    assert busy.first_divergence is not None, busy.races[:1]
    assert busy.first_divergence.kind == "accept_tokens"
    # a backend with CPU seq lens syncs a D2H each step: the queue drains in time
    drained = run_scenario_result("dspark-result-readback", load="bulk-d2h", **run)
    assert drained.first_divergence is None and drained.races


def test_outputs_only_judges_the_outputs_and_replays_as_such(tmp_path, capsys):
    """``--outputs-only``: no trace and no race detection (the host at its own speed on
    CUDA), the wrong tokens still judged; in the run's name, its report's command, its
    replay."""
    assert cli.main(["repro", "ngram-filter-race", "--variant", "pre-fix", "--trials", "2",
                     "--backend", "sim", "--outputs-only", "--json", "--report-dir",
                     str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["traced_trials"] == 0 and doc["races"] == []
    assert doc["outcome"] == "race" and doc["reproduced"] == 2  # by the wrong tokens
    report = next(tmp_path.glob("*/report.json"))
    assert "--outputs-only" in (report.parent / "report.md").read_text()
    assert cli.main(["replay", str(report)]) == 0
    out = capsys.readouterr().out
    assert "identical verdict" in out
    traced = resolve(RunRequest("ngram-filter-race", backend="sim", trials=1))
    untraced = resolve(RunRequest("ngram-filter-race", backend="sim", trials=1, detect=False))
    assert traced.identity()["detect"] and not untraced.identity()["detect"]
