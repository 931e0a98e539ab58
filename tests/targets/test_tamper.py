"""One contract discipline for every target (``targets.driven``): the same tamper set --
a driven module deleted, made unparseable, a driven function's signature changed, a new
required parameter, the name rebound to a value -- against each target's release, run
through the real CLI: exit 2 with the problem named (each line once), before any trial (never a
"reproduced" line, never a traceback).

The release is tampered in a shadow copy (links to the installed package's files, the one
edited file a real one) put first on ``PYTHONPATH``: the contract reads it and the target
would import it. vLLM runs in its release environment (``make upstream TARGET=vllm
VLLM=0.17.0``); each target skips, with the reason, where it is not set up."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from seams.paths import REPO_ROOT
from targets import static


@dataclass(frozen=True)
class Release:
    python: str  # the interpreter that runs the target
    root: str  # its installed package
    rel: str  # the tampered file, under the package
    cls: str  # the driven class and method in it
    fn: str
    scenario: str

    @property
    def module(self) -> str:
        return os.path.basename(self.root) + "." + self.rel[:-3].replace("/", ".")


def _sglang():
    root = static.package_root("sglang")
    if root is None:
        return None
    return Release(sys.executable, root, "srt/managers/schedule_batch.py", "ScheduleBatch",
                   "merge_batch", "ngram-filter-race")


def _vllm():
    from targets.vllm.environments import LINE
    root = LINE.release_root("0.17.0")
    if root is None or not os.access(LINE.env_python("0.17.0"), os.X_OK):
        return None
    # the async scheduler: imported only by the trials (the reference runs synchronously),
    # so a broken one once crashed the trials alone and read as a race
    return Release(LINE.env_python("0.17.0"), root, "v1/core/sched/async_scheduler.py",
                   "AsyncScheduler", "_update_request_with_output", "vllm-seq-lens-shadow")


RELEASES = {"sglang": (_sglang, "sglang is not installed (make upstream)"),
            "vllm": (_vllm, "vllm 0.17.0 is not set up here "
                            "(make upstream TARGET=vllm VLLM=0.17.0)")}


def _function(text: str, cls: str, fn: str) -> ast.FunctionDef:
    klass = next(n for n in ast.parse(text).body
                 if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == fn)


def _insert(text: str, line: int, col: int, what: str) -> str:
    lines = text.splitlines(keepends=True)
    lines[line - 1] = lines[line - 1][:col] + what + lines[line - 1][col:]
    return "".join(lines)


def rename_second_parameter(r: Release, text: str) -> str:
    arg = _function(text, r.cls, r.fn).args.args[1]
    return _insert(text, arg.lineno, arg.col_offset + len(arg.arg), "_renamed")


def add_required_parameter(r: Release, text: str) -> str:
    a = _function(text, r.cls, r.fn).args
    assert a.vararg is None and not a.kwonlyargs  # the two functions' shape
    last = a.args[-1]
    end = a.defaults[-1] if a.defaults else last
    return _insert(text, end.end_lineno, end.end_col_offset, ", *, specrace_extra")


TAMPERS = {
    "delete": (None, "{module} is missing"),
    "unparseable": (lambda r, t: t + "\ndef broken(:\n", "{module} does not parse"),
    "changed signature": (rename_second_parameter, "does not start with"),
    "new required parameter": (add_required_parameter, "requires 'specrace_extra'"),
    "rebound name": (lambda r, t: t + f"\n{r.cls}.{r.fn} = None\n",
                     "{cls}.{fn} is not a function"),
}


def shadow(tmp_path, r: Release, edit) -> str:
    """A folder to put first on the path: the package, links but for ``r.rel``, which is
    ``edit(r, text)`` (``None``: deleted)."""
    src, dst = r.root, tmp_path / os.path.basename(r.root)
    for part in r.rel.split("/"):
        dst.mkdir()
        for entry in os.listdir(src):
            if entry != part and entry != "__pycache__":
                os.symlink(os.path.join(src, entry), dst / entry)
        src, dst = os.path.join(src, part), dst / part
    if edit is not None:
        dst.write_text(edit(r, open(src, encoding="utf-8").read()))
    return str(tmp_path)


@pytest.mark.parametrize("tamper", TAMPERS)
@pytest.mark.parametrize("target", RELEASES)
def test_a_tampered_release_is_refused_with_its_problem_named(tmp_path, target, tamper):
    make, why = RELEASES[target]
    r = make()
    if r is None:
        pytest.skip(why)
    edit, says = TAMPERS[tamper]
    says = says.format(module=r.module, cls=r.cls, fn=r.fn)
    path = shadow(tmp_path, r, edit)
    proc = subprocess.run(
        [r.python, "-P", "-m", "specrace.cli", "repro", r.scenario, "--target", target,
         "--trials", "1", "--no-report", "--expect", "race"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
        # the shadow first; then whatever this process was given (a GPU machine finds its
        # site bundle there) and the repo, for a checkout where specrace is not installed
        env={**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": os.pathsep.join(
            p for p in (path, os.environ.get("PYTHONPATH", ""), REPO_ROOT) if p)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-800:]
    assert says in out, out[-800:]
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(set(lines)) == len(lines), out[-800:]  # each problem said once
    assert "reproduced" not in out and "Traceback" not in out, out[-800:]


def _evaluate(target: str, root: str):
    if target == "sglang":
        from targets.sglang.boundary import contract
        return contract.evaluate(contract.installed_version(), root,
                                 contract.SCHEDULER_ATTRIBUTES, contract.WORKER_KEYWORDS)
    from targets.vllm.boundary import contract
    return contract.evaluate("0.17.0", root)


@pytest.mark.parametrize("target", RELEASES)
def test_a_file_too_deep_for_the_reader_is_one_problem_said_as_such(tmp_path, target):
    """20,000 terms in one expression parse, but nest past what the reader walks: one
    problem, "nests deeper", never "missing or does not parse" once per name in it."""
    make, why = RELEASES[target]
    r = make()
    if r is None:
        pytest.skip(why)
    huge = "x = " + " + ".join(["1"] * 20000) + "\n"
    root = os.path.join(shadow(tmp_path, r, lambda r, t: t + huge), os.path.basename(r.root))
    verdict = _evaluate(target, root)
    named = [p for p in verdict.problems if r.module in p]
    assert not verdict.ok and named == [f"{r.module} nests deeper than the reader reads "
                                        f"(500 levels)"], verdict.problems
