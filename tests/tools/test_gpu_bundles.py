"""The GPU bundles (``tools/gpu/bundle.py``): what goes in comes from the locks alone, and
a built bundle imports its target's driven path in an empty folder with nothing beside
the GPU image's set (``tools/gpu/check_bundle.py``) -- so a package a bundle lacks fails
here, on the CPU, not on a GPU run. The import checks skip only where the bundle is not
built (``make gpu-bundle-sglang`` / ``make gpu-bundle-vllm``; CI builds neither: they serve
a device call, and ``make gpu-bundles gpu-check`` runs before one, docs/gpus.md).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
import bundle  # noqa: E402
import check_bundle  # noqa: E402

IMAGE_PYTHON = Path(check_bundle.IMAGE_PYTHON)
_ON_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
# The import of sglang's driven path and one trial per family, in a fresh process each:
# about a minute here per bundle; the deadline is for a hang, and names the check.
CHECK_DEADLINE_S = 1500


def _locked(target):
    return sorted((p.stem for p in Path(bundle.TARGETS[target]["locks"]).glob("*.txt")),
                  key=bundle.Version)


@pytest.mark.parametrize("target", sorted(bundle.TARGETS))
def test_every_locked_release_selects_from_the_locks_alone(target):
    for version in _locked(target):
        held, left = bundle.selection(target, version)
        assert held[target]["pin"] == f"{target}=={version}"
        for name, h in held.items():
            assert h["pin"].count("==") == 1 and h["from"], (version, name, h)
        assert not set(held) & set(left), version


def test_sglang_0_5_23_carries_its_own_transformers_over_the_images():
    held, left = bundle.selection("sglang", "0.5.23")
    assert held["transformers"]["pin"] == "transformers==5.19.0"
    assert held["transformers"]["over_image"] == "5.17.0"
    # the release's lock pins the image's own version: the image's serves
    assert "huggingface-hub" in left and "huggingface-hub" not in held
    assert held["openai"]["pin"] == "openai==2.8.0"  # the lock's, never the newest


def test_vllm_0_17_0_carries_llguidance_and_the_locked_openai():
    held, left = bundle.selection("vllm", "0.17.0")
    # 0.17.0's import chain reaches llguidance at class definition
    # (v1/structured_output/backend_guidance.py)
    assert held["llguidance"]["pin"] == "llguidance==1.3.0"
    assert held["openai"]["pin"] == "openai==2.8.0"
    assert held["transformers"]["pin"] == "transformers==4.57.6"
    # the core's xgrammar over the release's (vLLM's xgrammar backend is not driven)
    assert held["xgrammar"]["pin"].startswith("xgrammar==0.2.")
    assert "over_release" in held["xgrammar"]
    assert "uvloop" in left and "torch" not in held


@pytest.mark.parametrize("argv", [["sglang"], ["tensorrt", "1.0"], ["sglang", "0.5.x"],
                                  ["sglang", "0.4.0"], ["vllm", "not a version"]])
def test_bad_input_is_one_line_and_exit_2(argv, capsys):
    assert bundle.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err and "Traceback" not in err


def test_a_missing_lock_names_the_locked_releases():
    with pytest.raises(bundle.BundleError, match=r"no lock .* locked: .*0\.5\.23"):
        bundle.selection("sglang", "0.4.0")


def _image_or_skip():
    if not IMAGE_PYTHON.exists():
        pytest.skip("the GPU image's stand-in is not built (make gpu-image)")


def test_the_check_fails_a_bundle_that_lacks_its_server(tmp_path):
    """The check is not vacuous: a bundle with nothing in it fails, naming the import."""
    _image_or_skip()
    empty = tmp_path / "site"
    empty.mkdir()
    with tarfile.open(tmp_path / "site.tar.xz", "w:xz") as tar:
        tar.add(empty, ".")
    (tmp_path / "MANIFEST.json").write_text(json.dumps(
        {"target": "sglang", "version": "0.5.23", "python": "3.12"}))
    r = subprocess.run([sys.executable, str(ROOT / "tools/gpu/check_bundle.py"),
                        str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stderr[-800:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert any("sglang" in why for _, why in out["failures"]), out["failures"]


@pytest.mark.parametrize("folder", [".sgbundle", ".vllmgpu"])
def test_a_built_bundle_imports_its_driven_path_beside_the_image_alone(folder):
    manifest = ROOT / folder / "MANIFEST.json"
    if not manifest.exists():
        pytest.skip(f"{folder} is not built by make (no MANIFEST.json): "
                    f"make gpu-bundle-{'sglang' if folder == '.sgbundle' else 'vllm'}")
    if not IMAGE_PYTHON.exists():
        # `make gpu-bundles` builds it beside the bundles; a GPU machine carries a bundle
        # without it (it is the image itself there)
        assert not _ON_CI, "a bundle is built but the image stand-in is not: make gpu-image"
        pytest.skip("the GPU image's stand-in is not built here (make gpu-image)")
    m = json.loads(manifest.read_text())
    # it travels with the tree in one call: 64 MiB together
    assert m["bytes"] + bundle.tree_bytes() <= bundle.CARRY_LIMIT
    try:
        r = subprocess.run([sys.executable, str(ROOT / "tools/gpu/check_bundle.py"),
                            str(ROOT / folder), "--trial"], capture_output=True, text=True,
                           timeout=CHECK_DEADLINE_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"check_bundle.py {folder} --trial ran past {CHECK_DEADLINE_S} s")
    assert r.stdout.strip(), r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["failures"] == [] and out["outside"] == [], out
    assert out["python"].startswith(m["python"])
    assert m["target"] in out["bundle_tops_used"]  # the server came from the bundle
    assert out["driven"] and all(out["driven"].values()), out["driven"]
    assert out["by_origin"]["bundle"] > 100 and out["upstream_named"] > 10, out
    assert [t["rc"] for t in out["trials"]] == [0] * len(check_bundle.TRIALS[m["target"]])
    assert r.returncode == 0
