"""An installed server whose ``.dist-info`` has no ``METADATA`` (or no Version in it) has
no version to check: one line and exit 2, on every target -- never a ``TypeError``
traceback from the contract reading ``None`` as a version."""
from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

import pytest

from seams.paths import REPO_ROOT
from targets import tiers


@pytest.mark.parametrize("version", [None, "", "  "])
def test_a_version_the_metadata_does_not_name_is_a_metadata_error(monkeypatch, version):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: version)
    with pytest.raises(tiers.MetadataError, match="names no version"):
        tiers.installed_version("vllm")


def _python(target):
    if target == "sglang":
        return sys.executable
    from targets.vllm.environments import LINE
    return LINE.env_python("0.17.0") if "0.17.0" in LINE.installed() else None


@pytest.mark.parametrize("target", ["sglang", "vllm"])
def test_an_install_without_metadata_is_one_line_and_exit_2(tmp_path, target):
    python = _python(target)
    if python is None or (target == "sglang" and tiers_missing("sglang")):
        pytest.skip(f"{target} is not set up here")
    # a dist-info first on the path, its RECORD only: what a half-copied install leaves
    info = tmp_path / f"{target}-0.0.1.dist-info"
    info.mkdir()
    (info / "RECORD").write_text("")
    p = subprocess.run([python, "-P", "-m", "specrace.cli", "list", "--target", target],
                       capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
                       # the dist-info first; then the given path (a GPU machine finds its
                       # site bundle there) and the repo, for a checkout not installed
                       env={**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": os.pathsep.join(
                           p for p in (str(tmp_path), os.environ.get("PYTHONPATH", ""),
                                       REPO_ROOT) if p)})
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1, p.stderr[-800:]
    assert "names no version" in err[0] and "Traceback" not in p.stderr


def tiers_missing(package: str) -> bool:
    try:
        tiers.installed_version(package)
    except LookupError:
        return True
    return False
