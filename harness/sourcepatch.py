"""Run-time source patches: a function's source, edited, compiled and swapped in for a block.

Seeded bugs (``scenarios/mutations``) and the sglang target's variants (the pre-#35198
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
from typing import Any, Iterator, Tuple


class PatchError(RuntimeError):
    """The patch does not fit the code it targets (a harness error, never a finding)."""


@dataclass(frozen=True)
class SourcePatch:
    target: str  # "module:qualname", e.g. "impl.spec_info:NgramVerifyInput.filter_batch"
    edits: Tuple[Tuple[str, str], ...]  # (snippet, replacement), each snippet unique
    label: str = ""  # what the patch is, for error messages

    def check(self) -> None:
        """Raise ``PatchError`` if the patch no longer applies."""
        with self.applied():
            pass

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        owner, attr = resolve(self.target)
        raw = inspect.getattr_static(owner, attr)
        func = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
        src = inspect.getsource(func)  # snippets match the file's own indentation
        for old, new in self.edits:
            count = src.count(old)
            if count != 1:
                raise PatchError(f"{self.label or 'patch'}: snippet occurs {count} times in "
                                 f"{self.target}: {old!r}")
            src = src.replace(old, new)
        src = textwrap.dedent(src)  # decorators included: they are re-applied
        module = inspect.getmodule(func)
        namespace = dict(module.__dict__)
        # Compiled under the original file name and line numbers, so frames (and race
        # reports) inside the patched function point at the function it patches.
        tree = ast.parse(src)
        ast.increment_lineno(tree, inspect.getsourcelines(func)[1] - 1)
        code = compile(tree, inspect.getsourcefile(func), "exec")
        exec(code, namespace)  # the code under test's own source, patched
        patched = namespace[func.__name__]
        if isinstance(raw, (classmethod, staticmethod)):
            patched = type(raw)(patched)
        # ``from .verify import verify_tree_greedy`` binds the original elsewhere in the
        # package: rebind every such name too, or the patch would miss those callers.
        package = module.__name__.split(".")[0]
        aliases = [(m, k) for name, m in list(sys.modules.items())
                   if m is not None and (name == package or name.startswith(package + "."))
                   and m is not owner
                   for k, v in list(vars(m).items()) if v is raw]
        setattr(owner, attr, patched)
        for m, k in aliases:
            setattr(m, k, patched)
        try:
            yield
        finally:
            setattr(owner, attr, raw)
            for m, k in aliases:
                setattr(m, k, raw)


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
