"""Static reads of an upstream server's source tree: no import, nothing executed.

Every target's contract and release table read the installed package -- or any unpacked
release -- through these (``root`` is the package's folder, a module is named from its
top-level package: ``sglang.srt.managers.scheduler``, ``vllm.v1.engine.core``): where a module is, a function's
parameters, a dataclass's fields, the ``self.X`` attributes a method reads, whether a
source patch's snippets occur exactly once. Every failure is a value (``None`` or a
problem string), never an exception: a contract that crashes on an odd release is no
contract.
"""
from __future__ import annotations

import ast
import importlib.util
import os
from functools import lru_cache
from typing import Dict, FrozenSet, List, Optional, Tuple, Union

Node = Union[ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef]

# The reader's bounds: a source file larger than this, or nested deeper, is "does not
# parse" (a problem the contract names), never a RecursionError or an hour of walking.
MAX_SOURCE_BYTES = 8 << 20
MAX_DEPTH = 500


def package_root(package: str) -> Optional[str]:
    """The installed ``package``'s folder, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def module_path(root: str, module: str) -> str:
    """``sglang.srt.managers.scheduler`` -> ``ROOT/srt/managers/scheduler.py``."""
    parts = module.split(".")[1:]
    return os.path.join(root, *parts) + ".py"


@lru_cache(maxsize=64)
def _read(path: str, mtime: float) -> Union[Tuple[ast.Module, str], str]:
    """The parsed file and its text, or why there is none (one reason, said once: a file
    too deep for ``ast`` is not "missing")."""
    try:
        size = os.path.getsize(path)
        if size > MAX_SOURCE_BYTES:
            return f"is larger than the reader reads ({size} bytes > {MAX_SOURCE_BYTES})"
        with open(path, encoding="utf-8") as f:
            text = f.read()
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        return f"does not parse (line {exc.lineno}: {str(exc.msg)[:80]})"
    except UnicodeDecodeError:
        return "is not UTF-8 text"
    except (RecursionError, MemoryError):
        return f"nests deeper than the reader reads ({MAX_DEPTH} levels)"
    except (OSError, ValueError) as exc:
        return f"cannot be read ({type(exc).__name__})"
    if _depth(tree) > MAX_DEPTH:
        return f"nests deeper than the reader reads ({MAX_DEPTH} levels)"
    return tree, text


def _depth(tree: ast.AST) -> int:
    """How deep the tree nests (iteratively: the tree may be too deep to recurse)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, d + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _parsed(path: str) -> Union[Tuple[ast.Module, str], str]:
    try:
        mtime = os.path.getmtime(path)
    except OSError:
        return "is missing"
    return _read(path, mtime)


def parse(path: str) -> Optional[Tuple[ast.Module, str]]:
    got = _parsed(path)
    return got if isinstance(got, tuple) else None


def module_problem(root: str, module: str) -> str:
    """Why ``module``'s source cannot be read ("" when it can): it is missing, does not
    parse (where), is too large or too deep for the reader."""
    got = _parsed(module_path(root, module))
    return "" if isinstance(got, tuple) else f"{module} {got}"


def find(root: str, target: str) -> Tuple[Optional[ast.AST], str]:
    """The AST node of ``"module:qualname"`` and a problem string when there is none.
    The node may be any statement (an assignment where a def was expected is the
    caller's problem to name)."""
    module, _, qual = target.partition(":")
    parsed = parse(module_path(root, module))
    if parsed is None:
        return None, module_problem(root, module)
    node: ast.AST = parsed[0]
    for part in qual.split("."):
        found = None
        for stmt in getattr(node, "body", []):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if stmt.name == part:
                    found = stmt
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if any(isinstance(t, ast.Name) and t.id == part for t in targets):
                    found = stmt
        if found is None:
            return None, f"{module}.{qual} is missing"
        node = found
    return node, ""


def _arguments(root: str, target: str) -> Tuple[Optional[ast.arguments], str]:
    """The parameters of the function ``target`` names, or None and why not."""
    node, problem = find(root, target)
    if node is None:
        return None, problem
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None, f"{target.replace(':', '.')} is not a function"
    return node.args, ""


def params(root: str, target: str) -> Tuple[Optional[Tuple[str, ...]], str]:
    """A function's parameter names, in order (``self``/``cls`` included)."""
    a, problem = _arguments(root, target)
    if a is None:
        return None, problem
    names = [x.arg for x in (*a.posonlyargs, *a.args)]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    names += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return tuple(names), ""


