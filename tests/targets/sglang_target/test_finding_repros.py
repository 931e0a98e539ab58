"""The standalone repro scripts under reports/upstream/findings/ (torch and the server
only; specrace's declared stand-ins where a GPU-only package is absent): each still names
upstream code the installed release has (``UPSTREAM_NAMES`` as ``def``s,
``UPSTREAM_STATEMENTS`` as source lines), and each runs against it on the CPU
(``--device cpu``, a few trials: the same upstream calls, every copy ordered) and prints
its one JSON line -- so a release that moves the racing pair, or an import the server
trips on, breaks this test rather than a GPU run."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import targets
from seams.paths import REPO_ROOT
from targets import static

FINDINGS = Path(REPO_ROOT) / "reports" / "upstream" / "findings"
SCRIPTS = sorted(FINDINGS.glob("repro_*.py"))
SUPPORT = FINDINGS / "_repro_support.py"
SGLANG_ROOT = static.package_root("sglang")
VLLM_RELEASE = "0.17.0"  # the vLLM findings' release (0.17.0-0.18.0 ship both)
# A script imports the server (sglang: ~5,000 modules) and runs 3 trials: well under a
# minute here; the deadline is for a hang, and names the script.
RUN_DEADLINE_S = 600
STDLIB = {"__future__", "argparse", "importlib", "json", "os", "sys", "threading", "types",
          "time", "statistics"}


def _server(script: Path) -> str:
    return "vllm" if script.name.startswith("repro_vllm_") else "sglang"


def _vllm_python():
    line = targets.declared("vllm").environments().line
    return line.env_python(VLLM_RELEASE) if VLLM_RELEASE in line.installed() else None


def _root_and_python(script: Path):
    if _server(script) == "sglang":
        return SGLANG_ROOT, sys.executable
    line = targets.declared("vllm").environments().line
    py = _vllm_python()
    return (line.release_root(VLLM_RELEASE) if py else None), py


def _literal(script: Path, name: str):
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def _tops(path: Path):
    tree = ast.parse(path.read_text())
    tops = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
            for a in n.names}
    tops |= {n.module.split(".")[0] for n in ast.walk(tree)
             if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}
    return tops


def test_there_are_repro_scripts_for_both_servers():
    assert {_server(s) for s in SCRIPTS} == {"sglang", "vllm"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_repro_imports_only_torch_its_server_and_the_shared_support(script):
    assert _tops(script) - STDLIB <= {"torch", _server(script), "_repro_support"}


def test_the_support_imports_only_specraces_declared_stand_ins():
    tree = ast.parse(SUPPORT.read_text())
    froms = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert {m for m in froms if m.startswith("targets")} == {
        "targets.sglang.boundary", "targets.vllm.boundary"}
    assert _tops(SUPPORT) - STDLIB <= {"torch", "targets"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_repros_upstream_names_exist_in_the_installed_release(script):
    root, _ = _root_and_python(script)
    if root is None:
        pytest.skip(f"{_server(script)} is not set up here (make upstream / make upstream "
                    f"TARGET=vllm VLLM={VLLM_RELEASE})")
    names = _literal(script, "UPSTREAM_NAMES")
    assert names, f"{script.name} declares no UPSTREAM_NAMES"
    for target in names:
        assert static.is_function(root, target) == "", target
    for rel, line in _literal(script, "UPSTREAM_STATEMENTS") or ():
        source = (Path(root).parent / rel).read_text()
        assert line in source, f"{rel} no longer has {line!r}"


def _run(python, script, *args):
    # standalone: specrace is off the path (the repo root, or "." from it); the rest of
    # the given path stays (a GPU machine finds the server in its site bundle there)
    root = os.path.realpath(targets.__file__ + "/../..")
    given = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in given if os.path.realpath(p) != root)}
    try:
        return subprocess.run([python, str(script), *args], capture_output=True, text=True,
                              timeout=RUN_DEADLINE_S, env=env, cwd=str(FINDINGS))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{script.name} {' '.join(args)} ran past {RUN_DEADLINE_S} s")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_repro_runs_on_the_cpu_against_the_installed_release(script):
    root, python = _root_and_python(script)
    if root is None:
        pytest.skip(f"{_server(script)} is not set up here")
    r = _run(python, script, "--device", "cpu", "--trials", "3")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["device"] == "cpu" and out["trials"] == 3
    assert out["upstream"] == list(_literal(script, "UPSTREAM_NAMES"))
    if "not_run" in out:  # the handler needs CUDA to be built: its methods were checked
        assert out["missing"] == [] and out["stale"] == {}
    else:  # every copy is ordered on a CPU: anything but 0 is the script's own bug
        assert out["stale"] and set(out["stale"].values()) == {"0/3"}, out


@pytest.mark.parametrize("args", [("--trials", "0"), ("--load", "nope"),
                                  ("--device", "tpu"), ("--forward-us", "-1")])
def test_bad_input_is_one_line_and_exit_2(args):
    script = FINDINGS / "repro_graph_result_readback.py"  # parse() is shared
    r = _run(sys.executable, script, *args)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
