"""What specrace runs, and how its processes hand work to each other (``seams.children``):

* only the installed project and the code under test are imported, whatever the working
  directory holds (a ``./specrace/cli.py`` and a ``./shlex.py`` that print a marker never
  run: not in the console's hash-seed re-exec, not in replay's hand-off to a release);
* a replay hands off to a release's environment at most once, versions compared parsed
  (``v0.17.0`` is 0.17.0; an environment whose metadata disagrees with its folder name
  is refused, exit 2, never a chain of interpreters);
* every child gets ``PYTHONHASHSEED=0`` whatever its parent had;
* ``releases`` checks ``--load`` / ``--platform`` before any release runs, and counts a
  child's result only when every field it reads has its type."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from types import SimpleNamespace

import pytest

from scenarios.registry import get
from seams import children
from seams.paths import REPO_ROOT
from specrace import replay
from targets import releases
from specrace_process import ScriptRelease

CONSOLE = os.path.join(os.path.dirname(sys.executable), "specrace")
VLLM_REPORT = os.path.join(REPO_ROOT, "reports", "upstream", "vllm", "vllm-seq-lens-shadow-"
                           "vllm-0.17.0-as-installed-sim-eager-stallauto-t3-seed0-"
                           "b7a2fdb519", "report.json")


def _vllm_017():
    from targets.vllm.environments import LINE
    return "0.17.0" in LINE.installed()


needs_vllm = pytest.mark.skipif(not _vllm_017(), reason="vllm 0.17.0 is not set up here "
                                "(make upstream TARGET=vllm VLLM=0.17.0)")


@pytest.fixture
def hostile(tmp_path):
    """A working directory whose ``specrace/cli.py`` and ``shlex.py`` print a marker."""
    d = tmp_path / "checkout"
    (d / "specrace").mkdir(parents=True)
    (d / "specrace" / "__init__.py").write_text("")
    (d / "specrace" / "cli.py").write_text("print('MARKER: ./specrace/cli.py ran')\n"
                                           "raise SystemExit(0)\n")
    (d / "shlex.py").write_text("print('MARKER: ./shlex.py ran')\n")
    return d


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONHASHSEED", "PYTHONPATH", children.HOP)}
    env.update(extra)
    return env


@pytest.mark.skipif(not os.access(CONSOLE, os.X_OK), reason="specrace is not installed "
                    "(its console script is what a user runs)")
def test_a_replay_from_a_hostile_working_directory_gives_the_real_verdict(tmp_path, hostile):
    """Started under another hash seed, the console re-executes itself: as the command it
    was started with, never ``python -m`` (which put the working directory first)."""
    p = subprocess.run([CONSOLE, "repro", "ngram-filter-race", "--backend", "sim",
                        "--trials", "1", "--report-dir", str(tmp_path / "r")],
                       capture_output=True, text=True, cwd=REPO_ROOT, env=_env(), timeout=300)
    assert p.returncode == 0, p.stderr[-400:]
    (folder,) = os.listdir(tmp_path / "r")
    report = str(tmp_path / "r" / folder / "report.json")
    p = subprocess.run([CONSOLE, "replay", report], capture_output=True, text=True,
                       cwd=hostile, env=_env(PYTHONHASHSEED="random"), timeout=300)
    assert "MARKER" not in p.stdout + p.stderr
    assert p.returncode == 0 and "identical verdict" in p.stdout, p.stdout + p.stderr


@needs_vllm
def test_replays_hand_off_once_and_never_run_the_working_directory(tmp_path, hostile):
    """An environment whose metadata says 0.17.1 in the folder of 0.17.0 (a dist-info
    first on the path): the replay hands the report to that environment once; there the
    release still differs, and the child refuses (exit 2, one line) instead of handing
    it on -- and neither process runs the working directory's files."""
    fake = tmp_path / "site" / "vllm-0.17.1.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.17.1\n")
    p = subprocess.run([CONSOLE, "replay", VLLM_REPORT], capture_output=True, text=True,
                       cwd=hostile, timeout=300,
                       env=_env(PYTHONPATH=str(tmp_path / "site")))
    out = p.stdout + p.stderr
    assert "MARKER" not in out
    assert p.returncode == 2 and out.count("specrace: replaying in") == 1, out
    assert "one hop at most" in out and "Traceback" not in out, out


@needs_vllm
def test_a_report_spelling_its_release_v0_17_0_replays_once(tmp_path):
    with open(VLLM_REPORT, encoding="utf-8") as f:
        doc = json.load(f)
    doc["target_info"]["vllm_version"] = "v0.17.0"
    path = tmp_path / "report.json"
    path.write_text(json.dumps(doc))
    p = subprocess.run([sys.executable, "-m", "specrace.cli", "replay", str(path)],
                       capture_output=True, text=True, cwd=REPO_ROOT, timeout=600,
                       env=_env())
    out = p.stdout + p.stderr
    # one hop, and a verdict: different (the spelling is not the release's), or refused
    assert out.count("specrace: replaying in") == 1, out
    assert p.returncode in (1, 2) and "Traceback" not in out, out