def params_problem(root: str, target: str, expected: Tuple[str, ...]
                   ) -> Tuple[Optional[Tuple[str, ...]], str]:
    """``params`` of ``target`` and the problem with them: missing, or not starting with
    ``expected`` (the parameters a caller relies on); "" when they do."""
    got, problem = params(root, target)
    if got is not None and got[:len(expected)] != expected:
        problem = f"{target.replace(':', '.')}{got} does not start with {expected}"
    return got, problem


def dataclass_fields(root: str, target: str) -> Tuple[Optional[FrozenSet[str]], str]:
    """The annotated fields of a ``@dataclass`` class."""
    node, problem = find(root, target)
    if node is None:
        return None, problem
    if not isinstance(node, ast.ClassDef):
        return None, f"{target.replace(':', '.')} is not a class"
    names = {ast.unparse(d).split("(")[0] for d in node.decorator_list}
    if not names & {"dataclass", "dataclasses.dataclass"}:
        return None, f"{target.replace(':', '.')} is not a dataclass"
    return frozenset(s.target.id for s in node.body
                     if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)), ""


def has_module_attribute(root: str, module: str, name: str, gated: bool = False) -> bool:
    """Is ``name`` bound at the top level of ``module`` (assigned, def, class, import)?
    ``gated``: an import under a top-level ``if`` / ``try`` counts too (a kernel imported
    only on some platforms: ``if _is_cuda: from ... import k``)."""
    parsed = parse(module_path(root, module))
    if parsed is None:
        return False
    if gated and name in _gated_imports(parsed[0].body):
        return True
    for stmt in parsed[0].body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if stmt.name == name:
                return True
        for t in ast.walk(stmt) if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.If,
                                                       ast.Try)) else ():
            if isinstance(t, ast.Name) and t.id == name and isinstance(t.ctx, ast.Store):
                return True
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == name for a in stmt.names):
                return True
    return False


def _gated_imports(body) -> FrozenSet[str]:
    """The names imported in the ``if`` / ``try`` blocks of ``body``, nested ones included
    (not inside a function or class: those bind no module attribute)."""
    names, todo = set(), [s for s in body if isinstance(s, (ast.If, ast.Try))]
    while todo:
        block = todo.pop()
        for part in ("body", "orelse", "finalbody", "handlers"):
            for s in getattr(block, part, ()):
                if isinstance(s, (ast.Import, ast.ImportFrom)):
                    names.update(a.asname or a.name.split(".")[0] for a in s.names)
                elif isinstance(s, (ast.If, ast.Try, ast.ExceptHandler)):
                    todo.append(s)
    return frozenset(names)


def imported_names(root: str, module: str) -> Dict[str, str]:
    """``name -> module`` for the ``from PACKAGE.X import name`` statements of ``module``
    (PACKAGE: ``module``'s own top-level package)."""
    parsed = parse(module_path(root, module))
    if parsed is None:
        return {}
    prefix = module.split(".")[0] + "."
    out = {}
    for stmt in ast.walk(parsed[0]):
        if isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0 \
                and stmt.module.startswith(prefix):
            for a in stmt.names:
                out[a.asname or a.name] = stmt.module
    return out


def _is_self(n: ast.AST) -> bool:
    return isinstance(n, ast.Name) and n.id == "self"


def self_reads(node: ast.AST) -> Dict[str, str]:
    """``self.X`` reads in a method: X -> "call" (only ever called) or "value". A read is
    any load of ``self.X`` -- an augmented assignment (``self.X += 1``) and
    ``getattr(self, "X")`` included -- except one that follows an unconditional
    ``self.X = ...`` in the method's own top-level statements (the method set it itself:
    ``self.X = self.X or 0`` reads the caller's X before it stores)."""
    called = {id(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
    reads: Dict[str, str] = {}

    def note(attr: str, kind: str) -> None:
        if reads.get(attr) != "value":
            reads[attr] = kind

    assigned: set = set()
    for stmt in getattr(node, "body", [node]):
        for n in ast.walk(stmt):
            if isinstance(n, ast.Attribute) and _is_self(n.value) and n.attr not in assigned:
                if isinstance(n.ctx, ast.Load):
                    note(n.attr, "call" if id(n) in called else "value")
            elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Attribute) \
                    and _is_self(n.target.value) and n.target.attr not in assigned:
                note(n.target.attr, "value")
            elif _self_getattr(n) is not None and _self_getattr(n) not in assigned:
                note(_self_getattr(n), "value")
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            assigned |= {t.attr for t in targets
                         if isinstance(t, ast.Attribute) and _is_self(t.value)}
    return reads


def _self_getattr(n: ast.AST) -> Optional[str]:
    """The name read by ``getattr(self, "NAME"[, default])``, else None."""
    if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr"
            and n.args and _is_self(n.args[0]) and len(n.args) >= 2
            and isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str)):
        return n.args[1].value
    return None


