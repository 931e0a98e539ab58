"""A release environment meets its release's own requirements (targets/envs.py), is swapped
in only when whole, and only folders named as supported versions are environments.

The case that broke CI: the core's newer ``transformers`` pulled in ``kernels`` 0.19,
which 0.5.17's ``transformers`` saw through the core's site-packages and could not load.
These run on this interpreter, whose installed packages stand in for what a release's
venv sees; no release environment and no network are needed."""
import dataclasses
import os
import subprocess
import sys
import zipfile

import pytest

from seams.paths import REPO_ROOT
from targets import envs, wheels
from targets.sglang.environments import LINE


def _wheel(tmp_path, requires):
    path = tmp_path / "sglang-0.0.0-py3-none-any.whl"
    meta = "Metadata-Version: 2.1\nName: sglang\nVersion: 0.0.0\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("sglang-0.0.0.dist-info/METADATA", meta)
    return str(path)


def test_requirements_keep_ranges_and_drop_extras_and_other_platforms(tmp_path):
    wheel = _wheel(tmp_path, ["kernels<0.15,>=0.14.1", "transformers==5.12.1",
                              'pytest; extra == "test"', 'pytest; python_version < "3"'])
    assert [str(r) for r in envs.release_requirements(wheel)] == [
        "kernels<0.15,>=0.14.1", "transformers==5.12.1"]


def test_unmet_names_what_a_visible_package_fails(tmp_path):
    wheel = _wheel(tmp_path, ["pytest<1", "hypothesis>=1", "no-such-package-here==1.0",
                              "torch==0.0.1"])
    gaps = envs.unmet(sys.executable, envs.release_requirements(wheel))
    # pytest is too new; hypothesis meets; a missing package and torch (KEEP_CORE) are
    # not gaps
    assert [(str(r), have) for r, have in gaps] == [("pytest<1", pytest.__version__)]


def test_a_requirement_that_stays_unmet_fails_set_up(tmp_path, monkeypatch):
    installs = []
    monkeypatch.setattr(envs, "_pip", lambda python, *args: installs.append(args))
    wheel = _wheel(tmp_path, ["pytest<1", "xgrammar==0.0.1"])
    with pytest.raises(envs.EnvError, match=r"stay unmet after 3 installs: pytest .*<1"):
        envs._meet(sys.executable, envs.release_requirements(wheel))
    # each round installs the release's own requirement; xgrammar without its dependencies
    assert installs[:2] == [("pytest<1",), ("--no-deps", "xgrammar==0.0.1")]
    assert len(installs) == 6


def test_met_requirements_install_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(envs, "_pip", lambda *a: pytest.fail(f"installed {a}"))
    wheel = _wheel(tmp_path, ["pytest>=1", "hypothesis"])
    assert envs._meet(sys.executable, envs.release_requirements(wheel)) == []


def test_a_lock_constrains_every_install_of_the_release(tmp_path, monkeypatch):
    installs = []
    monkeypatch.setattr(envs, "_pip", lambda python, *args: installs.append(args))
    wheel = _wheel(tmp_path, ["pytest<1", "xgrammar==0.0.1"])
    with pytest.raises(envs.EnvError):
        envs._meet(sys.executable, envs.release_requirements(wheel), "L.txt")
    assert installs[:2] == [("-c", "L.txt", "pytest<1"),
                            ("-c", "L.txt", "--no-deps", "xgrammar==0.0.1")]


def test_a_lock_pins_what_the_venv_holds_but_sglang(tmp_path, monkeypatch):
    """Written from a venv's own site-packages (here this interpreter's): exact pins, one
    a line, and never sglang, which goes in from its wheel."""
    line = dataclasses.replace(LINE, locks=str(tmp_path))
    monkeypatch.setattr(type(line), "require", lambda self, version: sys.executable)
    line.lock("0.5.23")
    lines = (tmp_path / "0.5.23.txt").read_text().splitlines()
    assert lines[0].startswith("# sglang 0.5.23's venv")
    pins = dict(line.split("==") for line in lines[1:])
    assert pins and "sglang" not in pins and pins["pytest"] == pytest.__version__


