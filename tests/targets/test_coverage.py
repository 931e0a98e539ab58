"""Coverage of the census (``targets.coverage``): executed lines mapped to sites on a tiny
module run under coverage.py, the reason rules, the figures computed from the census,
and one cheap scenario of the installed sglang measured for real (the CI check)."""
from __future__ import annotations

import importlib.util
import textwrap

import pytest

from targets.census import Census, Site, scan_tree
from targets.census_rules import CONFIG, HARDWARE, MULTI_NODE, NOT_REACHED
from targets.coverage import CoverageResult, ScenarioRun, classify, ran_sites

MODULE = textwrap.dedent('''
    class FakeStream:
        def wait_stream(self, other):
            return other

        def synchronize(self):
            return None

    def ran(stream):
        stream.wait_stream(
            stream)
        if stream is None:
            stream.synchronize()
        return stream

    def never(stream):
        stream.wait_stream(stream)
''')


def _run_under_coverage(tmp_path):
    coverage = pytest.importorskip("coverage")
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    path = pkg / "mod.py"
    path.write_text(MODULE)
    cov = coverage.Coverage(data_file=None, source=[str(pkg)], config_file=False)
    cov.start()
    try:
        spec = importlib.util.spec_from_file_location("specrace_cov_probe", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mod.ran(mod.FakeStream())
    finally:
        cov.stop()
    data = cov.get_data()
    lines = {"mod.py": data.lines(str(path)) or []}
    return str(tmp_path), lines


def test_executed_lines_map_to_the_sites_that_ran(tmp_path):
    root, lines = _run_under_coverage(tmp_path)
    sites, _, _, _ = scan_tree(root, ("pkg",))
    # the census names the file from its root; coverage.py's lines are keyed the same way
    sites = [Site(s.file.removeprefix("pkg/"), s.line, s.col, s.function, s.kind, s.span,
                  s.guards, s.text) for s in sites]
    by_function = {(s.function, s.kind): s for s in sites}
    assert set(by_function) == {("ran", "wait-stream"), ("ran", "event-sync"),
                                ("never", "wait-stream")}
    ran = ran_sites(sites, lines)
    # the two-line call ran; the one under a false if did not; nor did the uncalled one
    assert ran == {by_function[("ran", "wait-stream")].key}


def _site(file="srt/managers/x.py", function="f", guards=(), text="s.wait_stream(t)"):
    return Site(file, 1, 0, function, "wait-stream", (1, 1), tuple(guards), text)


def test_reason_rules_name_hardware_transfer_engines_and_configuration():
    from targets.sglang.environments.census import RULES
    assert classify(_site(guards=("_is_hip",)), RULES) == HARDWARE
    assert classify(_site(guards=("not (_is_cuda)",)), RULES) == HARDWARE
    assert classify(_site(guards=("not (_is_hip)",)), RULES) == NOT_REACHED  # the CUDA side
    assert classify(_site(file="srt/layers/attention/ascend_backend.py"), RULES) == HARDWARE
    assert classify(_site(file="srt/disaggregation/mooncake/conn.py"), RULES) == MULTI_NODE
    assert classify(_site(file="srt/disaggregation/decode.py"), RULES) == CONFIG
    assert classify(_site(file="srt/managers/scheduler.py",
                          function="Scheduler.run_batch"), RULES) == NOT_REACHED
    assert classify(_site(function="HiCacheController.write"), RULES) == CONFIG


def test_every_sglang_rule_says_in_words_what_its_sites_need():
    from targets.sglang.environments.census import RULES
    assert all(len(rule) == 4 and rule[3] for rule in RULES), \
        [rule[:3] for rule in RULES if len(rule) != 4 or not rule[3]]


@pytest.mark.parametrize("site, category, words", [
    # 0.5.23 memory_pool.py:2803, a retracted request's KV copied to the host
    (_site(file="srt/mem_cache/memory_pool.py", function="MHATokenToKVPool.get_cpu_copy"),
     CONFIG, "PD decode's retraction backup"),
    # schedule_batch.py:3048, a logprobs request's pinned token ids
    (_site(file="srt/managers/schedule_batch.py", function="ScheduleBatch.prepare_for_extend",
           guards=("self.return_logprob",)), CONFIG, "logprobs"),
    # :2876, the prefill's seq lens: a configuration specrace drives, its own staging runs
    # instead -- the words say why, the category stays "not reached"
    (_site(file="srt/managers/schedule_batch.py", function="ScheduleBatch.prepare_for_extend"),
     NOT_REACHED, "the prefill's staging"),
    (_site(file="srt/speculative/dspark_components/dspark_kv_inject.py",
           function="TargetHiddenKvInjector._inject"), NOT_REACHED, "DSpark's worker"),
    (_site(file="srt/layers/attention/flashinfer_backend.py", function="fast_prefill_plan"),
     CONFIG, "upstream's attention backends"),
    (_site(file="srt/managers/scheduler.py", function="_prewarm_hccl_group"), HARDWARE,
     "another platform"),
    # nobody has said why yet: no words
    (_site(file="srt/managers/scheduler.py", function="Scheduler.run_batch"), NOT_REACHED, ""),
])
def test_an_sglang_site_gets_the_words_of_the_rule_that_names_it(site, category, words):
    from targets.coverage import rule_words
    from targets.sglang.environments.census import RULES
    assert classify(site, RULES) == category
    assert words in rule_words(site, RULES) and (words or rule_words(site, RULES) == "")


def test_figures_come_from_the_census_and_the_runs():
    sites = [_site(file=f"srt/a/{i}.py") for i in range(3)] + \
        [_site(file="srt/disaggregation/mooncake/conn.py")]
    census = Census("sglang", "sglang", "0", "/x", ("srt",), (), 4, tuple(sites), ())
    from targets.sglang.environments.census import RULES
    runs = [ScenarioRun("a", "ran", ran=frozenset({sites[0].key})),
            ScenarioRun("b", "ran", ran=frozenset({sites[0].key, sites[3].key}))]
    res = CoverageResult(census, runs, {s.key: classify(s, RULES) for s in sites})
    s = res.summary()
    assert (s["sites"], s["ran"]) == (4, 2) and s["percent"] == 50.0
    # the transfer engine's site is off the single-node paths: not in the headline
    assert (s["single_node_sites"], s["single_node_ran"]) == (3, 1)
    assert s["single_node_percent"] == round(100 / 3, 1)
    assert [r["ran"] for r in s["by_scenario"]] == [1, 2]
    assert [why for _, why in res.not_run()] == [NOT_REACHED, NOT_REACHED]
    assert res.to_json()["sites"][0]["ran_in"] == ["a", "b"]


@pytest.mark.long
def test_one_cheap_scenario_runs_census_sites_of_the_installed_sglang():
    """The CI check: a scenario of the installed sglang measured under coverage.py runs
    some census sites, and the percentage is the census's, not a constant."""
    pytest.importorskip("coverage")
    from targets import static
    if static.package_root("sglang") is None:
        pytest.skip("sglang is not installed here (make upstream)")
    from targets.coverage import coverage
    res = coverage("sglang", None, ["ngram-filter-race"])
    run = res.runs[0]
    assert run.status == "ran", run.note
    s = res.summary()
    assert s["ran"] > 0
    assert s["sites"] == len(res.census.sites) > s["ran"]
    assert s["percent"] == round(100.0 * s["ran"] / s["sites"], 1)
    ran_files = {k[0] for k in run.ran}
    assert any(f.startswith("srt/managers/") for f in ran_files)


def test_a_releases_row_runs_its_child_under_coverage_and_shows_a_column(monkeypatch):
    import targets.coverage as tc
    from targets.releases import format_table
    site = _site()
    fake = Census("sglang", "sglang", "0.5.23", "/pkg", ("srt",), (), 1, (site,), ())
    monkeypatch.setattr(tc, "census", lambda target, version: fake)
    row_cov = tc.RowCoverage("sglang", "0.5.23")
    cmd = row_cov.command(["py", "-P", "-m", "specrace.cli", "repro", "x", "--json"])
    assert cmd == ["py", "-P", "-m", "specrace.coverage_child", row_cov.out, "/pkg",
                   "repro", "x", "--json"]
    with open(row_cov.out, "w") as f:  # what the child writes: the site's line ran
        f.write('{"files": {"srt/managers/x.py": [1]}, "status": 0}')
    figures = row_cov.figures()
    assert figures == {"coverage_sites": 1, "coverage_ran": 1, "coverage_percent": 100.0}
    row = {"release": "0.5.23", "outcome": "clean", "trials": 1, "reproduced": 0,
           "race_sites": 0, "report": None, "war_barrier": "fine", "note": "", **figures}
    table = format_table("sglang", "x", [row])
    assert "coverage" in table.splitlines()[1] and "1/1 (100.0%)" in table
    plain = {k: v for k, v in row.items() if not k.startswith("coverage")}
    assert "coverage" not in format_table("sglang", "x", [plain])  # no column unasked


def test_children_run_side_by_side_and_come_back_in_the_order_asked(monkeypatch):
    """``jobs=2``: two children at once (a barrier both must reach, which one at a time
    never does), the later-asked one finishing first -- the runs are still reported in
    the order asked, each with its own sites."""
    import threading
    import targets.coverage as tc
    site = _site()
    fake = Census("sglang", "sglang", "0.5.23", "/pkg", ("srt",), (), 1, (site,), ())
    both_in = threading.Barrier(2, timeout=20)
    b_done = threading.Event()

    def measure(python, root, target, spec, backend, trials, hop=None):
        both_in.wait()  # BrokenBarrierError when the children run one at a time
        if spec == "dp-idle":
            assert b_done.wait(20)  # the second asked ends first
            return {}, "", "clean"
        b_done.set()
        return {"srt/managers/x.py": [1]}, "", "race"

    monkeypatch.setattr(tc, "measure", measure)
    res = tc.coverage("sglang", None, ["dp-idle", "slot-reuse"], census_of=fake, jobs=2)
    assert [(r.scenario, r.outcome, len(r.ran)) for r in res.runs] == [
        ("dp-idle", "clean", 0), ("slot-reuse", "race", 1)]


def test_coverage_runs_every_shipped_configuration_unless_the_target_names_its_set():
    """With no scenario named, sglang's coverage runs each scenario's shipped
    configurations (the plan stream, topk 2, SWA, ...), never one that patches code;
    vLLM runs the set it declares."""
    import targets
    from specrace.census_cmd import default_set
    sg = default_set("sglang", targets.declared("sglang"))
    assert "eagle-v2" in sg and "eagle-v2:plan-stream" in sg and "kv-row-reuse:swa" in sg
    from scenarios import registry
    from scenarios.configurations import patched_by
    for spec in sg:  # a variant that patches code (a seeded bug, a candidate fix) is not
        name, _, variant = spec.partition(":")
        assert not patched_by("sglang", registry.get(name).variants[variant or "as-installed"])
    assert "ngram-filter-race:pre-fix" not in sg
    assert len(sg) == len(set(sg)) > len(targets.declared("sglang").scenarios)
    vl = targets.declared("vllm")
    assert default_set("vllm", vl) == list(vl.coverage_set)


def test_a_configuration_the_release_refuses_is_not_driven(monkeypatch):
    """The child refused the variant before any trial (exit 2, "is disabled here"): the
    row is ``not driven`` with the child's reason, and its import lines count for nothing;
    any other failing child keeps its lines and says how it exited."""
    import subprocess
    import targets.coverage as tc
    site = _site()
    fake = Census("sglang", "sglang", "0.5.21", "/pkg", ("srt",), (), 1, (site,), ())

    def run(cmd, **kw):  # the child: coverage.py wrote the lines of the import
        out = cmd[cmd.index("specrace.coverage_child") + 1]
        with open(out, "w") as f:
            f.write('{"files": {"srt/managers/x.py": [1]}, "status": 2}')
        refused = "eagle-v2" in cmd and "penalties" in cmd
        err = ("specrace: error: variant 'penalties' is disabled here: no Req" if refused
               else "specrace: error: something else")
        return subprocess.CompletedProcess(cmd, 2, "", err)
    monkeypatch.setattr(tc.subprocess, "run", run)
    res = tc.coverage("sglang", None, ["eagle-v2:penalties", "eagle-v2:plan-stream"],
                      census_of=fake)
    refused, other = res.runs
    assert (refused.status, refused.ran) == ("not driven", frozenset())
    assert "disabled here: no Req" in refused.note
    assert other.status == "ran" and "exited 2" in other.note and len(other.ran) == 1
