"""`specrace releases`: bad input is one line and exit 2 (no release environment needed);
whatever a release's child does, that release gets a row and the others still run."""
import os
import stat
import sys

import pytest

from specrace import cli
from targets import envs, releases
from targets.sglang.environments import LINE, SglangEnvironments
from specrace_process import ScriptRelease


@pytest.mark.parametrize("release, says", [
    ("0.4.0", "outside the supported range"),
    ("0.6.1", "outside the supported range"),
    ("not-a-version", "is not a version number"),
    ("0.5.20", "not set up here"),
])
def test_a_bad_release_is_one_line_and_exit_2(release, says, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(envs, "ENVS", str(tmp_path))
    assert cli.main(["releases", "ngram-filter-race", "--release", release]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_no_release_set_up_is_exit_2(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(envs, "ENVS", str(tmp_path))
    assert cli.main(["releases", "ngram-filter-race"]) == 2
    assert "make upstream TARGET=sglang SGLANG=" in capsys.readouterr().err


def test_a_report_folder_that_cannot_take_a_set_is_refused_before_any_release(
        capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(envs, "ENVS", str(tmp_path))
    bin_dir = tmp_path / "sglang" / "0.5.23" / "bin"
    bin_dir.mkdir(parents=True)
    os.symlink(sys.executable, bin_dir / "python")
    (tmp_path / "sglang" / "0.5.23" / envs.READY).touch()
    monkeypatch.setattr(releases, "run_release",
                        lambda *a: pytest.fail("a release ran before the folder was checked"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert cli.main(["releases", "ngram-filter-race", "--report-dir",
                     str(blocker / "under")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--report-dir" in err[0]


def test_a_release_without_the_scenarios_code_is_not_applicable(tmp_path, monkeypatch):
    """A release whose source lacks GrammarTree (before 0.5.17) says so, never crashes."""
    root = tmp_path / "sglang"
    (root / "srt/speculative").mkdir(parents=True)
    (root / "srt/speculative/spec_utils.py").write_text("def generate_token_bitmask(): pass\n")
    monkeypatch.setattr(type(LINE), "release_root", lambda self, v: str(root))
    row = releases.run_release(SglangEnvironments(), "sglang", "0.5.16", "grammar-ngram",
                               [], str(tmp_path / "out"))
    assert row["outcome"] == "not applicable" and "GrammarTree" in row["note"]


def _script(tmp_path, body):
    path = tmp_path / "python"
    path.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize("body, says", [
    ("print(5)", "exit 0 without a result"),
    ("print('{\"outcome\": \"race\", \"tri')", "exit 0 without a result"),
    ("print('{\"outcome\": 5, \"trials\": 1, \"reproduced\": 0}')", "without a result"),
    ("print('[1, 2]')", "without a result"),
    ("sys.exit(9)", "exit 9 without a result"),
    ("print('specrace: error: it broke', file=sys.stderr); sys.exit(2)", "it broke"),
])
def test_any_child_outcome_is_a_row(tmp_path, body, says):
    row = releases.run_release(ScriptRelease(_script(tmp_path, body)), "sglang", "9.9",
                               "ngram-filter-race", [], str(tmp_path / "out"))
    assert row["outcome"] == "error" and says in row["note"], row


def test_a_variant_the_release_refuses_is_not_driven_not_an_error(tmp_path):
    """The child's resolve refused the variant there (a configuration specrace drives on
    other releases, a patch that no longer fits): no verdict, named -- and only that
    refusal; any other usage error stays an error."""
    refused = ("print(\"specrace: error: variant 'penalties' is disabled here: no Req\", "
               "file=sys.stderr); sys.exit(2)")
    row = releases.run_release(ScriptRelease(_script(tmp_path, refused)), "sglang", "9.9",
                               "eagle-v2", [], str(tmp_path / "out"))
    assert row["outcome"] == "not driven" and "no Req" in row["note"], row
    crashed = refused.replace("sys.exit(2)", "sys.exit(1)")
    row = releases.run_release(ScriptRelease(_script(tmp_path, crashed)), "sglang", "9.9",
                               "eagle-v2", [], str(tmp_path / "out"))
    assert row["outcome"] == "error", row


def test_a_lost_interpreter_is_a_row_and_the_next_release_still_runs(tmp_path):
    ok = _script(tmp_path, 'print(\'{"outcome": "clean", "trials": 1, "reproduced": 0}\')')

    class TwoReleases(ScriptRelease):
        def python(self, version):
            return str(tmp_path / "gone" / "python") if version == "1.0" else ok
    rows = releases.run_releases(TwoReleases(ok), "sglang", "ngram-filter-race", [],
                                 str(tmp_path / "out"), ["1.0", "2.0"])
    assert rows[0]["outcome"] == "error" and "cannot run" in rows[0]["note"]
    assert rows[1]["outcome"] == "clean" and rows[1]["trials"] == 1


def test_the_table_lists_every_row():
    rows = [{"release": "0.5.17", "war_barrier": "coarse", "outcome": "clean", "trials": 5,
             "reproduced": 0, "race_sites": 0, "report": "r.md", "note": ""},
            {"release": "0.5.16", "war_barrier": None, "outcome": "not applicable",
             "trials": None, "reproduced": None, "race_sites": None, "report": None,
             "note": "the release has no GrammarTree.from_device"}]
    text = releases.format_table("sglang", "grammar-ngram", rows)
    assert "0.5.17" in text and "0/5" in text and "not applicable" in text


def test_one_set_up_release_prints_its_row(capsys, tmp_path):
    """The whole path, on the newest release set up here (CI builds them all)."""
    have = LINE.installed()
    if not have:
        pytest.skip("no release environment here (make upstream SGLANG=VERSION)")
    v = have[-1]
    assert cli.main(["releases", "ngram-filter-race", "--release", v, "--trials", "1",
                     "--expect", "clean", "--report-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert v in out and "clean" in out and "report.md" in out


@pytest.mark.parametrize("first, races, says", [
    ({"kind": "crash", "where": "reference"}, [], "crash (reference)"),
    ({"kind": "crash", "where": "trial"}, [], "crash"),
    ({"kind": "deadlock", "where": "trial"}, [], "deadlock"),
    ({"kind": "crash", "where": "trial"}, [{"summary": "WAR"}], "race"),
    ({"kind": "accept_lens", "where": "draft prep"}, [], "race"),
])
def test_a_crash_is_not_labelled_a_race(first, races, says):
    """A release whose run (or reference run) only crashed says so: a crash is not the
    race a gate may expect, and a row must not pass for one."""
    assert releases._outcome({"outcome": "race", "first_divergence": first,
                              "races": races}) == says
    assert releases._outcome({"outcome": "clean", "first_divergence": None,
                              "races": []}) == "clean"


def _fake_release(tmp_path, files):
    root = tmp_path / "sglang"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_release_whose_copy_runs_on_the_forward_stream_has_no_hidden_readback(
        tmp_path, monkeypatch):
    """0.5.14 copies the result on the forward stream: the hidden-states readback race
    needs the leaf copy stream (0.5.15 on), so the row says not applicable, and why."""
    root = _fake_release(tmp_path, {"srt/managers/scheduler.py":
                                    "class Scheduler:\n    def run_batch(self):\n"
                                    "        batch_result.copy_to_cpu()\n"})
    monkeypatch.setattr(type(LINE), "release_root", lambda self, v: str(root))
    row = releases.run_release(SglangEnvironments(), "sglang", "0.5.14",
                               "ngram-hidden-readback", [], str(tmp_path / "out"))
    assert row["outcome"] == "not applicable" and "forward stream" in row["note"]


def test_code_that_is_there_but_not_drivable_is_not_driven_not_absent(tmp_path,
                                                                       monkeypatch):
    """DSpark's code in a release without the runtime-context API specrace's slice builds
    its config with: "not driven" (the code is there), never "not applicable"."""
    root = _fake_release(tmp_path, {
        "srt/speculative/dspark_components/dspark_planner.py":
            "class DSparkVerifyPlanner:\n    def prepare_verify_budget(self): pass\n",
        "srt/managers/overlap_utils.py":
            "class ConfidenceRelay:\n    def issue_ring_copy(self): pass\n",
        "srt/speculative/draft_worker_common.py": "def make_draft_input_v2(): pass\n",
        "srt/managers/scheduler.py": "class Scheduler:\n    def _copy_result_to_cpu(self):\n"
                                     "        self.copy_stream.wait_stream(self.forward_stream)\n"})
    monkeypatch.setattr(type(LINE), "release_root", lambda self, v: str(root))
    envs_ = SglangEnvironments()
    assert envs_.not_applicable("0.5.18", "dspark-confidence-ring") == ""
    row = releases.run_release(envs_, "sglang", "0.5.18", "dspark-confidence-ring", [],
                               str(tmp_path / "out"))
    assert row["outcome"] == "not driven" and "runtime_context.use_context" in row["note"]