def computed_self_reads(node: ast.AST) -> List[int]:
    """Lines of ``getattr(self, NAME)`` / ``setattr`` with a computed name: a read the
    reader cannot prove the target provides."""
    return [n.lineno for n in ast.walk(node)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id in ("getattr", "setattr") and len(n.args) >= 2
            and _is_self(n.args[0])
            and not (isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str))]


def calls_on(node: ast.AST, receiver: str) -> FrozenSet[str]:
    """Method names called as ``self.RECEIVER.NAME(...)`` in ``node``."""
    return frozenset(n.func.attr for n in ast.walk(node)
                     if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                     and isinstance(n.func.value, ast.Attribute)
                     and n.func.value.attr == receiver and _is_self(n.func.value.value))


def required_params(root: str, target: str) -> Tuple[Optional[Tuple[str, ...]], str]:
    """A function's parameters a caller must pass (no default; not ``*``/``**``), in
    order, keyword-only ones as ``*NAME``."""
    a, problem = _arguments(root, target)
    if a is None:
        return None, problem
    positional = [x.arg for x in (*a.posonlyargs, *a.args)]
    plain = positional[:len(positional) - len(a.defaults)]
    kwonly = ["*" + x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
    return tuple(plain + kwonly), ""


def is_function(root: str, target: str) -> str:
    """"" when ``"module:qualname"`` is a ``def`` (the last binding of the name wins, as
    at run time: a later ``Class.name = value`` at the module's top level included), else
    the problem."""
    node, problem = find(root, target)
    if node is None:
        return problem
    module, _, qual = target.partition(":")
    parsed = parse(module_path(root, module))
    rebound = [s for s in (parsed[0].body if parsed else [])
               if isinstance(s, (ast.Assign, ast.AnnAssign)) and s.lineno > node.lineno
               and any(_dotted(t) == qual for t in
                       (s.targets if isinstance(s, ast.Assign) else [s.target]))]
    if rebound or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        where = f" (rebound at line {rebound[-1].lineno})" if rebound else ""
        return f"{target.replace(':', '.')} is not a function{where}"
    return ""


def _dotted(node: ast.AST) -> str:
    """``FutureMap.stash`` for an attribute chain of names, "" for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def call_keywords(node: ast.AST, receiver: str, method: str) -> FrozenSet[str]:
    """Keyword names passed to ``RECEIVER.method(...)`` calls in ``node`` (``receiver``
    as written, e.g. ``self.model_worker``; keys stored into a ``*kwargs`` dict in the
    same function count too: ``fwd_kwargs["on_publish"] = ...``)."""
    names = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                and n.func.attr == method and ast.unparse(n.func.value) == receiver:
            names |= {k.arg for k in n.keywords if k.arg}
        if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store) \
                and isinstance(n.value, ast.Name) and n.value.id.endswith("kwargs") \
                and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str):
            names.add(n.slice.value)
    return frozenset(names)


def source_of(root: str, target: str) -> Optional[str]:
    """The source text of ``"module:qualname"`` (what a source patch edits)."""
    node, _ = find(root, target)
    if node is None:
        return None
    module = target.partition(":")[0]
    parsed = parse(module_path(root, module))
    if parsed is None:
        return None
    lines = parsed[1].splitlines(keepends=True)
    start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
    return "".join(lines[start - 1:node.end_lineno])


def patch_fits(root: str, target: str, edits) -> str:
    """"" when every snippet of a source patch occurs exactly once, else the problem."""
    src = source_of(root, target)
    if src is None:
        return f"{target.replace(':', '.')} is missing"
    from seams.sourcepatch import snippet_problem
    for old, _new in edits:
        problem = snippet_problem(src, old)
        if problem:
            first = old.strip().splitlines()[0] if old.strip() else old
            return f"a snippet does not fit {target.replace(':', '.')} ({problem}): {first[:60]!r}"
    return ""
