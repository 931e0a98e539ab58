"""The census: every cross-stream and host/device ordering site in a server's source.

``specrace census --target sglang|vllm [--release V]`` reads a release's serving code --
the areas a single-node server runs, listed per target in
``targets/{sglang,vllm}/environments/census.py`` -- statically: no import, nothing
executed, bounded (a file too large, too deeply nested or that does not parse is listed
as unreadable, never a crash). Other rooms call it as

    census(target, release=None, readbacks=False) -> Census   # .sites: List[Site]
    scan_source(text, rel="x.py") -> (List[Site], problem)    # one file's sites

``Site`` is a file (relative to the package), line, column, enclosing function
(qualified: ``Class.method``), kind, the statement lines whose execution means it ran
(``span``: what ``targets.coverage`` matches coverage.py's lines against) and the
``if`` tests around it (``guards``: what the reason rules read). Kinds: ``KINDS``; the
rules that decide each are in ``targets.census_rules``. Order is deterministic: by file,
line, column, kind.
"""
from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from seams import children
from targets import static
from targets.census_rules import KINDS, FileFacts, kinds_of, might_have_sites

__all__ = ["KINDS", "Site", "Census", "census", "scan_source", "scan_tree", "package_of",
           "CensusError"]

MAX_FILES = 20_000  # an area with more Python files than this is cut (and says so)
MAX_SITES_PER_FILE = 5_000
GUARD_CHARS = 120  # an if-test kept for the reason rules, bounded
TEXT_CHARS = 100  # the site's call as written, bounded


class CensusError(ValueError):
    """Bad input (unknown target, a release not set up): one line, exit 2."""


@dataclass(frozen=True)
class Site:
    file: str  # relative to the package root, '/'-separated
    line: int
    col: int
    function: str  # "Class.method", "outer.inner", "<module>"
    kind: str
    span: Tuple[int, int]  # lines of the statement (its header, for a compound one)
    guards: Tuple[str, ...] = ()  # enclosing if-tests, outermost first; "not (T)" in else
    text: str = ""

    @property
    def key(self) -> Tuple[str, int, int, str]:
        return (self.file, self.line, self.col, self.kind)

    @property
    def directory(self) -> str:
        return os.path.dirname(self.file) or "."

    def to_json(self) -> Dict[str, Any]:
        return {"file": self.file, "line": self.line, "col": self.col,
                "function": self.function, "kind": self.kind, "span": list(self.span),
                "guards": list(self.guards), "text": self.text}


@dataclass(frozen=True)
class Census:
    target: str
    package: str
    version: str
    root: str
    areas: Tuple[str, ...]
    missing_areas: Tuple[str, ...]
    files: int  # Python files read
    sites: Tuple[Site, ...]
    unreadable: Tuple[Tuple[str, str], ...]  # (file, why)
    readbacks: bool = False

    def by_kind(self) -> Dict[str, int]:
        counts = {k: 0 for k in KINDS}
        for s in self.sites:
            counts[s.kind] += 1
        return {k: n for k, n in counts.items() if n}

    def to_json(self) -> Dict[str, Any]:
        return {"target": self.target, "package": self.package, "version": self.version,
                "areas": list(self.areas), "missing_areas": list(self.missing_areas),
                "files": self.files, "readbacks": self.readbacks,
                "total": len(self.sites), "by_kind": self.by_kind(),
                "unreadable": [{"file": f, "why": w} for f, w in self.unreadable],
                "sites": [s.to_json() for s in self.sites]}


# --- one file ---------------------------------------------------------------------------

def _header_end(stmt: ast.stmt) -> int:
    """The last line of a statement's own code: a compound statement's header ends where
    its first nested statement begins (its body runs or not on its own)."""
    first_body = [b[0].lineno for b in (getattr(stmt, f, None) for f in
                                        ("body", "orelse", "finalbody", "handlers"))
                  if isinstance(b, list) and b and isinstance(b[0], ast.AST)]
    if first_body and isinstance(stmt, (ast.If, ast.While, ast.For, ast.AsyncFor, ast.With,
                                        ast.AsyncWith, ast.Try, ast.FunctionDef,
                                        ast.AsyncFunctionDef, ast.ClassDef)):
        return max(stmt.lineno, min(first_body) - 1)
    return stmt.end_lineno or stmt.lineno


