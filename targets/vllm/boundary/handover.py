"""What Model Runner V2 hands its ``DraftTokensHandler``, read from a release's source: a
temporary (a tensor the caching allocator may give the next step's allocation once it is
dropped) or a persistent buffer (a view of one the runner or its speculator keeps).

The draft-token slice (``targets/vllm/slices/draft_tokens.py``) stands in for upstream's
speculator with one that hands ``set_draft_tokens`` a fresh temporary each step -- what
0.16.0-0.19.1 do with one speculative token (``gumbel_sample``'s output, viewed), and
what 0.24.0 on do at the call site (``req_states.draft_tokens[idx_mapping]``, a gather).
0.20.0-0.23.0 hand over ``self.draft_tokens[:num_reqs, :1]``: a persistent buffer, no
block for the allocator to give away, so the slice's verdict there would be about its own
speculator, not vLLM's (../shared/reference/vllm_review.md, claim 3). ``problem`` says
so, and the slice is *not driven* on such a release.

The reading: the expression the runner passes to ``set_draft_tokens``, followed through
the local names it was assigned from (latest assignment first), views (basic slicing,
``.view``, ``.unsqueeze``, ...) to what they view, and ``self.speculator.propose(...)``
into every speculator's ``propose`` return statements. A gather (indexing by a tensor)
or any other call is a temporary; ``self.X`` is persistent. Anything else cannot be read
-- and a hand-over that cannot be read is not driven either.
"""
from __future__ import annotations

import ast
import glob
import os
from typing import List, Optional, Tuple

from targets import static

RUNNER = "vllm.v1.worker.gpu.model_runner"
SPEC_DECODE = ("v1", "worker", "gpu", "spec_decode")  # under the package: the speculators
VIEWS = frozenset({"view", "view_as", "unsqueeze", "squeeze", "narrow", "expand",
                   "expand_as", "transpose", "permute", "select", "t", "unflatten"})
TEMPORARY, PERSISTENT, UNKNOWN = "temporary", "persistent", "unknown"
MAX_STEPS = 32  # a chain of names longer than this is not read (never a loop)


def problem(root: str) -> str:
    """Why the slice's stand-in does not match the release at ``root`` ("" when it does:
    upstream hands over a temporary on some path)."""
    kind, where = hand_over(root)
    if kind == TEMPORARY:
        return ""
    if kind == PERSISTENT:
        return (f"upstream's speculator hands set_draft_tokens a persistent buffer ({where}),"
                f" where the slice's stand-in hands a fresh temporary: a verdict would be "
                f"about specrace's speculator, not vLLM's")
    return (f"what Model Runner V2 hands set_draft_tokens cannot be read from the source "
            f"({where}): the slice's stand-in (a fresh temporary) is not proven to match")


def hand_over(root: str) -> Tuple[str, str]:
    """(TEMPORARY / PERSISTENT / UNKNOWN, where it was read: ``file:line: expression``)."""
    parsed = static.parse(static.module_path(root, RUNNER))
    if parsed is None:
        return UNKNOWN, f"{RUNNER} does not parse"
    sites = [(fn, call) for fn in _functions(parsed[0]) for call in ast.walk(fn)
             if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
             and call.func.attr == "set_draft_tokens"]
    if not sites:
        return UNKNOWN, f"{RUNNER} calls no set_draft_tokens"
    file = os.path.relpath(static.module_path(root, RUNNER), os.path.dirname(root))
    kinds = [_read(root, fn, _argument(call), call.lineno, file, 0)
             for fn, call in sites]
    for kind in (TEMPORARY, PERSISTENT, UNKNOWN):
        found = [where for k, where in kinds if k == kind]
        if found and (kind != PERSISTENT or len(found) == len(kinds)):
            return kind, found[0]
    return UNKNOWN, kinds[0][1]


def _argument(call: ast.Call) -> Optional[ast.expr]:
    if len(call.args) >= 2:
        return call.args[1]
    return next((k.value for k in call.keywords if k.arg == "draft_tokens"), None)


