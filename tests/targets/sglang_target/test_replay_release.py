"""A report recorded on one sglang release replays on that release -- in its own
environment when this interpreter imports another -- or is refused (exit 2) when that
release is not set up here; never re-run on another release and compared with it."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specrace import cli
from targets import envs
from targets.sglang.boundary import contract
from targets.sglang.environments import LINE

try:
    contract.installed_version()
except LookupError:
    pytest.skip("sglang is not installed (make upstream)", allow_module_level=True)


@pytest.fixture(scope="module")
def sglang_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("sglang-report")
    assert cli.main(["repro", "ngram-filter-race", "--target", "sglang", "--trials", "1",
                     "--backend", "sim", "--report-dir", str(out)]) == 0
    return next(out.glob("*/report.json"))


def _as_release(path, tmp_path, version):
    doc = json.loads(path.read_text())
    doc["target_info"]["sglang_version"] = version
    edited = tmp_path / "report.json"
    edited.write_text(json.dumps(doc))
    return edited


def test_a_release_not_set_up_is_refused_before_any_trial(sglang_report, tmp_path,
                                                          monkeypatch, capsys):
    monkeypatch.setattr(envs, "ENVS", str(tmp_path / "none"))
    edited = _as_release(sglang_report, tmp_path, "0.5.19")
    assert cli.main(["replay", str(edited)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "recorded on sglang 0.5.19" in err[0]
    assert "not set up here" in err[0] and "SGLANG=0.5.19" in err[0]


def test_the_interpreters_own_release_replays_here(sglang_report, capsys):
    assert cli.main(["replay", str(sglang_report)]) == 0
    captured = capsys.readouterr()
    assert "identical verdict" in captured.out and "replaying in" not in captured.err


def test_a_release_report_replays_in_that_releases_environment(tmp_path):
    """The whole path: 0.5.17's report (from ``specrace releases``), replayed by the core
    interpreter (another sglang), runs in .releases/sglang/0.5.17 and is identical."""
    if "0.5.17" not in LINE.installed():
        pytest.skip("sglang 0.5.17 is not set up here (make upstream SGLANG=0.5.17)")
    assert cli.main(["releases", "ngram-filter-race", "--release", "0.5.17", "--trials",
                     "1", "--report-dir", str(tmp_path)]) == 0
    report = next(tmp_path.glob("0.5.17/*/report.json"))
    proc = subprocess.run([sys.executable, "-m", "specrace.cli", "replay", str(report)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-600:]
    assert "replaying in" in proc.stderr and "0.5.17" in proc.stderr
    assert "identical verdict" in proc.stdout
