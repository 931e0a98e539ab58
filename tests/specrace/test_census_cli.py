"""``specrace census`` / ``specrace coverage`` at the command line: bad input is one line
and exit 2, the table and the JSON come from the census they are given."""
from __future__ import annotations

import json

import pytest

from targets.census import Census, Site

BAD = [
    ["census", "--target", "impl"],
    ["census", "--target", "nope"],
    ["census", "--release", "x;rm -rf /"],
    ["census", "--release", "0.4.0"],  # outside the supported range
    ["coverage", "no-such-scenario"],
    ["coverage", "--trials", "0"],
    ["coverage", "--target", "vllm", "ngram-filter-race"],
]


@pytest.mark.parametrize("args", BAD, ids=" ".join)
def test_bad_input_is_one_line_and_exit_2(args, capsys):
    from specrace.cli import main
    assert main(list(args)) == 2
    _, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("specrace: error: ")


def _fake(target, release=None, readbacks=False, progress=None):
    sites = (Site("srt/managers/a.py", 3, 4, "A.f", "wait-stream", (3, 3)),
             Site("srt/managers/a.py", 9, 0, "A.g", "event-record", (9, 10)))
    return Census(target, "sglang", "9.9.9", "/nowhere", ("srt/managers", "srt/gone"),
                  ("srt/gone",), 2, sites, (("srt/managers/b.py", "does not parse"),))


def test_census_json_and_table_come_from_the_census(monkeypatch, capsys):
    import targets.census
    from specrace.cli import main
    monkeypatch.setattr(targets.census, "census", _fake)
    assert main(["census", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total"] == 2 and out["by_kind"] == {"wait-stream": 1, "event-record": 1}
    assert [s["line"] for s in out["sites"]] == [3, 9]
    assert out["unreadable"] == [{"file": "srt/managers/b.py", "why": "does not parse"}]
    assert main(["census"]) == 0
    text = capsys.readouterr().out
    assert "sglang 9.9.9: 2 ordering sites in 2 files" in text
    assert "srt/managers/a.py:9" in text and "srt/gone" in text and "does not parse" in text


def test_coverage_prints_every_site_not_run_with_its_reason(capsys):
    from specrace.census_cmd import print_coverage
    from targets.coverage import CoverageResult, ScenarioRun, classify
    from targets.sglang.environments.census import RULES
    c = _fake("sglang")
    hw = Site("srt/layers/attention/aiter_backend.py", 5, 0, "B.f", "record-stream", (5, 5))
    c = Census(c.target, c.package, c.version, c.root, c.areas, c.missing_areas, c.files,
               c.sites + (hw,), c.unreadable)
    res = CoverageResult(c, [ScenarioRun("s", "ran", ran=frozenset({c.sites[0].key}))],
                         {x.key: classify(x, RULES) for x in c.sites})
    print_coverage(res)
    out = capsys.readouterr().out
    assert "total: 1/3 (33.3%)" in out
    assert "single-node paths: 1/2 (50.0%)" in out  # the AMD backend's site is left out
    assert "srt/managers/a.py:9" in out and "aiter_backend.py:5" in out
    assert "not reached by any scenario" in out and "hardware specrace does not model" in out
