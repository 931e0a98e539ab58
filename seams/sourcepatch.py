"""Run-time source patches: a function's source, edited, compiled and swapped in for a block.

Seeded bugs (``mutations``) and the sglang target's variants (the pre-#35198
relay patched into the installed classes) are both this: a function or method named
``"module:qualname"``, a list of ``(snippet, replacement)`` edits of its source, each
snippet occurring exactly once -- so a change to the code it targets breaks the patch
loudly (``PatchError``) instead of silently testing nothing. The patched function is
compiled in its module's namespace and replaces the original for the duration of
``applied()``, then the original is put back; the installed files are never edited.
"""
from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import sys
import textwrap
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Tuple


class PatchError(RuntimeError):
    """The patch does not fit the code it targets (a harness error, never a finding)."""


def _word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def snippet_problem(src: str, old: str) -> str:
    """Why ``old`` is not a snippet this patch may edit in ``src`` ("": it occurs exactly
    once, and whole). Whole: where it begins or ends with a name or number, the source
    does not go on with one -- ``x = 1`` is not a snippet of ``xx = 10``, nor
    ``foo(a)`` of ``barfoo(a)``: a snippet that is a piece of another line is refused,
    anywhere in the function, since an edit there would land in the wrong place."""
    found, start = [], src.find(old)
    while start >= 0:
        found.append(start)
        start = src.find(old, start + 1)
    whole = [i for i in found
             if not (old and _word(old[0]) and i > 0 and _word(src[i - 1]))
             and not (old and _word(old[-1]) and i + len(old) < len(src)
                      and _word(src[i + len(old)]))]
    if len(whole) != len(found):
        return "it is also a piece of a longer line"
    if len(found) != 1:
        return f"it occurs {len(found)} times"
    return ""