def _ready(folder, name, interpreter=True):
    d = folder / name
    (d / "bin").mkdir(parents=True)
    if interpreter:
        os.symlink(sys.executable, d / "bin" / "python")
    (d / envs.READY).touch()
    return d


def test_only_folders_named_as_supported_versions_are_environments(tmp_path, monkeypatch):
    monkeypatch.setattr(envs, "ENVS", str(tmp_path))
    folder = tmp_path / "sglang"
    for name in ("0.5.23", "0.5.17", "0.7.0", "v0.5.23", "notes"):
        _ready(folder, name)
    _ready(folder, "0.5.20", interpreter=False)
    (folder / "0.5.21").mkdir()  # a set-up that never finished
    (folder / (envs.STAGING + "0.5.22-x")).mkdir()  # one being built now: not a folder of note
    assert LINE.installed() == ["0.5.17", "0.5.23"]
    why = dict(LINE.skipped())
    assert set(why) == {"0.7.0", "v0.5.23", "notes", "0.5.20", "0.5.21"}
    assert "outside the supported range" in why["0.7.0"]
    assert "not named as a release" in why["v0.5.23"]
    assert "not a version" in why["notes"]
    assert "no interpreter" in why["0.5.20"] and "never finished" in why["0.5.21"]
    assert LINE.chosen([]) == ["0.5.17", "0.5.23"]  # the strays stop nothing


def test_a_failed_set_up_keeps_the_ready_environment_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(envs, "ENVS", str(tmp_path))
    old = _ready(tmp_path / "sglang", "0.5.23")
    (old / "mine").write_text("the working one")

    def broken(self, version, d):
        (tmp_path / "sglang" / os.path.basename(d) / "half").write_text("half built")
        raise envs.EnvError("set-up step failed (1): pip install ...")
    monkeypatch.setattr(envs.ReleaseLine, "_build", broken)
    with pytest.raises(envs.EnvError):
        LINE.setup("0.5.23")
    assert (old / "mine").read_text() == "the working one" and LINE.installed() == ["0.5.23"]
    with pytest.raises(envs.EnvError):
        LINE.setup("0.5.22")  # a first set-up that fails
    assert sorted(os.listdir(tmp_path / "sglang")) == ["0.5.23"]


def test_a_set_up_swaps_the_new_environment_in(tmp_path, monkeypatch):
    monkeypatch.setattr(envs, "ENVS", str(tmp_path))
    old = _ready(tmp_path / "sglang", "0.5.23")
    (old / "mine").write_text("old")

    def build(self, version, d):
        bindir = os.path.join(d, "bin")
        os.mkdir(bindir)
        os.symlink(sys.executable, os.path.join(bindir, "python"))
        return []
    monkeypatch.setattr(envs.ReleaseLine, "_build", build)
    LINE.setup("0.5.23")
    assert not (tmp_path / "sglang" / "0.5.23" / "mine").exists()
    assert LINE.installed() == ["0.5.23"] and os.listdir(tmp_path / "sglang") == ["0.5.23"]


def test_a_failed_step_is_one_short_error_not_pips_whole_output():
    with pytest.raises(envs.EnvError) as info:
        envs._run([sys.executable, "-c", "import sys; print('x' * 50 + '\\n') ; "
                   "[print(f'line {i}', file=sys.stderr) for i in range(40)]; sys.exit(3)"])
    text = str(info.value)
    assert "failed (3)" in text and "line 39" in text and "line 10" not in text
    assert len(text.splitlines()) <= 1 + wheels.PIP_TAIL_LINES


@pytest.mark.parametrize("var, value", [("SGLANG", "0.5.23; touch {marker}"),
                                         ("SGLANG", "$(touch {marker})"),
                                         ("PREFIX_RELAY", "0.5.17; touch {marker}"),
                                         ("VLLM", "$(touch {marker})"),
                                         ("VLLM_GATE", "0.17.0; touch {marker}"),
                                         ("RELEASE_TRIALS", "2; touch {marker}")])
