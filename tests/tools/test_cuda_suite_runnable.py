"""The CUDA suite stays runnable on a GPU machine, checked here on the CPU (issue 54):

* the suite collected with ``--specrace-backend cuda`` (``--collect-only`` in a
  subprocess: nothing runs) has no test that spawns specrace's console as if
  pip-installed, or that hands a schedule policy to a CUDA run (``cuda_collect_plugin``);
* every subprocess a test starts runs under a deadline (``timeout=``; a ``Popen`` is
  waited on with one), so a hang on a GPU fails its test, named (``TimeoutExpired``
  carries the command), instead of stalling the run.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# Collecting ~2,000 tests imports every test module (sglang's among them): well under
# two minutes here; the deadline is for a hang, and names the collection.
COLLECT_DEADLINE_S = 600
SPAWNS = {"run", "Popen", "check_output", "check_call", "call"}


def _collect(tmp_path, *paths, rootdir=ROOT):
    out = tmp_path / "collected.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    # the plugin and the repo first; then what this process was given (a GPU machine
    # finds its site bundle there)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env["SPECRACE_CUDA_COLLECT_OUT"] = str(out)
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
           "-p", "no:xdist", "-p", "cuda_collect_plugin", "--specrace-backend", "cuda",
           "--rootdir", str(rootdir), *map(str, paths)]
    try:
        r = subprocess.run(cmd, cwd=str(rootdir), env=env, capture_output=True, text=True,
                           timeout=COLLECT_DEADLINE_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pytest --collect-only --specrace-backend cuda ran past "
                    f"{COLLECT_DEADLINE_S} s")
    assert r.returncode == 0 and out.exists(), (r.stdout + r.stderr)[-3000:]
    return json.loads(out.read_text())


@pytest.mark.long
def test_the_suite_collected_for_cuda_spawns_no_installed_console_and_needs_no_policy(tmp_path):
    got = _collect(tmp_path, ROOT / "tests")
    assert got["collected"] > 1000  # the whole suite, not an empty collection
    assert got["flagged"] == [], "\n".join(
        f"{f['nodeid']}: {f['kind']}: {f['call']}" for f in got["flagged"])


def test_the_check_flags_a_console_spawn_and_an_unguarded_policy(tmp_path):
    """Not vacuous: a console spawn and a policy on the session's backend are flagged;
    the guarded and the sim-pinned forms are not."""
    (tmp_path / "conftest.py").write_text(  # as tests/conftest.py: once, however loaded
        "import sys\nif 'specrace.pytest_plugin' not in sys.modules:\n"
        "    pytest_plugins = ['specrace.pytest_plugin']\n")
    (tmp_path / "test_synthetic.py").write_text(textwrap.dedent("""
        import os, subprocess, sys
        import pytest
        CONSOLE = os.path.join(os.path.dirname(sys.executable), "specrace")

        def test_spawns_the_installed_console():
            subprocess.run([CONSOLE, "list"], timeout=60)

        def test_spawns_specrace_on_path():
            subprocess.run(["specrace", "list"], timeout=60)

        @pytest.mark.skipif(not os.access(CONSOLE, os.X_OK), reason="not installed")
        def test_skips_where_the_console_is_not_installed():
            subprocess.run([CONSOLE, "list"], timeout=60)

        def test_falls_back_to_the_module():
            cmd = [CONSOLE] if os.path.exists(CONSOLE) else [sys.executable, "-m", "specrace.cli"]
            subprocess.run(cmd + ["list"], timeout=60)

        def test_spawns_the_module():
            subprocess.run([sys.executable, "-m", "specrace.cli", "list"], timeout=60)

        def test_policy_on_the_sessions_backend(scenario_runner):
            scenario_runner("ngram-filter-race", policy="lazy")

        def test_policy_pinned_to_the_simulator(specrace_backend):
            run(backend="sim", policy="lazy")

        def test_policy_guarded(specrace_backend):
            run(backend=specrace_backend,
                policy="lazy" if specrace_backend == "sim" else None)
    """))
    got = _collect(tmp_path, tmp_path, rootdir=tmp_path)
    flagged = {(f["nodeid"].split("::")[-1], f["kind"]) for f in got["flagged"]}
    assert flagged == {("test_spawns_the_installed_console", "console"),
                       ("test_spawns_specrace_on_path", "console"),
                       ("test_policy_on_the_sessions_backend", "policy")}


def _unbounded_spawns(tree: ast.AST):
    """``subprocess`` calls without ``timeout=``; a ``Popen`` counts as bounded where the
    function that starts it also waits on it with one (``communicate``/``wait``) -- or,
    for a helper that returns it, where its module does."""
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for n in ast.walk(tree):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and isinstance(n.func.value, ast.Name) and n.func.value.id == "subprocess"
                and n.func.attr in SPAWNS):
            continue
        if any(k.arg == "timeout" for k in n.keywords):
            continue
        if n.func.attr == "Popen":
            owner = [f for f in funcs if f.lineno <= n.lineno <= f.end_lineno][-1:]
            # a helper that returns the process leaves the wait to its callers: any in
            # the module then
            returned = any(isinstance(r, ast.Return) and r.value is n
                           for f in owner for r in ast.walk(f))
            scope = [tree] if returned else owner
            waits = any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                        and c.func.attr in ("communicate", "wait")
                        and any(k.arg == "timeout" for k in c.keywords)
                        for f in scope for c in ast.walk(f))
            if waits:
                continue
        yield n.lineno, ast.unparse(n)[:120]


def test_every_test_subprocess_runs_under_a_deadline():
    found = [f"{p.relative_to(ROOT)}:{line}: {call}"
             for p in sorted((ROOT / "tests").rglob("*.py"))
             for line, call in _unbounded_spawns(ast.parse(p.read_text()))]
    assert found == [], "\n".join(found)


def test_the_deadline_check_finds_an_unbounded_spawn():
    tree = ast.parse(textwrap.dedent("""
        import subprocess
        def a():
            subprocess.run(["x"])
        def b():
            subprocess.run(["x"], timeout=5)
        def c():
            p = subprocess.Popen(["x"])
            p.communicate(timeout=5)
        def d():
            p = subprocess.Popen(["x"])
            p.wait()
    """))
    assert [line for line, _ in _unbounded_spawns(tree)] == [4, 11]
