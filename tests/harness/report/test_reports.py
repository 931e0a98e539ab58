"""Reports: the four files, the Chrome trace format, replay, and replay's input checks."""
from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys

import jsonschema
import pytest

from harness.detect.hb import AccessInfo, Race
from harness.trials.repro import run_repro
from scenarios.resolve import RunRequest, resolve
from harness.trials.results import ReproResult
from harness.report import Report, report_name, write_reports
from harness.report.chrome import chrome_trace
from specrace.replay import MAX_BYTES, replay_report
from harness.report.schema import REPORT_SCHEMA
from harness.report.timeline import render_timeline
from harness.runtime.trace import (HOST_READ, WAIT_EVENT, EventRecord, HostAccess, OpKind,
                                   OpRecord, SyncRecord, Trace)
from scenarios.registry import get

from seams.paths import REPO_ROOT as ROOT
PHASES = {"X", "i", "s", "f", "M"}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    result = run_repro(resolve(RunRequest("ngram-filter-race", variant="pre-fix",
                                          war_barrier="fine", backend="sim", trials=2,
                                          expect="race")))
    paths = write_reports(result, str(out))
    return result, paths, out


def _load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# --- write_reports ---------------------------------------------------------------------

def test_four_files_in_one_set_folder(written):
    outcome, paths, out = written
    assert set(paths) == {"json", "markdown", "trace", "timeline"}
    base = report_name(outcome.identity())
    assert base.startswith("ngram-filter-race-pre-fix-fine-sim-eager-stallauto-t2-seed0-")
    for kind, fn in {"json": "report.json", "markdown": "report.md", "trace": "trace.json",
                     "timeline": "timeline.png"}.items():
        assert paths[kind] == os.path.join(str(out), base, fn)
    for p in paths.values():
        assert os.path.isfile(p) and os.path.getsize(p) > 0
    with open(paths["timeline"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # the set is one folder; no temp files are left behind
    assert os.listdir(out) == [base]
    assert sorted(os.listdir(out / base)) == sorted(os.path.basename(p) for p in paths.values())


def test_the_name_carries_every_setting_of_the_run():
    from harness.policies import parse_policy
    base = RunRequest("ngram-filter-race", variant="pre-fix", backend="sim")
    names = {report_name(resolve(c).identity()) for c in (
        base, dataclasses.replace(base, policy=parse_policy("pct(7,3)")),
        dataclasses.replace(base, trials=3), dataclasses.replace(base, stall_ms=0.5),
        dataclasses.replace(base, seed=1), dataclasses.replace(base, war_barrier="coarse"),
        dataclasses.replace(base, variant="fixed"), dataclasses.replace(base, detect=False),
        dataclasses.replace(base, stall_plan=[]),
        dataclasses.replace(base, host_order={"schedule.disable_overlap": True}))}
    assert len(names) == 10
    assert all(len(n) < 255 and "/" not in n for n in names)
    # the expectation is not a setting of the run: the same run, the same set
    assert report_name(resolve(dataclasses.replace(base, expect="race")).identity()) in names
    assert "pct_7_3" in report_name(resolve(dataclasses.replace(
        base, policy=parse_policy("pct(7,3)"))).identity())


def test_the_name_before_the_run_is_the_name_after_it(written):
    outcome, _, _ = written
    run = resolve(RunRequest("ngram-filter-race", variant="pre-fix", war_barrier="fine",
                             backend="sim", trials=2, expect="race"))
    assert run.identity() == outcome.identity()


def test_json_report_validates_and_round_trips(written):
    outcome, paths, _ = written
    doc = _load(paths["json"])
    jsonschema.validate(doc, REPORT_SCHEMA)
    assert json.loads(json.dumps(doc)) == doc
    assert doc["specrace_report"] == 1
    for k in ("scenario", "variant", "war_barrier", "backend", "policy", "stall_ms", "seed",
              "trials", "reproduced", "races", "first_divergence"):
        assert doc[k] == json.loads(json.dumps(outcome.to_json()[k], default=str))
    # ... and reads back as the same typed result (the one reader of the keys)
    from harness.trials.results import ReproResult
    again = ReproResult.from_json(doc)
    assert again.first_divergence == outcome.first_divergence
    assert [r.summary() for r in again.races] == [r.summary() for r in outcome.races]
    assert again.to_json() == {**json.loads(json.dumps(outcome.to_json())),
                               "report_files": doc["report_files"]}
    env = doc["environment"]
    for k in ("python", "platform", "torch", "xgrammar", "specrace"):
        assert k in env
    assert doc["replay"]["command"] == f"specrace replay {paths['json']}"


def test_markdown_says_what_raced_and_how_to_replay(written):
    outcome, paths, _ = written
    with open(paths["markdown"], encoding="utf-8") as f:
        md = f.read()
    assert "RACE REPRODUCED" in md
    for race in outcome.to_json()["races"]:
        assert f"{race['first']['file']}:{race['first']['line']}" in md
        assert f"{race['second']['file']}:{race['second']['line']}" in md
    assert f"specrace replay {paths['json']}" in md
    assert "ui.perfetto.dev" in md and "chrome://tracing" in md
    assert f"]({os.path.basename(paths['timeline'])})" in md
    div = outcome.first_divergence
    assert div is not None and str(div.observed) in md


def test_chrome_trace_format(written):
    outcome, paths, _ = written
    doc = _load(paths["trace"])
    events = doc["traceEvents"]
    assert doc["displayTimeUnit"] == "ms"
    assert events
    for ev in events:
        assert ev["ph"] in PHASES, ev
        assert ev["pid"] == 1
        if ev["ph"] == "X":
            assert isinstance(ev["ts"], (int, float)) and isinstance(ev["dur"], (int, float))
            assert ev["dur"] >= 0
            assert "where" in ev["args"] and "reads" in ev["args"] and "writes" in ev["args"]
    names = {ev["tid"]: ev["args"]["name"] for ev in events
             if ev["ph"] == "M" and ev["name"] == "thread_name"}
    assert names[0] == "host"
    trace = outcome.trace
    for sid, sname in trace.stream_names.items():
        assert names[sid + 1].startswith(sname)
    # one X per executed op; flows come in s/f pairs with unique ids
    assert sum(ev["ph"] == "X" for ev in events) == len(trace.executed)
    starts = [ev["id"] for ev in events if ev["ph"] == "s"]
    ends = [ev["id"] for ev in events if ev["ph"] == "f"]
    assert len(starts) == len(set(starts)) and sorted(starts) == sorted(ends)
    by_id = {}
    for ev in events:
        if ev["ph"] in ("s", "f"):
            by_id.setdefault(ev["id"], {})[ev["ph"]] = ev
    for pair in by_id.values():
        assert pair["s"]["ts"] <= pair["f"]["ts"]
        assert pair["f"]["bp"] == "e"
    assert any(ev["ph"] == "s" and ev["name"] == "event" for ev in events)


def test_chrome_trace_marks_the_racing_pair(written):
    outcome, paths, _ = written
    races = outcome.trace_races
    assert races, "the pre-fix seed race must race"
    events = _load(paths["trace"])["traceEvents"]
    marked = {}
    for ev in events:
        if ev["ph"] in ("X", "i") and "race" in ev.get("args", {}):
            marked[ev["args"]["trace_index"]] = ev
            assert ev["cname"] == "terrible"
    for n, race in enumerate(races, 1):
        for acc in (race.first, race.second):
            assert acc.index in marked
            assert f"{race.kind} #{n}" in marked[acc.index]["args"]["race"]
    race_flows = [ev for ev in events if ev["ph"] == "s" and ev["name"] == "race"]
    assert len(race_flows) == len(races)


def test_no_trace_skips_trace_and_png(tmp_path, written):
    outcome, _, _ = written
    paths = write_reports(dataclasses.replace(outcome, trace=None, trace_races=[]),
                          str(tmp_path))
    assert paths["trace"] is None and paths["timeline"] is None
    assert os.path.isfile(paths["json"]) and os.path.isfile(paths["markdown"])
    assert sorted(os.listdir(os.path.dirname(paths["json"]))) == ["report.json", "report.md"]


def _untimed_trace():
    """A CUDA-like trace (no per-op times) whose race has a host side."""
    t = Trace(stream_names={0: "compute", 1: "copy"}, storage_names={7: "pinned int32[4]"})
    frame = (os.path.join(ROOT, "impl", "worker.py"), 10, "f")
    w = OpRecord(0, "fill", [], [(7, 0, 16)], frame)
    w.seq = 1
    wait = OpRecord(1, WAIT_EVENT, [], [], frame, kind=OpKind.WAIT, wait_for=(0, 1))
    wait.seq = 1
    host = HostAccess((7, 0, 16), False, "pinned int32[4]", frame)
    for rec in (w, EventRecord(1, (0, 1), frame), wait,
                SyncRecord("event.synchronize", [(1, 1)], frame), host):
        t.add(rec)
    t.log  # numbers the records (a record's index is its place in the log)
    race = Race("RAW", "pinned int32[4]",
                AccessInfo("compute", "fill", 1, True, frame, w.index),
                AccessInfo("host", HOST_READ, 1, False, frame, host.index))
    return t, race


def test_the_trace_words_recorded_digests_hash_are_the_ones_written():
    """Op kinds and the runtime's own op names are named constants, but committed reports'
    trace digests hash their text: the words themselves must not change."""
    from harness.runtime.trace import COPY_D2H, COPY_D2H_ITEM, COPY_H2D, STALL_OP
    assert [str(k) for k in OpKind] == ["kernel", "copy", "wait", "stall"]
    assert (COPY_D2H, COPY_H2D, COPY_D2H_ITEM, WAIT_EVENT, STALL_OP, HOST_READ) == (
        "copy D2H", "copy H2D", "copy D2H (item)", "wait_event", "stall", "host read")
    t, race = _untimed_trace()
    events = chrome_trace(t, [race])["traceEvents"]
    wait = next(e for e in events if e.get("name") == WAIT_EVENT)
    assert json.dumps([wait["cat"], wait["args"]["kind"]]) == '["wait", "wait"]'


def test_untimed_trace_is_laid_out_in_host_order_and_says_so():
    t, race = _untimed_trace()
    result = Report(ReproResult("x", "v", "fine", "cuda", "hardware", None, 0, 1, 1, "race",
                                first_trial=0))
    doc = chrome_trace(t, [race], result)
    events = doc["traceEvents"]
    assert doc["otherData"]["time_base"] == "synthetic"
    meta = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"][0]
    assert meta["args"]["time_base"] == "synthetic" and "synthetic" in meta["args"]["time_note"]
    xs = [e for e in events if e["ph"] == "X"]
    assert [e["args"]["trace_index"] for e in sorted(xs, key=lambda e: e["ts"])] == [0, 2]
    host = [e for e in events if e["ph"] == "i" and "race" in e.get("args", {})]
    assert len(host) == 1 and host[0]["tid"] == 0 and host[0]["args"]["race"] == "RAW #1"
    assert any(e["ph"] == "X" and e["args"].get("race") == "RAW #1" for e in events)
    buf = io.BytesIO()
    render_timeline(t, [race], result, buf)
    assert buf.getvalue()[:4] == b"\x89PNG"


# --- replay ----------------------------------------------------------------------------

def test_replay_of_a_fresh_sim_report_is_identical(written):
    _, paths, _ = written
    verdict = replay_report(paths["json"])
    assert verdict["same"] is True, verdict["summary"]
    assert verdict["summary"].startswith("replay: identical verdict (reproduced 2/2")
    assert "\n" not in verdict["summary"]
    assert verdict["original"] == verdict["replayed"]


def test_a_sim_report_records_every_trials_schedule_and_the_shown_trace_digest(written):
    outcome, paths, _ = written
    doc = _load(paths["json"])
    assert len(doc["schedules"]) == doc["trials"] == 2
    assert all(isinstance(t, str) and t for t in doc["schedules"])
    from harness.report.chrome import trace_digest
    assert doc["trace_digest"] == trace_digest(outcome.trace, outcome.trace_races)


@pytest.mark.parametrize("source", ["schedule", "seed"])
def test_replay_of_a_pre_fix_report_reproduces_the_race_from_either_source(written, source):
    _, paths, _ = written
    verdict = replay_report(paths["json"], from_=source)
    assert verdict["same"] is True, verdict["summary"]
    assert verdict["from"] == source
    assert verdict["replayed"]["reproduced"] == 2 and verdict["replayed"]["race_sites"]
    assert ("from the recorded schedules" in verdict["summary"]) == (source == "schedule")


def test_replay_defaults_to_the_schedule_and_falls_back_to_the_seed(tmp_path, written):
    _, paths, _ = written
    from specrace.replay import load_report, replay_source
    assert replay_source(load_report(paths["json"]), None) == "schedule"
    doc = {k: v for k, v in _load(paths["json"]).items() if k != "schedules"}  # an old report
    p = tmp_path / "old.json"
    p.write_text(json.dumps(doc))
    report = load_report(str(p))
    assert replay_source(report, None) == "seed"
    with pytest.raises(ValueError, match="recorded no schedules.*--from seed"):
        replay_source(report, "schedule")


def test_a_report_with_only_the_required_keys_reads_and_renders(tmp_path, written):
    """The schema requires what replay needs; the reader gives every other key the value
    a run without it would have, and the Markdown still renders."""
    from specrace.load import load_report
    from harness.report.markdown import render_markdown
    from harness.report.schema import REPORT_SCHEMA
    _, paths, _ = written
    full = _load(paths["json"])
    doc = {k: full[k] for k in REPORT_SCHEMA["required"]}
    p = tmp_path / "bare.json"
    p.write_text(json.dumps(doc))
    loaded = load_report(str(p))
    res = loaded.result
    assert (res.target, res.trial_results, res.stall_plan, res.schedules) == ("impl", [], [],
                                                                              None)
    assert res.reproduced == full["reproduced"] and len(res.races) == len(full["races"])
    assert res.first_divergence.kind == full["first_divergence"]["kind"]
    md = render_markdown(loaded.report, {}, None)
    assert "RACE REPRODUCED" in md and full["races"][0]["first"]["file"] in md


def test_a_tampered_schedule_is_reported_as_a_different_schedule(tmp_path, written):
    """A schedule the run cannot follow (stream 7 never runs) is no crash: the replay
    goes on from there and says which trial left its recorded choices, and where."""
    _, paths, _ = written
    doc = _load(paths["json"])
    first, rest = doc["schedules"][1].split(" ", 1)
    doc["schedules"][1] = "7 " + rest
    p = tmp_path / "tampered.json"
    p.write_text(json.dumps(doc))
    verdict = replay_report(str(p))
    assert verdict["same"] is False
    assert verdict["summary"].startswith("replay: DIFFERENT schedule: trial 2 left its "
                                         "recorded choices at choice 1 of ")
    assert "\n" not in verdict["summary"]


def test_a_different_trace_is_told(tmp_path, written):
    _, paths, _ = written
    doc = {**_load(paths["json"]), "trace_digest": "0" * 64}
    p = tmp_path / "digest.json"
    p.write_text(json.dumps(doc))
    verdict = replay_report(str(p))
    assert verdict["same"] is False
    assert verdict["summary"].startswith("replay: DIFFERENT trace")


def test_cli_replay_from_a_report_without_schedules_is_a_usage_error(tmp_path, written):
    _, paths, _ = written
    doc = {**_load(paths["json"]), "schedules": None}
    p = tmp_path / "seed-only.json"
    p.write_text(json.dumps(doc))
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(x for x in (ROOT, os.environ.get("PYTHONPATH")) if x)}
    proc = subprocess.run([sys.executable, "-m", "specrace.cli", "replay", "--from", "schedule",
                           str(p)], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()]
    assert "recorded no schedules" in proc.stderr and "Traceback" not in proc.stderr


def test_replay_notices_a_different_verdict(tmp_path, written):
    _, paths, _ = written
    doc = _load(paths["json"])
    doc["reproduced"], doc["first_divergence"], doc["races"] = 0, None, []
    for row in doc["trial_results"]:  # the derived figures follow the edit
        row["reproduced"], row["divergence"], row["races"] = False, None, 0
    doc.update(first_trial=None, outcome="clean", rate=0.0, matches_expectation=False)
    p = tmp_path / "edited.json"
    p.write_text(json.dumps(doc))
    verdict = replay_report(str(p))
    assert verdict["same"] is False
    assert verdict["summary"].startswith("replay: DIFFERENT verdict: reproduced 0/2 -> 2/2")
    assert verdict["summary"].endswith("EDITED report: its content does not match its run id")
    assert "\n" not in verdict["summary"]


def _bad_reports(tmp_path, good):
    cases = {}

    def put(name, text):
        p = tmp_path / name
        p.write_text(text)
        cases[name] = (str(p), None)
        return p

    cases["missing"] = (str(tmp_path / "nope.json"), "No such file")
    cases["directory"] = (str(tmp_path), "directory")
    put("garbage.json", "{\n  \"scenario\": \n")
    cases["garbage.json"] = (cases["garbage.json"][0], "not valid JSON (line 3")
    put("array.json", "[1, 2, 3]")
    cases["array.json"] = (cases["array.json"][0], "expected a JSON object, got an array")
    put("nan.json", json.dumps({**good, "stall_ms": 1.0}).replace("1.0", "NaN", 1))
    cases["nan.json"] = (cases["nan.json"][0], "not valid JSON")
    no_scenario = {k: v for k, v in good.items() if k != "scenario"}
    put("no-scenario.json", json.dumps(no_scenario))
    cases["no-scenario.json"] = (cases["no-scenario.json"][0],
                                 "not a specrace report: missing 'scenario'")
    put("bad-seed.json", json.dumps({**good, "seed": "0; rm -rf /"}))
    cases["bad-seed.json"] = (cases["bad-seed.json"][0], "'seed' must be an integer, not a string")
    put("bad-version.json", json.dumps({**good, "specrace_report": 2}))
    cases["bad-version.json"] = (cases["bad-version.json"][0], "unsupported format version")
    put("bad-backend.json", json.dumps({**good, "backend": "tpu"}))
    cases["bad-backend.json"] = (cases["bad-backend.json"][0], "'backend' must be one of")
    put("bad-trials.json", json.dumps({**good, "trials": 10**9}))
    cases["bad-trials.json"] = (cases["bad-trials.json"][0], "'trials'")
    put("unknown-scenario.json", json.dumps({**good, "scenario": "../../etc/passwd"}))
    cases["unknown-scenario.json"] = (cases["unknown-scenario.json"][0], "unknown scenario")
    put("unknown-variant.json", json.dumps({**good, "variant": "post-apocalypse"}))
    cases["unknown-variant.json"] = (cases["unknown-variant.json"][0], "unknown variant")
    marker = tmp_path / "pwned"
    put("evil-policy.json", json.dumps(
        {**good, "policy": f"__import__('os').system('touch {marker}')"}))
    cases["evil-policy.json"] = (cases["evil-policy.json"][0], "bad policy")
    put("multiline.json", json.dumps({**good, "scenario": "a\nb\r\nc"}))
    cases["multiline.json"] = (cases["multiline.json"][0], "unknown scenario")
    # recorded schedules: text in the choices' form, one per trial, under one budget
    put("bad-schedule.json", json.dumps({**good, "schedules": ["0 2*2 x*3", "h"]}))
    cases["bad-schedule.json"] = (cases["bad-schedule.json"][0],
                                  "'schedules'[0]: schedule choices: bad token 'x*3' (number 3)")
    put("schedule-count.json", json.dumps({**good, "schedules": good["schedules"][:1]}))
    cases["schedule-count.json"] = (cases["schedule-count.json"][0],
                                    "'schedules': 1 recorded for 2 trials")
    put("schedule-flood.json", json.dumps({**good, "schedules": ["h*1999999", "0*2"]}))
    cases["schedule-flood.json"] = (cases["schedule-flood.json"][0],
                                    "'schedules'[1]: schedule choices: more than 2000000")
    put("schedule-type.json", json.dumps({**good, "schedules": [1, 2]}))
    cases["schedule-type.json"] = (cases["schedule-type.json"][0],
                                   "'schedules[0]' must be a string or null, not a number")
    # every key the typed reader reads is typed by the schema: nothing unchecked reaches
    # the renderers or replay
    div = {**good["first_divergence"], "kind": "cosmic-ray"}
    put("bad-divergence-kind.json", json.dumps({**good, "first_divergence": div}))
    cases["bad-divergence-kind.json"] = (cases["bad-divergence-kind.json"][0],
                                         "'first_divergence.kind' must be one of")
    rows = [{**good["trial_results"][0], "checked": "lots"}]
    put("bad-trial-row.json", json.dumps({**good, "trial_results": rows}))
    cases["bad-trial-row.json"] = (cases["bad-trial-row.json"][0],
                                   "'trial_results[0].checked' must be an integer")
    race = {**good["races"][0], "first": {**good["races"][0]["first"], "seq": [1]}}
    put("bad-race-seq.json", json.dumps({**good, "races": [race]}))
    cases["bad-race-seq.json"] = (cases["bad-race-seq.json"][0],
                                  "'races[0].first.seq' must be an integer")
    stall = [{"point": "forward.after_read_done", "every": 0}]
    put("bad-stall-plan.json", json.dumps({**good, "stall_plan": stall}))
    cases["bad-stall-plan.json"] = (cases["bad-stall-plan.json"][0], "'stall_plan[0].every'")
    big = tmp_path / "huge.json"
    with open(big, "wb") as f:
        f.truncate(MAX_BYTES + 1)
    cases["huge.json"] = (str(big), "MB limit")
    return cases, marker


def test_replay_rejects_bad_input_with_one_line(tmp_path, written):
    _, paths, _ = written
    good = _load(paths["json"])
    cases, marker = _bad_reports(tmp_path, good)
    for name, (path, needle) in cases.items():
        with pytest.raises(ValueError) as info:
            replay_report(path)
        msg = str(info.value)
        assert msg and "\n" not in msg and "\r" not in msg, (name, msg)
        assert len(msg) < 400, (name, msg)
        if needle:
            assert needle in msg, (name, msg)
    assert not marker.exists()


def test_replay_of_a_cuda_report_without_a_gpu(tmp_path, written):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    _, paths, _ = written
    # a CUDA report records no schedule (the GPU's is not ours to record)
    doc = {**_load(paths["json"]), "backend": "cuda", "policy": "hardware", "schedules": None}
    p = tmp_path / "cuda.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as info:
        replay_report(str(p))
    msg = str(info.value)
    assert msg.startswith("report was recorded on cuda; this machine has no GPU (use "
                          "--backend sim")
    assert "\n" not in msg


@pytest.mark.parametrize("case", ["missing", "evil-policy.json", "bad-schedule.json"])
def test_cli_replay_bad_input_exits_2_with_one_line(tmp_path, written, case):
    _, paths, _ = written
    cases, _ = _bad_reports(tmp_path, _load(paths["json"]))
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-m", "specrace.cli", "replay", cases[case][0]],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("specrace: error: ")
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_a_run_past_its_recorded_choices_says_so_not_choice_1_of_0():
    from harness.runtime.policy import Schedule
    from specrace.replay import _left_schedule
    past = _left_schedule((Schedule(()),), [Schedule((1, 0))])
    assert past == "DIFFERENT schedule: trial 1 made 2 choice(s) past its 0 recorded"
    inside = _left_schedule((Schedule((1, 1)),), [Schedule((1, 0))])
    assert "at choice 2 of 2" in inside
    assert _left_schedule((Schedule((1,)),), [Schedule((1,))]) is None
