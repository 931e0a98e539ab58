"""The standalone repro scripts under reports/upstream/findings/ (torch and sglang only,
no specrace) still name upstream code the installed release has: each script's
``UPSTREAM_NAMES`` are found in the installed source, as a ``def`` -- so a release that
moves the racing pair breaks this test, not a maintainer's reading of the script."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from targets import static

FINDINGS = Path(__file__).resolve().parents[2] / "reports" / "upstream" / "findings"
SCRIPTS = sorted(FINDINGS.glob("repro_*.py"))
ROOT = static.package_root("sglang")


def _names(script: Path):
    tree = ast.parse(script.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "UPSTREAM_NAMES"
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def test_there_are_repro_scripts():
    assert SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_repro_imports_only_torch_and_sglang(script):
    tree = ast.parse(script.read_text())
    tops = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
            for a in n.names}
    tops |= {n.module.split(".")[0] for n in ast.walk(tree)
             if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}
    stdlib = {"__future__", "importlib", "json", "sys", "threading", "types", "time",
              "statistics"}
    assert tops - stdlib <= {"torch", "sglang"}, tops - stdlib


@pytest.mark.skipif(ROOT is None, reason="sglang is not installed (make upstream)")
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_repros_upstream_names_exist_in_the_installed_release(script):
    names = _names(script)
    assert names, f"{script.name} declares no UPSTREAM_NAMES"
    for target in names:
        assert static.is_function(ROOT, target) == "", target