def _loaded(target: str, version: str):
    """What release_python reads of a report recorded on ``target`` ``version``."""
    return SimpleNamespace(result=SimpleNamespace(
        target=target, target_info={f"{target}_version": version}))


@pytest.mark.parametrize("spelled", ["0.17.0", "0.17.00", "v0.17.0", "V0.17.0"])
def test_a_release_spelled_otherwise_is_the_release(monkeypatch, spelled):
    import targets
    monkeypatch.setattr(targets.declared("vllm").__class__, "installed_version",
                        lambda self: "0.17.0")
    assert replay.release_python(_loaded("vllm", spelled)) is None  # no hand-off at all


def test_a_handed_off_replay_never_hands_on(monkeypatch):
    import targets
    monkeypatch.setattr(targets.declared("vllm").__class__, "installed_version",
                        lambda self: "0.17.1")
    monkeypatch.setenv(children.HOP, "0.17.0")
    with pytest.raises(ValueError, match="one hop at most"):
        replay.release_python(_loaded("vllm", "0.17.0"))


def _script(tmp_path, body):
    path = tmp_path / "python"
    path.write_text(f"#!{sys.executable}\nimport json, os, sys\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_a_hand_off_is_marked_seeded_and_keeps_the_working_directory_off(tmp_path,
                                                                          monkeypatch):
    """The child sees -P, the hop marker and a sane seed, whatever this process had."""
    monkeypatch.setenv("PYTHONHASHSEED", "junk")
    monkeypatch.delenv(children.HOP, raising=False)
    script = _script(tmp_path, "ok = (sys.argv[1:4] == ['-P', '-m', 'specrace.cli'] or "
                               "sys.version_info < (3, 11)) and "
                               "os.environ['PYTHONHASHSEED'] == '0' and "
                               "os.environ.get('SPECRACE_RELEASE_HOP') == 'envdir'\n"
                               "sys.exit(0 if ok else 7)")
    os.makedirs(tmp_path / "envdir" / "bin")
    python = str(tmp_path / "envdir" / "bin" / "python")
    shutil.copy(script, python)
    assert replay.hand_off(python, ["replay", "r.json"]) == 0


def test_a_release_child_runs_under_hash_seed_0_whatever_its_parent_had(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "junk")  # would stop the child's interpreter
    script = _script(tmp_path, "seed = os.environ['PYTHONHASHSEED']\n"
                               "print(json.dumps({'outcome': 'clean' if seed == '0' else "
                               "'race', 'trials': 1, 'reproduced': 0}))")
    row = releases.run_release(ScriptRelease(script), "sglang", "9.9", "ngram-filter-race", [],
                               str(tmp_path / "out"))
    assert row["outcome"] == "clean", row


@pytest.mark.parametrize("result, says", [
    ({"outcome": "race", "trials": "3", "reproduced": 1}, "trials"),
    ({"outcome": "race", "trials": 2, "reproduced": 5}, "5 of 2"),
    ({"outcome": "race", "trials": 2, "reproduced": 1, "races": "three"}, "races"),
    ({"outcome": "sometimes", "trials": 2, "reproduced": 1}, "outcome"),
    ({"outcome": "clean", "trials": 2, "reproduced": 0, "report_files": {"markdown": 5}},
     "markdown"),
    ({"outcome": "race", "trials": 2, "reproduced": 1, "first_divergence": "a string"},
     "first_divergence"),
])
def test_a_child_result_of_the_wrong_types_is_not_counted(tmp_path, result, says):
    script = _script(tmp_path, f"print(json.dumps({result!r}))")
    row = releases.run_release(ScriptRelease(script), "sglang", "9.9", "ngram-filter-race", [],
                               str(tmp_path / "out"))
    assert row["outcome"] == "error" and row["trials"] is None, row
    assert says in row["note"], row


def _args(**kw):
    base = dict(variant=None, seed=0, war_barrier=None, trials=None, expect=None,
                load=None, platform=None, target="sglang")
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("kw, says", [
    ({"load": "no-such-load"}, "unknown load"),
    ({"target": "vllm", "platform": "rocm"}, "reads its code as cuda"),
])
def test_releases_refuses_a_bad_load_or_platform_before_any_release_runs(kw, says):
    scenario = get("vllm-seq-lens-shadow" if kw.get("target") == "vllm"
                   else "ngram-filter-race")
    with pytest.raises(ValueError, match=says):
        releases.repro_options(scenario, _args(**kw))


def test_a_good_load_and_platform_pass_on_to_the_child():
    options = releases.repro_options(get("ngram-filter-race"),
                                     _args(load="bulk-d2h", platform="rocm"))
    assert options[-4:] == ["--load", "bulk-d2h", "--platform", "rocm"]
