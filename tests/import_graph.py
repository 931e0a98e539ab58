"""Module import graph of the project (static: top-level and function-level imports, and
``importlib.import_module("...")`` / ``__import__("...")`` calls with a literal name).

``python tests/import_graph.py [ROOT]`` prints the file cycles; ``import_graph`` and
``cycles`` serve ``tests/test_structure.py``.
"""
import ast
import os
import sys

PACKAGES = ("seams", "toys", "impl", "mutations", "harness", "targets", "scenarios", "litmus",
            "matrix", "specrace", "tools")


def modules(root):
    """module name -> file path, for every module of ``PACKAGES`` under ``root``."""
    mods = {}
    for d in PACKAGES:
        for dp, _, fs in os.walk(os.path.join(root, d)):
            for f in fs:
                if f.endswith(".py"):
                    p = os.path.join(dp, f)
                    m = os.path.relpath(p, root)[:-3].replace(os.sep, ".")
                    if m.endswith(".__init__"):
                        m = m[:-9]
                    mods[m] = p
    return mods


def _resolve(mods, cur, node):
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = cur.split(".")
            pkg = parts[:len(parts) - node.level + (1 if mods[cur].endswith("__init__.py") else 0)]
            base = ".".join(pkg + ([base] if base else []))
        out = [base]
        for a in node.names:
            if f"{base}.{a.name}" in mods:
                out.append(f"{base}.{a.name}")
        return out
    return [a.name for a in node.names]


# The calls that import a module named by a string: a literal name is as static as an
# import statement, and an edge the graph must see (a computed one cannot be read).
_DYNAMIC = {"import_module", "__import__"}


def _imported_by_call(node):
    """The module a call ``importlib.import_module("a.b")`` / ``__import__("a.b")`` imports,
    or None (not such a call, or its name is computed)."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in _DYNAMIC or not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value[:1] != ".":
        return arg.value
    return None


def _imports(mods, m, node):
    """The names an import statement or a literal dynamic import names."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return _resolve(mods, m, node)
    if isinstance(node, ast.Call):
        name = _imported_by_call(node)
        return [name] if name else []
    return []


def import_graph(root):
    """module -> the project modules it imports (a submodule's import of its own parent
    package is not an edge: Python runs the parent first anyway)."""
    mods = modules(root)
    graph = {}
    for m, p in mods.items():
        with open(p) as fh:
            tree = ast.parse(fh.read())
        deps = set()
        for n in ast.walk(tree):
            for t in _imports(mods, m, n):
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m and not m.startswith(t + "."):
                    deps.add(t)
        graph[m] = deps
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    idx, low, st, on, res, c = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def sc(v):
        idx[v] = low[v] = c[0]
        c[0] += 1
        st.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in idx:
                sc(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                res.append(sorted(comp))

    for v in graph:
        if v not in idx:
            sc(v)
    return res


if __name__ == "__main__":
    g = import_graph(sys.argv[1] if len(sys.argv) > 1 else ".")
    found = cycles(g)
    for r in found:
        print("cycle:", r)
    print(len(found), "cycles among", len(g), "modules")