def test_the_makefile_never_runs_a_release_string(tmp_path, var, value):
    """A release reaches the shell as a quoted variable, never as recipe text: what make
    would run holds the variable's name, not the string."""
    root = REPO_ROOT
    marker = tmp_path / "ran"
    target = {"SGLANG": "upstream", "VLLM": "upstream", "VLLM_GATE": "vllm-gate"}.get(
        var, "releases")
    out = subprocess.run(["make", "-n", "-C", root, target,
                          f"{var}={value.format(marker=marker)}"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    assert str(marker) not in out and f"${var}" in out


@pytest.mark.parametrize("var", ["SGLANG", "VLLM", "VLLM_GATE", "PREFIX_RELAY",
                                 "FIXED_RELAY", "RELEASE_TRIALS"])
@pytest.mark.parametrize("origin", ["command line", "environment"])
def test_the_makefile_never_expands_a_release_string(tmp_path, var, origin):
    """Make syntax in a release variable is text too: make would expand
    ``$(shell ...)`` wherever the variable is referenced -- exporting it to a recipe
    included -- and so run it itself. A recipe of the test's (an extra makefile) shows
    what the shell gets: the text as given, and the command never ran."""
    root = REPO_ROOT
    marker = tmp_path / "ran"
    value = f"0.5.23 $(shell touch {marker})"
    probe = tmp_path / "probe.mk"
    probe.write_text(f"specrace-probe:\n\t@printf '%s' \"$${var}\"\n")
    given = [f"{var}={value}"] if origin == "command line" else []
    env = {**os.environ, **({var: value} if origin == "environment" else {})}
    out = subprocess.run(["make", "-s", "-C", root, "-f", "Makefile", "-f", str(probe),
                          "specrace-probe", *given], capture_output=True, text=True,
                         env=env, check=True, timeout=60).stdout
    assert out == value and not marker.exists()


def _zip_wheel(path, members):
    import zipfile
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return str(path)


def test_a_python_only_install_unpacks_the_python_files_and_the_metadata(tmp_path):
    """vLLM's wheel is mostly compiled CUDA code: only its .py files and its dist-info
    (version, requirements, RECORD) go in."""
    whl = _zip_wheel(tmp_path / "pkg-1.0-py3-none-any.whl", {
        "pkg/__init__.py": "X = 1\n", "pkg/sub/mod.py": "Y = 2\n",
        "pkg/_C.abi3.so": b"\x7fELF", "pkg/data/config.json": "{}",
        "pkg-1.0.dist-info/METADATA": "Name: pkg\n", "pkg-1.0.dist-info/RECORD": ""})
    site = tmp_path / "site"
    site.mkdir()
    assert wheels.unpack_python(whl, str(site)) == 4
    found = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert found == ["pkg-1.0.dist-info/METADATA", "pkg-1.0.dist-info/RECORD",
                     "pkg/__init__.py", "pkg/sub/mod.py"]


def test_a_wheel_member_outside_its_folder_is_refused(tmp_path):
    whl = _zip_wheel(tmp_path / "evil-1.0-py3-none-any.whl", {"../escape.py": "boom\n"})
    site = tmp_path / "site"
    site.mkdir()
    with pytest.raises(envs.EnvError, match="outside its folder"):
        wheels.unpack_python(whl, str(site))
    assert not (tmp_path / "escape.py").exists()


def test_a_downloaded_wheel_is_reused(tmp_path, monkeypatch):
    monkeypatch.setattr(wheels, "DOWNLOADS", str(tmp_path))
    calls = []

    def fake_pip(cmd):
        calls.append(cmd)
        dest = cmd[cmd.index("-d") + 1]
        open(os.path.join(dest, "pkg-2.0-py3-none-any.whl"), "w").close()
    monkeypatch.setattr(wheels, "run_step", fake_pip)
    first = wheels.download("pkg", "2.0")
    second = wheels.download("pkg", "2.0")
    assert first == second and first.endswith("pkg-2.0-py3-none-any.whl") and len(calls) == 1
