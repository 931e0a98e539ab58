"""A pytest plugin for ``test_cuda_suite_runnable.py``: loaded (``-p cuda_collect_plugin``)
into a ``--collect-only --specrace-backend cuda`` run of the suite, it reads each collected
test's own source -- its function and the module-level helpers that function names -- and
writes to ``$SPECRACE_CUDA_COLLECT_OUT`` the tests that could not run on a GPU machine:

* ``console``: it spawns specrace's console as if pip-installed (``specrace`` on PATH, the
  venv's ``bin/specrace``, ``shutil.which("specrace")``), with neither a skip nor a
  fallback for where it is not -- the GPU runs the suite from the source tree
  (``sys.executable -m specrace.cli`` is how a test starts specrace there);
* ``policy``: it takes the session's backend (``specrace_backend`` / ``scenario_runner``)
  and hands a schedule policy to a run on it, with no guard on the backend -- a CUDA run
  has none (``harness.run.Run``: "a simulator run has a policy, a CUDA run none").

The reading is of the source (``ast``), so it is cheap: no test runs.
"""
from __future__ import annotations

import ast
import inspect
import json
import os
import textwrap

SPAWNS = {"run", "Popen", "check_output", "check_call", "call"}
BACKEND_FIXTURES = ("specrace_backend", "scenario_runner")


def _source(node) -> str:
    return ast.unparse(node)


def console_uses(tree: ast.AST) -> list:
    """The calls with which ``tree`` reaches for the installed console script."""
    found = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        f = n.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        args = [a for a in n.args if isinstance(a, ast.Constant)]
        # os.path.join(<dir of the interpreter>, "specrace") / shutil.which("specrace")
        if name in ("join", "which") and args and args[-1].value == "specrace":
            found.append(_source(n)[:160])
        # subprocess.run(["specrace", ...]) / ("specrace ..." with shell=True)
        elif name in SPAWNS and n.args:
            first = n.args[0]
            if isinstance(first, (ast.List, ast.Tuple)) and first.elts and \
                    isinstance(first.elts[0], ast.Constant) and first.elts[0].value == "specrace":
                found.append(_source(n)[:160])
            elif isinstance(first, ast.Constant) and isinstance(first.value, str) and \
                    (first.value.startswith("specrace ") or "bin/specrace" in first.value):
                found.append(_source(n)[:160])
    return found


def policy_uses(tree: ast.AST) -> list:
    """The calls handing a run a schedule policy: ``policy=<not None>`` or ``parse_policy(...)``
    in a call that does not pin ``backend="sim"``."""
    found = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        kw = {k.arg: k.value for k in n.keywords if k.arg}
        sim = isinstance(kw.get("backend"), ast.Constant) and kw["backend"].value == "sim"
        pol = kw.get("policy")
        if pol is not None and not (isinstance(pol, ast.Constant) and pol.value is None) \
                and not sim:
            found.append(_source(n)[:160])
    return found


def guarded(tree: ast.AST, fixture: str) -> bool:
    """Does the code look at the backend before it runs (a comparison with, or an
    ``if`` on, the fixture's value), or skip?"""
    for n in ast.walk(tree):
        if isinstance(n, (ast.Compare, ast.IfExp, ast.If)) and fixture in _source(
                n.test if isinstance(n, (ast.IfExp, ast.If)) else n):
            return True
        if isinstance(n, ast.Call) and _source(n.func) in ("pytest.skip", "skip"):
            return True
    return False


def console_guarded(tree: ast.AST) -> bool:
    """Does the code fall back where the console script is not there (an ``if`` on its
    existence: ``os.path.exists`` / ``os.access`` / ``isfile`` / ``which``), or skip?"""
    for n in ast.walk(tree):
        if isinstance(n, (ast.If, ast.IfExp)) and any(
                probe in _source(n.test) for probe in ("exists(", "access(", "isfile(",
                                                        "which(")):
            return True
        if isinstance(n, ast.Call) and _source(n.func) in ("pytest.skip", "skip"):
            return True
    return False


def _reachable(func, module_tree: ast.Module) -> ast.Module:
    """The test's own definition and the module-level definitions it names (one hop: a
    helper that spawns, a constant that holds the console's path)."""
    try:
        own = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return ast.Module(body=[], type_ignores=[])
    names = {n.id for n in ast.walk(own) if isinstance(n, ast.Name)}
    body = list(own.body)
    for stmt in module_tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                stmt.name in names:
            body.append(stmt)
        elif isinstance(stmt, ast.Assign) and any(getattr(t, "id", None) in names
                                                  for t in stmt.targets):
            body.append(stmt)
    return ast.Module(body=body, type_ignores=[])


def check_item(item, module_tree: ast.Module) -> list:
    func = getattr(item, "function", None)
    if func is None:
        return []
    code = _reachable(func, module_tree)
    skipped = any(True for _ in item.iter_markers("skipif")) or \
        any(True for _ in item.iter_markers("skip"))
    problems = []
    if console_uses(code) and not skipped and not console_guarded(code):
        problems.append(("console", console_uses(code)[0]))
    fixtures = [f for f in BACKEND_FIXTURES if f in getattr(item, "fixturenames", ())]
    if fixtures and policy_uses(code) and not any(guarded(code, f) for f in fixtures):
        problems.append(("policy", policy_uses(code)[0]))
    return problems


def pytest_collection_finish(session) -> None:
    trees, flagged = {}, []
    for item in session.items:
        path = str(item.path)
        if path not in trees:
            try:
                trees[path] = ast.parse(open(path).read())
            except (OSError, SyntaxError):
                trees[path] = ast.Module(body=[], type_ignores=[])
        for kind, call in check_item(item, trees[path]):
            flagged.append({"nodeid": item.nodeid, "kind": kind, "call": call})
    out = os.environ.get("SPECRACE_CUDA_COLLECT_OUT")
    if out:
        with open(out, "w") as f:
            json.dump({"collected": len(session.items), "flagged": flagged}, f)
