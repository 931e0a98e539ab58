"""The one way the CLI tests run ``specrace``: the real entry point, in a subprocess, from
the project root, with the limits' overrides of the caller's environment taken out."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from harness.target import Environments
from seams.paths import REPO_ROOT as ROOT


def cli_env(**extra):
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    for k in ("SPECRACE_CYCLES_PER_MS", "SPECRACE_WATCHDOG_S"):
        env.pop(k, None)
    env.update(extra)
    return env


def specrace(*args, patch: str = "", **env):
    """``python -m specrace.cli ARGS``; with ``patch``, that code runs first, then main()
    (a bug the tree does not have, patched in as a user's local change would be)."""
    if patch:
        code = (textwrap.dedent(patch) + "\nimport sys\nfrom specrace.cli import main\n"
                f"sys.argv = ['specrace'] + {list(args)!r}\n"
                "raise SystemExit(main(sys.argv[1:]))\n")
        cmd = [sys.executable, "-c", code]
    else:
        cmd = [sys.executable, "-m", "specrace.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=cli_env(**env), cwd=ROOT,
                          timeout=300)


def pytest_plugin_args():
    """``-p specrace.pytest_plugin`` where the project is not pip-installed (a GPU machine
    runs it from the source tree): there its entry point does not register the plugin, and
    naming it where it does would register it twice (pluggy refuses)."""
    from importlib.metadata import entry_points
    installed = any(ep.value == "specrace.pytest_plugin"
                    for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "specrace.pytest_plugin"]


class ScriptRelease(Environments):
    """One release, "9.9", whose interpreter is a script of the test's: what a release
    child does with its exit code, its output and its environment, without a release."""

    def __init__(self, python):
        self._python = python

    def chosen(self, asked):
        return ["9.9"]

    def python(self, version):
        return self._python
