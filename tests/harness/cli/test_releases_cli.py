"""`specrace releases`: bad input is one line and exit 2 (no release environment needed)."""
import pytest

from specrace import cli


@pytest.mark.parametrize("release, says", [
    ("0.4.0", "outside the supported range"),
    ("0.6.1", "outside the supported range"),
    ("not-a-version", "is not a version number"),
    ("0.5.20", "not set up here"),
])
def test_a_bad_release_is_one_line_and_exit_2(release, says, capsys, monkeypatch):
    from targets.sglang.environments import envs
    monkeypatch.setattr(envs, "installed", lambda: [])
    assert cli.main(["releases", "ngram-filter-race", "--release", release]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_no_release_set_up_is_exit_2(capsys, monkeypatch):
    from targets.sglang.environments import envs
    monkeypatch.setattr(envs, "installed", lambda: [])
    assert cli.main(["releases", "ngram-filter-race"]) == 2
    assert "make upstream SGLANG=" in capsys.readouterr().err


def test_a_release_without_the_scenarios_code_is_not_applicable(tmp_path, monkeypatch):
    """A release whose source lacks GrammarTree (before 0.5.17) says so, never crashes."""
    from targets.sglang.environments import releases
    root = tmp_path / "sglang"
    (root / "srt/speculative").mkdir(parents=True)
    (root / "srt/speculative/spec_utils.py").write_text("def generate_token_bitmask(): pass\n")
    monkeypatch.setattr(releases, "release_root", lambda v: str(root))
    row = releases.run_release("0.5.16", "grammar-ngram", [], str(tmp_path / "out"))
    assert row["outcome"] == "not applicable" and "GrammarTree" in row["note"]


def test_the_table_lists_every_row():
    from targets.sglang.environments.releases import format_table
    rows = [{"release": "0.5.17", "war_barrier": "coarse", "outcome": "clean", "trials": 5,
             "reproduced": 0, "race_sites": 0, "report": "r.md", "note": ""},
            {"release": "0.5.16", "war_barrier": None, "outcome": "not applicable",
             "trials": None, "reproduced": None, "race_sites": None, "report": None,
             "note": "the release has no GrammarTree.from_device"}]
    text = format_table("grammar-ngram", rows)
    assert "0.5.17" in text and "0/5" in text and "not applicable" in text


def test_one_set_up_release_prints_its_row(capsys, tmp_path):
    """The whole path, on the newest release set up here (CI builds three)."""
    from targets.sglang.environments import envs
    have = envs.installed()
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
    from targets.sglang.environments.releases import _outcome
    assert _outcome({"outcome": "race", "first_divergence": first, "races": races}) == says
    assert _outcome({"outcome": "clean", "first_divergence": None, "races": []}) == "clean"