def _bounded(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."


def _unparse(node: ast.AST, n: int) -> str:
    try:
        return _bounded(ast.unparse(node), n)
    except (ValueError, RecursionError):  # a node ast.unparse cannot render
        return "?"


def scan_tree_ast(tree: ast.Module, rel: str, readbacks: bool = False,
                  factories: Tuple[str, ...] = ()) -> Tuple[List[Site], str]:
    """(the sites of one parsed file, "") or ([], why not: nested too deep). One walk,
    iterative (an explicit stack, each entry with its depth: a file nested past the
    reader's bound is refused, never a RecursionError) collects the calls, stores,
    assignments and imports with their context; the file's facts (its events, its
    pinned buffers) come from the whole file before any call is judged."""
    Ctx = Tuple[Tuple[str, ...], Tuple[str, ...], Optional[ast.stmt], str]
    calls: List[Tuple[ast.Call, Ctx]] = []
    stores: List[Tuple[ast.stmt, Ctx]] = []
    assigns: List[Tuple[ast.stmt, str, str]] = []
    imports: List[ast.ImportFrom] = []
    # (node, depth, (qualified name parts, guards, innermost statement, class))
    stack: List[Tuple[ast.AST, int, Ctx]] = [(tree, 1, ((), (), None, ""))]
    while stack:
        node, depth, ctx = stack.pop()
        if depth > static.MAX_DEPTH:
            return [], f"nested deeper than {static.MAX_DEPTH}"
        qual, guards, stmt, cls = ctx
        if isinstance(node, ast.stmt):
            stmt = node
            ctx = (qual, guards, stmt, cls)
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                stores.append((node, ctx))
                if not isinstance(node, ast.AugAssign):
                    assigns.append((node, cls, ".".join(qual)))
            elif isinstance(node, ast.ImportFrom):
                imports.append(node)
        elif isinstance(node, ast.Call) and stmt is not None:
            calls.append((node, ctx))
        d = depth + 1
        if isinstance(node, ast.If):
            test = _unparse(node.test, GUARD_CHARS)
            stack.extend((c, d, (qual, guards + (f"not ({test})",), stmt, cls))
                         for c in node.orelse)
            stack.extend((c, d, (qual, guards + (test,), stmt, cls)) for c in node.body)
            stack.append((node.test, d, ctx))
            continue
        children = list(ast.iter_child_nodes(node))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner = (qual + (node.name,), guards, stmt,
                     node.name if isinstance(node, ast.ClassDef) else cls)
            # decorators and defaults run where the def is, not in its body
            outer = set(map(id, node.decorator_list))
            if not isinstance(node, ast.ClassDef):
                outer |= set(map(id, node.args.defaults + [x for x in node.args.kw_defaults
                                                           if x is not None]))
            stack.extend((c, d, ctx if id(c) in outer else inner) for c in children)
        else:
            stack.extend((c, d, ctx) for c in children)
    facts = FileFacts.build(imports, assigns, factories)
    sites: List[Site] = []

    def add(node: ast.AST, kind: str, ctx: Ctx) -> None:
        qual, guards, stmt, _ = ctx
        sites.append(Site(rel, node.lineno, node.col_offset, ".".join(qual) or "<module>",
                          kind, (stmt.lineno, _header_end(stmt)), guards,
                          _unparse(node, TEXT_CHARS)))
    for call, ctx in calls:
        for kind in kinds_of(call, facts, ctx[3], ".".join(ctx[0]), readbacks):
            add(call, kind, ctx)
    for stmt, ctx in stores:
        kind = facts.host_write(stmt, ctx[3], ".".join(ctx[0]))
        if kind:
            add(stmt, kind, ctx)
    sites.sort(key=lambda s: s.key)
    return sites[:MAX_SITES_PER_FILE], ""


def _read(path: str, readbacks: bool, factories: Tuple[str, ...]
          ) -> Tuple[Optional[ast.Module], str]:
    """(the parsed file, "") -- or (None, "") for a file whose text names nothing a site
    is made of (no site can be in it: it is not parsed, which is most of the time a
    census takes), or (None, why it cannot be read). The reader's bounds are
    ``targets.static``'s: size here, depth in the walk."""
    try:
        if os.path.getsize(path) > static.MAX_SOURCE_BYTES:
            return None, f"larger than {static.MAX_SOURCE_BYTES} bytes"
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if not might_have_sites(text, readbacks, factories):
            return None, ""
        return ast.parse(text, filename=path), ""
    except SyntaxError as exc:
        return None, f"does not parse: {_bounded(str(exc.msg), 80)} (line {exc.lineno})"
    except UnicodeDecodeError:
        return None, "not UTF-8"
    except (RecursionError, MemoryError):  # the C parser's own depth limit
        return None, f"nested deeper than {static.MAX_DEPTH}"
    except (OSError, ValueError) as exc:
        return None, f"cannot be read: {type(exc).__name__}"


def scan_file(path: str, rel: str, readbacks: bool = False,
              factories: Tuple[str, ...] = ()) -> Tuple[List[Site], str]:
    """(the sites of one file, "") or ([], why it cannot be read)."""
    tree, why = _read(path, readbacks, factories)
    if tree is None:
        return [], why
    return scan_tree_ast(tree, rel, readbacks, factories)


def scan_source(text: str, rel: str = "x.py", readbacks: bool = False,
                factories: Tuple[str, ...] = ()) -> Tuple[List[Site], str]:
    """``scan_file`` of source text (tests, and a reader of a wheel's member)."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "x.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return scan_file(path, rel, readbacks, factories)


# --- a tree -----------------------------------------------------------------------------

def _py_files(folder: str) -> List[str]:
    """The Python files under ``folder`` (or the file itself), sorted, bounded."""
    if os.path.isfile(folder):
        return [folder] if folder.endswith(".py") else []
    out: List[str] = []
    for here, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        out += [os.path.join(here, f) for f in sorted(files) if f.endswith(".py")]
        if len(out) >= MAX_FILES:
            break
    return sorted(out)[:MAX_FILES]


def scan_tree(root: str, areas: Tuple[str, ...], readbacks: bool = False,
              factories: Tuple[str, ...] = (),
              progress: Callable[[int, Optional[int]], None] = lambda n, t=None: None):
    """(sites, unreadable, files read, missing areas) of ``areas`` under ``root``;
    ``progress(done, total)`` after each area."""
    sites: List[Site] = []
    unreadable: List[Tuple[str, str]] = []
    missing: List[str] = []
    seen: set = set()
    for i, area in enumerate(areas):
        progress(i, len(areas))
        folder = os.path.join(root, *area.split("/"))
        if not os.path.exists(folder):
            missing.append(area)
            continue
        for path in _py_files(folder):
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            if rel in seen:  # areas may nest (a file listed once)
                continue
            seen.add(rel)
            found, why = scan_file(path, rel, readbacks, factories)
            sites += found
            if why:
                unreadable.append((rel, why))
    progress(len(areas), len(areas))
    return (sorted(sites, key=lambda s: s.key), sorted(unreadable), len(seen),
            tuple(missing))


# --- a target's release -----------------------------------------------------------------

def spec_of(target: str):
    """The per-target table: a module with ``PACKAGE``, ``AREAS``, ``RULES`` (the reason
    rules ``targets.coverage`` applies) and ``PINNED_FACTORIES``."""
    if target == "sglang":
        from targets.sglang.environments import census as spec
    elif target == "vllm":
        from targets.vllm.environments import census as spec
    else:
        raise CensusError(f"unknown target {str(target)[:40]!r} for a census; expected "
                          f"sglang or vllm")
    return spec


def package_of(target: str, release: Optional[str]) -> Tuple[str, str]:
    """(the package's folder, its version): ``release``'s environment, or -- with no
    release -- the package installed beside specrace. ``CensusError`` when absent."""
    spec = spec_of(target)
    if release is None:
        root = static.package_root(spec.PACKAGE)
        if root is None:
            raise CensusError(f"{spec.PACKAGE} is not installed here; name a release set "
                              f"up with `{_hint(target)}` (--release V)")
        from importlib import metadata
        try:
            version = metadata.version(spec.PACKAGE)
        except metadata.PackageNotFoundError:
            version = "unknown"
        return root, version
    import targets
    line = targets.declared(target).environments().line
    try:
        version = line.check_release(release)
        python = line.require(version)
    except ValueError as exc:  # EnvError: not a version, out of range, not set up
        raise CensusError(str(exc)) from None
    root, seen = _seen_by(python, spec.PACKAGE)
    if root is None or seen != version:
        raise CensusError(f"{spec.PACKAGE} {version}'s environment imports "
                          f"{spec.PACKAGE} {seen or 'from nowhere'}; set it up again with "
                          f"`{line.hint(version)}`")
    return root, version


# Run by a release's interpreter: where it would import the package from, and the
# version it would see -- found, not imported. (A release whose wheel is the core's own
# has no copy in its venv: it imports the core's, through specrace-core.pth.)
_WHERE = ("import importlib.util as u, importlib.metadata as m, json, sys\n"
          "s = u.find_spec(sys.argv[1])\n"
          "root = list(s.submodule_search_locations)[0] if s and s.submodule_search_locations "
          "else None\n"
          "try: v = m.version(sys.argv[1])\n"
          "except m.PackageNotFoundError: v = None\n"
          "print(json.dumps([root, v]))")


def _seen_by(python: str, package: str) -> Tuple[Optional[str], Optional[str]]:
    import json
    import subprocess
    try:
        out = subprocess.run(children.command(python, "-c", _WHERE, package),
                             capture_output=True, text=True, timeout=120,
                             env=children.env(project=False)).stdout
        root, version = json.loads(out.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, TypeError):
        return None, None
    return (root if isinstance(root, str) else None,
            version if isinstance(version, str) else None)


def _hint(target: str) -> str:
    return "make upstream SGLANG=V" if target == "sglang" else "make upstream TARGET=vllm VLLM=V"


def census(target: str, release: Optional[str] = None, readbacks: bool = False,
           progress: Callable[[int, Optional[int]], None] = lambda n, t=None: None
           ) -> Census:
    """The census of ``target``'s ``release`` (default: the one installed here);
    ``progress(done, total)`` over its areas."""
    spec = spec_of(target)
    root, version = package_of(target, release)
    sites, unreadable, files, missing = scan_tree(root, spec.AREAS, readbacks,
                                                  tuple(getattr(spec, "PINNED_FACTORIES", ())),
                                                  progress)
    return Census(target, spec.PACKAGE, version, root, tuple(spec.AREAS), missing, files,
                  tuple(sites), tuple(unreadable), readbacks)
