"""How specrace starts a Python child: a release's specrace (replay's hand-off, a
``releases`` row), a matrix cell, a set-up step (venv, pip), a read of a release's
interpreter.

* **Only the installed project and the code under test are imported.** ``python -m X``
  and ``python -c ...`` put the working directory first on ``sys.path``: a ``./shlex.py``
  or ``./specrace/cli.py`` where specrace was started (a CI job in a checkout of someone's
  pull request) would run as the standard library or as specrace. ``command`` starts the
  child with ``-P`` (Python 3.11 on: the working directory stays off the path), or, on
  3.10, takes it off by hand before anything is imported from it; ``env`` sets
  ``PYTHONSAFEPATH=1`` so the child's own Python children do the same, and names this
  project's folder on ``PYTHONPATH`` (where it is not installed, it is found there).
* **A sane environment.** ``PYTHONHASHSEED`` is ``HASH_SEED`` in every child: a junk value
  (``PYTHONHASHSEED=junk``) makes an interpreter exit 1 before it runs a line -- read by a
  replay as "mismatch" -- and any other seed changes the order the code under test
  iterates its sets in (the console pins this same seed: ``specrace.console``).
* **Bounded hand-offs.** A child that is a hand-off to a release's environment carries
  ``HOP`` (the release it was handed); a process that finds it set hands off no further
  (``specrace.replay.release_python``): one hop at most, whatever a report or an
  environment says its version is.
"""
from __future__ import annotations

import os
import sys
from typing import Dict, List, Optional

from seams.paths import REPO_ROOT

HASH_SEED = "0"  # every specrace process's Python hash seed
HOP = "SPECRACE_RELEASE_HOP"  # set in a child handed a release: the release's version

# Python 3.10 has no -P: the same by hand (the argument after the code is the module)
_SAFE_RUN = ("import sys; del sys.path[0]; import runpy; m = sys.argv.pop(1); "
             "runpy.run_module(m, run_name='__main__', alter_sys=True)")


def command(python: str, *args: str) -> List[str]:
    """``python ARGS`` with the working directory kept off the child's ``sys.path``.
    ``args`` start with ``-m MODULE`` or ``-c CODE`` (or a script path)."""
    if sys.version_info >= (3, 11):
        return [python, "-P", *args]
    if args[:1] == ("-m",) and len(args) >= 2:
        return [python, "-c", _SAFE_RUN, *args[1:]]
    if args[:1] == ("-c",) and len(args) >= 2:
        return [python, "-c", "import sys; del sys.path[0]\n" + args[1], *args[2:]]
    return [python, *args]


def env(hop: Optional[str] = None, base: Optional[Dict[str, str]] = None,
        project: bool = True, **extra: str) -> Dict[str, str]:
    """The child's environment: ``base`` (this process's), the hash seed pinned, the safe
    path asked of its own children, ``HOP`` set to ``hop`` where it is a hand-off;
    ``project``: the child runs specrace's own code (not a pip or venv step)."""
    out = dict(os.environ if base is None else base)
    path = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    if project and REPO_ROOT not in path:
        # this project by its own folder, not by where it was started from: a source tree
        # run without an install (a GPU machine) still finds itself with the working
        # directory off the path
        out["PYTHONPATH"] = os.pathsep.join([*path, REPO_ROOT])
    out["PYTHONHASHSEED"] = HASH_SEED
    out["PYTHONSAFEPATH"] = "1"
    if hop is not None:
        out[HOP] = hop
    out.update(extra)
    return out


def handed_off() -> Optional[str]:
    """The release this process was handed (``HOP``), or None: not a hand-off."""
    return os.environ.get(HOP) or None


def child_error(stderr: str) -> str:
    """Why a child gave no result, in one line: its ``specrace: error:`` line -- the cause
    (``... engine crashed in the synchronous reference run: AttributeError: ...``), not
    the pointer to SPECRACE_TRACEBACK printed under it -- else its last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("specrace: error:"):
            return ln[len("specrace: error:"):].strip()[:400]
    return lines[-1][:400] if lines else ""