@dataclass(frozen=True)
class SourcePatch:
    target: str  # "module:qualname", e.g. "impl.spec_info:NgramVerifyInput.filter_batch"
    edits: Tuple[Tuple[str, str], ...]  # (snippet, replacement), each snippet unique
    label: str = ""  # what the patch is, for error messages

    def check(self) -> None:
        """Raise ``PatchError`` if the patch no longer applies."""
        with self.applied():
            pass

    def parts(self) -> Tuple["SourcePatch", ...]:
        """The one-function patches it is made of (a ``PatchSet`` has several)."""
        return (self,)

    def problem(self, problem_of: Callable[[str, Tuple[Tuple[str, str], ...]], str]) -> str:
        """Why it does not fit, as ``problem_of(target, edits)`` reads the code without
        applying anything (a target's static check; "": it fits)."""
        return problem_of(self.target, self.edits)

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        try:
            owner, attr = resolve(self.target)
            raw = inspect.getattr_static(owner, attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise PatchError(f"{self.label or 'patch'}: cannot find {self.target}: "
                             f"{type(exc).__name__}: {exc}") from None
        func = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
        func = func.fget if isinstance(func, property) else func  # its source re-makes it
        module = inspect.getmodule(func)
        # Defined in the module's own namespace, so the patched function looks its globals
        # up live, as the original does: a name rebound after the patch is applied (a
        # kernel stand-in bound for the run) is the one it calls. The name the ``def``
        # binds there is put straight back.
        namespace = module.__dict__
        missing = object()
        before = namespace.get(func.__name__, missing)
        try:
            exec(self._compiled(func), namespace)  # the code under test's source, patched
            patched = namespace[func.__name__]
        except (SyntaxError, KeyError) as exc:
            raise PatchError(f"{self.label or 'patch'}: the patched {self.target} does not "
                             f"compile: {type(exc).__name__}: {exc}") from None
        finally:
            if before is missing:
                namespace.pop(func.__name__, None)
            else:
                namespace[func.__name__] = before
        if isinstance(raw, (classmethod, staticmethod)):
            patched = type(raw)(patched)
        aliases = [(m, k) for m, k in _aliases(raw, module) if m is not owner]
        setattr(owner, attr, patched)
        for m, k in aliases:
            setattr(m, k, patched)
        try:
            yield
        finally:
            setattr(owner, attr, raw)
            for m, k in aliases:
                setattr(m, k, raw)

    def _compiled(self, func) -> Any:
        """The patched function's code, compiled once per patch and original (a state
        machine applies a variant for every example it runs)."""
        key = (self, func)
        code = _COMPILED.get(key)
        if code is not None:
            return code
        try:
            src = inspect.getsource(func)  # snippets match the file's own indentation
        except (OSError, TypeError) as exc:
            raise PatchError(f"{self.label or 'patch'}: no source for {self.target}: "
                             f"{exc}") from None
        for old, new in self.edits:
            problem = snippet_problem(src, old)
            if problem:
                raise PatchError(f"{self.label or 'patch'}: a snippet does not fit "
                                 f"{self.target} ({problem}): {old!r}")
            src = src.replace(old, new)
        src = textwrap.dedent(src)  # decorators included: they are re-applied
        # Compiled under the original file name and line numbers, so frames (and race
        # reports) inside the patched function point at the function it patches.
        tree = ast.parse(src)
        ast.increment_lineno(tree, inspect.getsourcelines(func)[1] - 1)
        code = _COMPILED[key] = compile(tree, inspect.getsourcefile(func), "exec")
        return code


@dataclass(frozen=True)
class PatchSet:
    """Patches of several functions applied together: a fix whose change spans two
    functions, or one release's fix beside another's (each part checked on its own)."""
    patches: Tuple[SourcePatch, ...]
    label: str = ""

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for patch in self.patches:
                stack.enter_context(patch.applied())
            yield

    def check(self) -> None:
        with self.applied():
            pass

    def parts(self) -> Tuple[SourcePatch, ...]:
        return self.patches


@dataclass(frozen=True)
class FirstFitting:
    """One change written against the code of several releases: the first alternative
    whose snippets all fit the installed function is applied -- the release's code picks
    it, never its version number. None fitting is a ``PatchError`` naming each one's
    problem. (Each alternative still has its snippets occur exactly once, so a release
    that moves the code breaks the patch loudly, as a plain one does.)"""
    alternatives: Tuple[SourcePatch, ...]
    label: str = ""

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        problems = []
        for alternative in self.alternatives:
            stack = contextlib.ExitStack()
            try:
                stack.enter_context(alternative.applied())
            except PatchError as exc:
                problems.append(str(exc))
                continue
            with stack:
                yield
            return
        raise PatchError(f"{self.label or 'patch'}: no alternative fits: "
                         + "; ".join(problems))

    def check(self) -> None:
        with self.applied():
            pass

    def parts(self) -> Tuple["FirstFitting", ...]:
        return (self,)  # one change: whichever alternative fits is the part

    def problem(self, problem_of: Callable[[str, Tuple[Tuple[str, str], ...]], str]) -> str:
        """"" where one alternative fits, else each one's problem."""
        problems = [a.problem(problem_of) for a in self.alternatives]
        return "" if not all(problems) else "; ".join(problems)


_COMPILED: Dict[Tuple[SourcePatch, Any], Any] = {}
_ALIASES: Dict[Tuple[int, int], List[Tuple[Any, str]]] = {}
# packages that bind another package's functions by name: the toy world's are bound by
# the targets that run on it (``from toys.requests import form_prefill``)
_BOUND_BY = {"toys": ("impl", "targets")}


def _aliases(raw: Any, module: Any) -> List[Tuple[Any, str]]:
    """Other modules of the same package (and of the packages that bind its functions,
    ``_BOUND_BY``) that bound ``raw`` under a name of their own (``from .verify import
    verify_tree_greedy``): they are rebound too, or the patch would miss their callers.
    Scanning every module of a large package (sglang has ~700) is slow, so the answer is
    kept until the set of loaded modules changes."""
    key = (id(raw), len(sys.modules))
    hit = _ALIASES.get(key)
    if hit is None:
        package = module.__name__.split(".")[0]
        packages = (package,) + _BOUND_BY.get(package, ())
        hit = _ALIASES[key] = [
            (m, k) for name, m in list(sys.modules.items())
            if m is not None and name.split(".")[0] in packages
            for k, v in list(vars(m).items()) if v is raw]
    return hit


def resolve(target: str) -> Tuple[Any, str]:
    """(owner, attribute) named by ``"module:qualname"``."""
    mod_name, qual = target.split(":")
    owner = importlib.import_module(mod_name)
    parts = qual.split(".")
    for p in parts[:-1]:
        owner = getattr(owner, p)
    getattr(owner, parts[-1])  # exists
    return owner, parts[-1]


@contextlib.contextmanager
def all_applied(patches) -> Iterator[None]:
    """Apply several patches for the block (in order; reverted in reverse)."""
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p.applied())
        yield
