"""The release gate's plan (specrace/gate.py), computed without running: the CI subset
touches every scenario and every release that can run one; a plan missing one fails;
``not applicable`` only where the release lacks the scenario's code, with the reason."""
import stat
import sys

import pytest

import targets
from harness.run import AS_INSTALLED
from scenarios.configurations import shipped
from scenarios.registry import SCENARIOS
from specrace import gate
from targets import releases
from targets.sglang.environments import NEEDS, SHIPS, SglangEnvironments

from specrace_process import ScriptRelease

RELEASES = [f"0.5.{n}" for n in range(14, 24)]
SGLANG = {s: SCENARIOS[s] for s in targets.declared("sglang").scenarios}


def _child(tmp_path, body: str) -> str:
    """A release interpreter that runs ``body`` (sys, json, os, time imported)."""
    path = tmp_path / "python"
    path.write_text(f"#!{sys.executable}\nimport sys, json, os, time\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _configurations(scenario):
    return [c.variant for c in shipped("sglang", scenario)]


def _why_not(v, s):
    """A made-up release line for the planner (not the real releases' table): DSpark from
    0.5.22, EAGLE v2 driven on 0.5.23 alone (its code from 0.5.14), GrammarTree from
    0.5.17, the leaf result copy from 0.5.15."""
    n = int(v.split(".")[2])
    if s.startswith("dspark") and n < 22:
        return "not applicable", "the release has no DSparkVerifyPlanner"
    if s.startswith("eagle-v2") and n < 23:
        return "not driven", "the release has the code; specrace's slice needs ..."
    if s.startswith("grammar") and n < 17:
        return "not applicable", "the release has no GrammarTree.from_device"
    if s == "ngram-hidden-readback" and n < 15:
        return "not applicable", "the release has no leaf result copy"
    return "", ""


def test_the_subset_touches_every_scenario_and_release_once_as_installed():
    cells = gate.plan(SGLANG, RELEASES, _why_not, _configurations, subset=True)
    assert gate.untouched(cells, list(SGLANG), RELEASES, _why_not) == []
    assert {c[1] for c in cells} == set(SGLANG) and {c[0] for c in cells} == set(RELEASES)
    assert all(c[2] == AS_INSTALLED and not _why_not(c[0], c[1])[0] for c in cells)
    # no more cells than it takes: each scenario once, and a release left over once more
    assert len(cells) == max(len(SGLANG), len(RELEASES))


def test_the_full_plan_is_every_release_scenario_and_shipped_configuration():
    cells = gate.plan(SGLANG, RELEASES, _why_not, _configurations, subset=False)
    runnable = [(v, s) for v in RELEASES for s in SGLANG if not _why_not(v, s)[0]]
    assert len(cells) == (sum(len(_configurations(SGLANG[s])) for _, s in runnable)
                          + len(RELEASES) * len(SGLANG) - len(runnable))
    assert ("0.5.23", "eagle-v2", "topk2") in cells
    assert ("0.5.14", "eagle-v2", AS_INSTALLED) in cells  # its one "not driven" row


@pytest.mark.parametrize("drop", ["scenario", "release"])
def test_a_plan_missing_a_scenario_or_a_release_fails(drop):
    cells = gate.plan(SGLANG, RELEASES, _why_not, _configurations, subset=True)
    if drop == "scenario":  # eagle-v2 runs on one release only: its one cell dropped
        cut = [c for c in cells if c[1] != "eagle-v2"]
        assert gate.untouched(cut, list(SGLANG), RELEASES, _why_not) == ["scenario eagle-v2"]
    else:
        cut = [c for c in cells if c[0] != "0.5.14"]
        assert "release 0.5.14" in gate.untouched(cut, list(SGLANG), RELEASES, _why_not)


def test_a_cell_that_cannot_run_does_not_touch_its_scenario():
    # a plan that puts dspark on 0.5.14 (not applicable there) leaves dspark untouched
    cells = [(v, s, AS_INSTALLED) for v in RELEASES for s in SGLANG
             if not (s == "dspark-result-readback" and v != "0.5.14")]
    assert gate.untouched(cells, list(SGLANG), RELEASES, _why_not) == [
        "scenario dspark-result-readback"]


def test_the_gate_fails_on_errors_and_unexpected_outcomes():
    def row(scenario, conf, outcome, note=""):
        return {"release": "0.5.23", "scenario": scenario, "configuration": conf,
                "outcome": outcome, "war_barrier": "fine", "note": note}
    ok = [row("kv-row-reuse", "as-installed", "clean"),
          row("ngram-hidden-readback", "as-installed", "race"),
          row("dspark-result-readback", "as-installed", "not driven", "the release ...")]
    assert gate.problems(ok, SGLANG) == []
    bad = [row("kv-row-reuse", "as-installed", "race"),
           row("eagle-v2", "topk2", "error", "exit 1 without a result")]
    assert [p.split(":")[0] for p in gate.problems(bad, SGLANG)] == [
        "0.5.23 kv-row-reuse [as-installed]", "0.5.23 eagle-v2 [topk2]"]


def test_not_applicable_only_where_the_code_is_absent():
    """On every release set up here: a scenario whose upstream code (SHIPS) the release
    has is never ``not applicable``, and every ``not applicable`` names what is absent."""
    envs = SglangEnvironments()
    have = envs.line.installed()
    if not have:
        pytest.skip("no sglang release environment here (make upstream-releases)")
    from targets import static
    for v in have:
        root = envs.line.release_root(v)
        if root is None:  # the core's own sglang serves it: nothing of its own to read
            continue
        # EAGLE v2's worker ships from 0.5.14: never "not applicable" where it is (it
        # was, while specrace's slice lacked a later helper: that is "not driven")
        if static.find(root, SHIPS["eagle-v2"][0])[0] is not None:
            assert envs.not_applicable(v, "eagle-v2") == "", v
        for s in NEEDS:
            why = envs.not_applicable(v, s)
            if s in SHIPS and all(static.find(root, t)[0] is not None for t in SHIPS[s]):
                assert why == "", (v, s, why)
            if why:
                assert why.startswith("the release has no "), (v, s, why)
                assert envs.not_driven(v, s).startswith("the release has the code") or \
                    not envs.not_driven(v, s)


def test_releases_runs_a_row_per_release_and_configuration(tmp_path):
    """``specrace releases`` without ``--variant``: each shipped configuration of the
    scenario is its own child run (``--variant NAME``), a row per release x configuration."""
    child = _child(tmp_path, "a = sys.argv\n"  # the variant asked for, as the result's
                   "v = a[a.index('--variant') + 1] if '--variant' in a else None\n"
                   "print(json.dumps({'outcome': 'clean', 'trials': 1, 'reproduced': 0,"
                   " 'variant': v}))")
    confs = [(c.variant, c.text()) for c in shipped("sglang", SGLANG["ngram-hidden-readback"])]
    assert [c[0] for c in confs] == [AS_INSTALLED, "eager-verify"]
    rows = releases.run_releases(ScriptRelease(child), "sglang", "ngram-hidden-readback", [],
                                 str(tmp_path / "out"), ["1.0", "2.0"], configurations=confs)
    assert [(r["release"], r["configuration"], r["variant"]) for r in rows] == [
        ("1.0", AS_INSTALLED, AS_INSTALLED), ("1.0", "eager-verify", "eager-verify"),
        ("2.0", AS_INSTALLED, AS_INSTALLED), ("2.0", "eager-verify", "eager-verify")]
    table = releases.format_table("sglang", "ngram-hidden-readback", rows)
    assert "configuration" in table and "eager-verify" in table


def test_cells_run_in_parallel_come_back_in_the_plans_order(tmp_path):
    child = _child(tmp_path, "time.sleep(0.6 if os.environ.get('SPECRACE_RELEASE_HOP') == '1.0'"
                   " else 0)\n"  # the later releases answer sooner
                   "print(json.dumps({'outcome': 'clean', 'trials': 1, 'reproduced': 0}))")
    cells = [("1.0", "kv-row-reuse", AS_INSTALLED), ("2.0", "slot-reuse", AS_INSTALLED),
             ("3.0", "dp-idle", AS_INSTALLED)]
    rows = gate.run(cells, ScriptRelease(child), 1, str(tmp_path / "out"), coverage=False, jobs=3)
    assert [(r["release"], r["scenario"], r["configuration"]) for r in rows] == cells
    assert gate.problems(rows, SGLANG) == []


def test_bad_numbers_are_one_line_and_exit_2(capsys):
    assert gate.main(["--jobs", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--jobs" in err[0]


def test_a_release_that_cannot_run_the_scenario_is_one_row_not_one_per_configuration(tmp_path):
    class Old(ScriptRelease):
        def not_applicable(self, version, scenario):
            return "the release has no leaf result copy" if version == "0.5.14" else ""
    confs = [(c.variant, c.text()) for c in shipped("sglang", SGLANG["ngram-hidden-readback"])]
    rows = releases.run_releases(Old("/nonexistent/python"), "sglang", "ngram-hidden-readback", [],
                                 str(tmp_path), ["0.5.14", "0.5.15"], configurations=confs)
    assert [(r["release"], r["outcome"]) for r in rows] == [
        ("0.5.14", "not applicable"), ("0.5.15", "error"), ("0.5.15", "error")]
