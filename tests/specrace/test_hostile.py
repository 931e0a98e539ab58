"""Hostile input, generated: crafted reports, arguments and pytest options each end in one
line and exit 2 (or a clean refusal), within bounds, never a traceback; every recorded
field of a report either drives the replay or is compared, so an edit is never "identical".

Reports are built from one real report by generators (nothing is committed); the replay
runs in this process (``specrace.cli.main``) -- the subprocess cases (signals, closed
streams) are in ``test_hostile_process.py``.
"""
from __future__ import annotations

import copy
import json
import resource

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specrace.cli import main
from harness.report.bounded import MAX_DEPTH, MAX_VALUES
from specrace.load import load_report
from specrace.replay import replay_report


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A real simulator report of the seed race (2 trials) and its folder."""
    from harness.report import write_reports
    from scenarios.resolve import run_scenario_result
    out = tmp_path_factory.mktemp("hostile")
    result = run_scenario_result("ngram-filter-race", variant="pre-fix", backend="sim",
                                 trials=2, expect="race")
    paths = write_reports(result, str(out))
    with open(paths["json"], encoding="utf-8") as f:
        return json.load(f), paths["json"]


def _put(tmp_path, doc, name="crafted.json"):
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(p)


def _refused(path, needle=""):
    with pytest.raises(ValueError) as info:
        load_report(path)
    msg = str(info.value)
    assert "\n" not in msg and len(msg) < 400, msg
    assert needle in msg, msg
    return msg


def _nested(depth, leaf=0):
    v = leaf
    for _ in range(depth):
        v = [v]
    return v


# --- bounded validation -----------------------------------------------------------------

def _flood(good, key, value):
    doc = copy.deepcopy(good)
    doc[key] = value
    return doc


FLOODS = {
    # (key, value, what the one line says)
    "100k empty trial rows": ("trial_results", [{}] * 100_000,
                              "'trial_results' has more than 10000 items"),
    "10k empty trial rows": ("trial_results", [{}] * 10_000, "missing 'trial'"),
    "2M schedules": ("schedules", [None] * 2_000_000,
                     f"more than {MAX_VALUES} values, most of them in 'schedules'"),
    "200k schedules": ("schedules", [None] * 200_000, "'schedules' has more than 10000"),
    "100k races": ("races", [{}] * 100_000, "'races' has more than 1000 items"),
    "100k stall points": ("stall_plan", [{"point": "x"}] * 100_000,
                          "'stall_plan' has more than 100 items"),
    "wide environment": ("environment", {str(i): i for i in range(10_000)},
                         "'environment' has more than 200 keys"),
    "wide host order": ("host_order", {str(i): True for i in range(1_000)},
                        "'host_order' has more than 50 keys"),
    "bad host order": ("host_order", {"schedule.disable_overlap": {"every": "x"}},
                       "'host_order.schedule.disable_overlap'"),
    "zero every": ("host_order", {"schedule.disable_overlap": {"every": 0}},
                   "'host_order.schedule.disable_overlap'"),
    "stall too long": ("stall_plan", [{"point": "forward.before_verify", "ms": 1e9}],
                       "'stall_plan[0].ms'"),
    "huge string": ("scenario", "s" * 1_000_000, "'scenario' has a bad length"),
    "nested observed": ("first_divergence", {"kind": "crash", "observed": "DEEP"},
                        f"nested more than {MAX_DEPTH} deep"),
    "nested environment": ("environment", {"x": _nested(200)}, "nested more than"),
    "nested host order": ("host_order", {"x": _nested(200)}, "nested more than"),
}


@pytest.mark.parametrize("case", sorted(FLOODS))
def test_a_flooded_report_is_one_line_fast_and_small(tmp_path, good, case):
    key, value, needle = FLOODS[case]
    # "DEEP": ~990 levels, spliced into the text (json.dumps itself cannot nest so deep)
    text = json.dumps(_flood(good[0], key, value)).replace('"DEEP"', "[" * 990 + "]" * 990)
    path = _put(tmp_path, text)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _refused(path, needle)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 200, grown_mb  # was 3-7.5 GB for 100k empty rows


@pytest.mark.parametrize("text,needle", [
    ("", "not valid JSON"), ("null", "expected a JSON object, got null"),
    ("[" * 100_000 + "]" * 100_000, "nested more than"),
    ('{"a": ' * 50_000 + "1" + "}" * 50_000, "nested more than"),
    ("[" + "0," * 600_000 + "0]", "more than 500000 values"),
    ('{"x": 1' + "9" * 100_000 + "}", "not valid JSON"),
    ('{"x": Infinity}', "not valid JSON"), ('{"x": -NaN}', "not valid JSON"),
    ('{"x": "\\ud800"}', "not a specrace report"),
    ('"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["', "expected a JSON object"),
])
def test_malformed_and_deep_text_is_one_line(tmp_path, text, needle):
    _refused(_put(tmp_path, text), needle)


def test_invalid_utf8_is_one_line(tmp_path):
    p = tmp_path / "bytes.json"
    p.write_bytes(b'{"scenario": "\xff\xfe"}')
    _refused(str(p), "not UTF-8")


# every key replaced by a generated hostile value: a ValueError of one line, or a report
_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                  st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30))
_JSON = st.recursive(_LEAF, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)),
    max_leaves=12)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_edit_of_any_field_is_refused_in_one_line_or_loads(tmp_path_factory, good, data):
    doc = copy.deepcopy(good[0])
    keys = sorted(doc) + ["first_divergence.observed", "races.0.first", "trial_results.0"]
    for key in data.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3)):
        value = data.draw(_JSON)
        head, _, rest = key.partition(".")
        if not rest:
            doc[head] = value
        elif head == "first_divergence" and isinstance(doc.get(head), dict):
            doc[head][rest] = value
        elif isinstance(doc.get(head), list) and doc[head]:
            idx, _, sub = rest.partition(".")
            if sub and isinstance(doc[head][int(idx)], dict):
                doc[head][int(idx)][sub] = value
            else:
                doc[head][int(idx)] = value
    path = _put(tmp_path_factory.mktemp("edit"), doc)
    try:
        loaded = load_report(path)
    except ValueError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg and len(msg) < 400, msg
        return
    # what loads, renders (every renderer reads only typed fields) and is not "unedited"
    from harness.report.markdown import render_markdown
    render_markdown(loaded.report, {"json": path}, None).encode("utf-8")
    assert loaded.edited is not False or doc == good[0]


# --- every recorded field is an input or compared -------------------------------------

def _without_id(doc):
    return {k: v for k, v in doc.items() if k != "run_id"}


@pytest.mark.parametrize("edit", ["stall_plan", "host_order", "first_trial_row",
                                  "divergence_expected", "race_count", "target_info"])
def test_an_edited_report_is_never_identical(tmp_path, good, edit):
    doc = copy.deepcopy(good[0])
    if edit == "stall_plan":
        doc["stall_plan"] = []  # honoured: the re-run stalls nowhere
    elif edit == "host_order":
        doc["host_order"] = {"schedule.disable_overlap": {"every": 1}}  # honoured
    elif edit == "first_trial_row":
        doc["trial_results"][0]["checked"] += 1
    elif edit == "divergence_expected":
        doc["first_divergence"]["expected"] = [12345]
    elif edit == "race_count":
        doc["races"][0]["count"] += 1
    else:
        doc["target_info"] = {**doc["target_info"], "version": "elsewhere"}
    for d, tag in ((doc, "with run id"), (_without_id(doc), "without run id")):
        verdict = replay_report(_put(tmp_path, d, f"{edit}.json"))
        assert not verdict["same"], (tag, verdict["summary"])
        assert "identical" not in verdict["summary"], verdict["summary"]


def test_the_unedited_report_is_identical(good):
    verdict = replay_report(good[1])
    assert verdict["same"], verdict["summary"]


def test_derived_figures_must_follow(tmp_path, good):
    for key, value in (("outcome", "clean"), ("rate", 0.5), ("matches_expectation", False),
                       ("reproduced", 1)):
        _refused(_put(tmp_path, {**good[0], key: value}), "not a specrace report")
    rows = copy.deepcopy(good[0]["trial_results"])
    rows[1]["seed"] = 99
    _refused(_put(tmp_path, {**good[0], "trial_results": rows}), "'trial_results[1]'")


# --- replay's own bounds ----------------------------------------------------------------

def test_replay_refuses_more_trials_than_asked_before_any_trial(tmp_path, good, capsys):
    doc = {k: v for k, v in good[0].items()
           if k not in ("trial_results", "schedules", "run_id", "rate", "traced_trials",
                        "first_trial")}
    doc["trials"] = 10_000
    path = _put(tmp_path, doc)
    assert main(["replay", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["specrace: error: the report asks for 10000 trials; replay runs at most "
                   "1000 unless told more (--max-trials N)"]


def test_replay_stops_at_its_budget(good, capsys):
    assert main(["replay", good[1], "--budget-s", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("specrace: error: replay stopped after 1/2 trials: past its 0 s budget "
                       "(--budget-s)")


# --- arguments --------------------------------------------------------------------------

HUGE = "z" * 100_000


@pytest.mark.parametrize("args", [
    ["repro", HUGE], ["repro", "ngram-filter-race", "--variant", HUGE],
    ["repro", "ngram-filter-race", "--trials", HUGE], ["repro", "ngram-filter-race",
                                                       "--trials", "9" * 5000],
    ["repro", "ngram-filter-race", "--stall-ms", HUGE], ["repro", "ngram-filter-race",
                                                         "--policy", HUGE],
    ["repro", "ngram-filter-race", "--backend", HUGE], ["replay", HUGE],
    ["replay", "x.json", "--budget-s", "-1"], ["replay", "x.json", "--max-trials", "0"],
    [HUGE], ["list", "--target", HUGE],
])
def test_bad_arguments_are_one_short_line(args, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specrace: error:"), err
    assert len(err[0]) <= 620, len(err[0])


# --- bench of a target that is not installed --------------------------------------------

def _sglang_installed() -> bool:
    import targets
    try:
        targets.get("sglang")
        return True
    except targets.TargetError:
        return False


@pytest.mark.parametrize("what", ["engine", "matrix", "runtime"])
def test_bench_of_a_missing_target_is_one_line(what, capsys):
    if _sglang_installed():
        pytest.skip("sglang is installed here")
    assert main(["bench", what, "--target", "sglang"]) == 2
    out = capsys.readouterr()
    err = out.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specrace: error:") and "sglang" in err[0]
    assert out.out == ""  # not a silent impl benchmark


# --- pytest options ---------------------------------------------------------------------

class _Config:
    def __init__(self, **opts):
        self.opts = opts

    def getoption(self, name, default=None):
        return self.opts.get(name, default)


@pytest.mark.parametrize("opts,needle", [
    ({"--specrace-soak": -1}, "--specrace-soak: -1 is out of range"),
    ({"--specrace-soak": 10**9}, "out of range"),
    ({"--specrace-soak": 1, "--specrace-soak-examples": -5}, "--specrace-soak-examples"),
    ({"--specrace-soak": 1, "--specrace-soak-examples": 0}, "--specrace-soak-examples"),
    ({"--specrace-matrix": True, "--specrace-matrix-json": "/nonexistent/dir/m.json"},
     "cannot write"),
    ({"--specrace-matrix": True, "--specrace-matrix-json": "/"}, "is a directory"),
    ({"--specrace-matrix-json": "m.json"}, "needs --specrace-matrix"),
])
def test_pytest_options_are_checked_at_configure(opts, needle):
    from specrace.pytest_plugin import check_options
    with pytest.raises(pytest.UsageError, match=needle):
        check_options(_Config(**opts))


def test_a_writable_matrix_json_is_accepted_and_not_left_behind(tmp_path):
    from specrace.pytest_plugin import check_options
    path = tmp_path / "m.json"
    check_options(_Config(**{"--specrace-matrix": True, "--specrace-matrix-json": str(path)}))
    assert not path.exists()


# --- every walk over report data is bounded ------------------------------------------

def test_a_deep_value_from_a_run_is_walked_without_recursion_errors():
    from harness.oracle.divergence import Divergence
    from seams.text import printable_tree
    deep = 0
    for _ in range(5000):
        deep = [deep]
    div = Divergence("crash", "m", expected=deep, observed=deep)
    assert json.dumps(div.to_json()) and div.identity()["observed"].startswith("<value")
    assert "nested deeper" in json.dumps(printable_tree({"x": deep}))