def _functions(tree: ast.AST) -> List[ast.AST]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef,
                                                         ast.AsyncFunctionDef))]


def _read(root: str, fn: ast.AST, expr: Optional[ast.expr], line: int, file: str,
          steps: int) -> Tuple[str, str]:
    """What ``expr`` (in ``fn``, evaluated at ``line``) is: TEMPORARY, PERSISTENT, UNKNOWN."""
    if expr is None or steps > MAX_STEPS:
        return UNKNOWN, f"{file}:{line}"
    where = f"{file}:{getattr(expr, 'lineno', line)}: {ast.unparse(expr)[:60]}"
    if isinstance(expr, ast.Subscript):
        if not _basic(expr.slice):
            return TEMPORARY, where  # indexing by a tensor gathers into a new one
        return _viewed(_read(root, fn, expr.value, line, file, steps + 1), where)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        if expr.func.attr in VIEWS:
            return _viewed(_read(root, fn, expr.func.value, line, file, steps + 1), where)
        if expr.func.attr == "propose" and ast.unparse(expr.func.value) == "self.speculator":
            return _speculators(root, steps + 1)
    if isinstance(expr, ast.Call):
        return TEMPORARY, where  # a function's fresh result
    if isinstance(expr, ast.Attribute) and _on_self(expr):
        return PERSISTENT, where
    if isinstance(expr, ast.Name):
        assigned = _assigned(fn, expr.id, line)
        if assigned is not None:
            return _read(root, fn, assigned.value, assigned.lineno, file, steps + 1)
    return UNKNOWN, where


def _viewed(read: Tuple[str, str], where: str) -> Tuple[str, str]:
    """A view of a persistent buffer is named as the view (what is handed over)."""
    return (PERSISTENT, where) if read[0] == PERSISTENT else read


def _basic(index: ast.expr) -> bool:
    """Basic indexing (slices, integers, None, ...): a view, never a copy."""
    parts = index.elts if isinstance(index, ast.Tuple) else [index]
    return all(isinstance(p, ast.Slice) or (isinstance(p, ast.Constant)
                                            and (p.value is None or p.value is Ellipsis
                                                 or isinstance(p.value, int)))
               for p in parts)


def _on_self(expr: ast.expr) -> bool:
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return isinstance(expr, ast.Name) and expr.id == "self"


def _assigned(fn: ast.AST, name: str, before: int) -> Optional[ast.Assign]:
    """The latest plain assignment ``name = ...`` in ``fn`` before line ``before``."""
    found = [n for n in ast.walk(fn) if isinstance(n, ast.Assign) and n.lineno < before
             and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
    return max(found, key=lambda n: n.lineno, default=None)


def _speculators(root: str, steps: int) -> Tuple[str, str]:
    """What every speculator's ``propose`` returns: TEMPORARY where one returns one on
    some path (0.17.0's one-token early exit), PERSISTENT where all return a buffer."""
    kinds = []
    base = os.path.join(root, *SPEC_DECODE)
    for path in sorted(glob.glob(os.path.join(base, "**", "*.py"), recursive=True)):
        parsed = static.parse(path)
        if parsed is None:
            continue
        file = os.path.relpath(path, os.path.dirname(root))
        for fn in _functions(parsed[0]):
            if fn.name != "propose":
                continue
            returns = sorted((r for r in ast.walk(fn)
                              if isinstance(r, ast.Return) and r.value is not None),
                             key=lambda r: r.lineno)  # the first in the file is named
            kinds += [_read(root, fn, r.value, r.lineno, file, steps) for r in returns]
    for kind in (TEMPORARY, PERSISTENT):
        found = [where for k, where in kinds if k == kind]
        if found and (kind == TEMPORARY or len(found) == len(kinds)):
            return kind, found[0]
    return UNKNOWN, kinds[0][1] if kinds else "no speculator's propose returns a value"
