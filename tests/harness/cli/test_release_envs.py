"""A release environment meets its release's own requirements (targets/sglang/environments/envs.py).

The case that broke CI: the core's newer ``transformers`` pulled in ``kernels`` 0.19,
which 0.5.17's ``transformers`` saw through the core's site-packages and could not load.
These run on this interpreter, whose installed packages stand in for what a release's
venv sees; no release environment and no network are needed."""
import sys
import zipfile

import pytest

from targets.sglang.environments import envs


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
    monkeypatch.setattr(envs, "require", lambda version: sys.executable)
    monkeypatch.setattr(envs, "LOCKS", str(tmp_path))
    envs.lock("0.5.23")
    lines = (tmp_path / "0.5.23.txt").read_text().splitlines()
    assert lines[0].startswith("# sglang 0.5.23's venv")
    pins = dict(line.split("==") for line in lines[1:])
    assert pins and "sglang" not in pins and pins["pytest"] == pytest.__version__
