"""One contract discipline for every target: what a contract proves from a release's
source, before any trial, about the code the target drives.

* every driven module exists and parses (a module only some releases have -- a later
  helper, an optional path -- parses where it is there, and is missing where a driven
  module that is there imports it at its top level);
* every driven function is a ``def`` (not rebound to a value later in its module or
  class), its parameters start with the ones the target relies on, and it requires no
  parameter the target (or, for a function upstream's own code calls, upstream's caller
  as measured) does not pass;
* every driven class is a class.

A problem with a module is said once, as what it is (missing / does not parse, where / too
deep for the reader); the names in it are not listed again. Each target's contract
(``targets/sglang/boundary/contract.py``, ``targets/vllm/boundary/contract.py``) declares
its ``Surface`` -- per path it drives -- and gives these problems as its own; a release
with any is *unsupported* for that path, exit 2, every problem named. Read with
``targets.static``: nothing imported, nothing executed.
"""
from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Set, Tuple

from targets import static


@dataclass(frozen=True)
class Surface:
    """What a target drives of a release, for one path through it."""
    modules: Tuple[str, ...] = ()  # must exist and parse
    later_modules: Tuple[str, ...] = ()  # parse where present (see the module doc)
    # "module:Qual.name" -> the parameters relied on, in order (a prefix of the release's)
    functions: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    # keyword parameters relied on, beyond the prefix ("module:Qual.name" -> names)
    keywords: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    # functions called through a wrapper that passes on the rest of upstream's own
    # arguments: a parameter upstream added and passes itself needs nothing of the target
    passed_through: Tuple[str, ...] = ()
    classes: Tuple[str, ...] = ()  # "module:Qual" that must be classes
    # methods a subclass may or may not override ("module:Class.name" -> parameters):
    # checked as ``functions`` where the class binds the name, nothing where it inherits
    overrides: Dict[str, Tuple[str, ...]] = field(default_factory=dict)


def problems(root: str, surface: Surface) -> List[str]:
    """Every problem of ``surface`` in the release at ``root``, modules first."""
    out = module_problems(root, surface.modules, surface.later_modules)
    broken = {p.split(" ", 1)[0] for p in out}
    for target in surface.classes:
        if target.partition(":")[0] not in broken:
            out += _class_problem(root, target)
    for target, expected in surface.functions.items():
        if target.partition(":")[0] not in broken:
            out += function_problems(root, target, expected, surface.keywords.get(target, ()),
                                     target in surface.passed_through)
    for target, expected in surface.overrides.items():
        if target.partition(":")[0] not in broken and static.find(root, target)[0] is not None:
            out += function_problems(root, target, expected)
    return list(dict.fromkeys(out))


def module_problems(root: str, modules: Sequence[str],
                    later: Sequence[str] = ()) -> List[str]:
    """One problem per driven module that is missing or cannot be read; a ``later`` module
    only where it is there and cannot be read, or is missing and a driven module that is
    there imports it at its top level (the release has it: it was deleted)."""
    out: List[str] = []
    for module in dict.fromkeys(modules):
        problem = module_problem(root, module)
        if problem:
            out.append(problem)
    present = [m for m in dict.fromkeys((*modules, *later)) if not module_problem(root, m)]
    for module in dict.fromkeys(later):
        if module in modules:
            continue
        problem = module_problem(root, module)
        if not problem:
            continue
        if not problem.endswith(" is missing"):
            out.append(problem)
            continue
        importers = [m for m in present if module in top_level_imports(root, m)]
        if importers:
            out.append(f"{problem} (imported by {importers[0]})")
    return out


def module_problem(root: str, module: str) -> str:
    """``static.module_problem``, a package (``X/__init__.py`` where there is no ``X.py``)
    read as its ``__init__``."""
    problem = static.module_problem(root, module)
    package = os.path.join(static.module_path(root, module)[:-3], "__init__.py")
    if problem.endswith(" is missing") and os.path.isfile(package):
        inner = static.module_problem(root, f"{module}.__init__")
        return inner.replace(f"{module}.__init__", f"{module} (its __init__.py)", 1)
    return problem


def function_problems(root: str, target: str, expected: Tuple[str, ...],
                      keywords: Tuple[str, ...] = (), passed_through: bool = False
                      ) -> List[str]:
    """What is wrong with the driven function ``target`` (``[]``: nothing)."""
    problem = static.is_function(root, target)
    if problem:
        return [problem]
    got, problem = static.params_problem(root, target, expected)
    if problem or got is None:
        return [problem]
    name = target.replace(":", ".")
    out = [f"{name} takes no {kw!r}" for kw in keywords
           if kw not in got and not any(p.startswith("**") for p in got)]
    if not passed_through:
        required, _ = static.required_params(root, target)
        passed = set(expected) | {"*" + kw for kw in keywords}
        out += [f"{name} requires {p.lstrip('*')!r}, which its callers on the driven path "
                f"do not pass"
                for p in required or () if p not in passed]
    return out


def _class_problem(root: str, target: str) -> List[str]:
    node, problem = static.find(root, target)
    if node is None:
        return [problem]
    module, _, qual = target.partition(":")
    if not isinstance(node, ast.ClassDef) or _rebound(root, module, qual, node.lineno):
        return [f"{target.replace(':', '.')} is not a class"]
    return []


def _rebound(root: str, module: str, qual: str, after: int) -> bool:
    """Is ``qual`` assigned at the module's top level after line ``after``?"""
    parsed = static.parse(static.module_path(root, module))
    if parsed is None:
        return False
    for stmt in parsed[0].body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.lineno > after:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if any(isinstance(t, ast.Name) and t.id == qual for t in targets):
                return True
    return False


def top_level_imports(root: str, module: str) -> Set[str]:
    """The modules of the same package that ``module`` imports when it is imported: its
    top-level ``import`` / ``from ... import`` statements (inside ``if`` blocks too, not
    inside ``try``: an import guarded there may fail on purpose, nor inside functions),
    each module named and -- for ``from P import n`` -- ``P.n`` too, as it may be one."""
    parsed = static.parse(static.module_path(root, module))
    if parsed is None:
        parsed = static.parse(static.module_path(root, f"{module}.__init__"))
    if parsed is None:
        return set()
    top = module.split(".")[0]
    out: Set[str] = set()
    todo: List[ast.stmt] = list(parsed[0].body)
    while todo:
        stmt = todo.pop()
        if isinstance(stmt, ast.If):
            todo += stmt.body + stmt.orelse
        elif isinstance(stmt, ast.Import):
            out |= {a.name for a in stmt.names if a.name.split(".")[0] == top}
        elif isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module \
                and stmt.module.split(".")[0] == top:
            out.add(stmt.module)
            out |= {f"{stmt.module}.{a.name}" for a in stmt.names}
    return out
