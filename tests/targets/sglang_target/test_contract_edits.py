"""A changed upstream is a named problem, never a verdict: realistic edits of the installed
sglang -- each one that once slipped past the contract and made a run crash in its
reference and print "reproduced 1/1 (100%)" -- are each read from the source as a
problem, and the CLI refuses the run with exit 2 before importing anything."""
from __future__ import annotations

import ast
import os
import sys

import pytest

from targets import static
from targets.sglang.boundary import contract

ROOT = static.package_root("sglang")
pytestmark = pytest.mark.skipif(ROOT is None, reason="sglang is not installed (make upstream)")
SCHED = "srt/managers/scheduler.py"


def shadow(tmp_path, rel: str, edit) -> str:
    """A copy of the installed package (links, but for ``rel``: ``edit(text)``)."""
    top = tmp_path / "sglang"
    src, dst = ROOT, top
    parts = rel.split("/")
    for i, part in enumerate(parts):
        dst.mkdir()
        for entry in os.listdir(src):
            if entry != part:
                os.symlink(os.path.join(src, entry), dst / entry)
        src, dst = os.path.join(src, part), dst / part
    dst.write_text(edit(open(src, encoding="utf-8").read()))
    return str(top)


def _method(text: str, cls: str, name: str) -> ast.FunctionDef:
    tree = ast.parse(text)
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name)


def insert_first(cls: str, method: str, line: str):
    """An edit: ``line`` as the method's first statement."""
    def edit(text: str) -> str:
        first = _method(text, cls, method).body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            first = _method(text, cls, method).body[1]  # after the docstring
        lines = text.splitlines(keepends=True)
        indent = " " * first.col_offset
        lines.insert(first.lineno - 1, indent + line + "\n")
        return "".join(lines)
    return edit


def add_helper(text: str) -> str:
    """A new helper method, reading a new attribute, called from run_batch."""
    text = insert_first("Scheduler", "run_batch", "self._probe_helper()")(text)
    node = _method(text, "Scheduler", "run_batch")
    lines = text.splitlines(keepends=True)
    helper = ["    def _probe_helper(self):\n", "        return self.brand_new_attribute\n", "\n"]
    lines[node.lineno - 1:node.lineno - 1] = helper
    return "".join(lines)


def merge_batch_gains(params: str):
    """An edit: ``ScheduleBatch.merge_batch`` takes ``params`` after ``other``."""
    return lambda text: text.replace("def merge_batch(self, other: ScheduleBatch):",
                                     f"def merge_batch(self, other: ScheduleBatch, {params}):", 1)


def scheduler_starts_with(method: str, line: str, says: str):
    """An entry of ``EDITS``: ``line`` put first in ``Scheduler.method`` of the scheduler's
    file, read as a problem that says ``says``."""
    return SCHED, insert_first("Scheduler", method, line), says


# name -> (the file edited, the edit, what the problem it is read as says)
EDITS = {
    "augmented assignment in the loop":
        scheduler_starts_with("event_loop_overlap", "self.counter += 1", "reads self.counter"),
    "read before its own store":
        scheduler_starts_with("event_loop_overlap", "self.x = self.x or 0", "reads self.x"),
    "a new helper reading a new attribute": (
        SCHED, add_helper, "Scheduler._probe_helper reads self.brand_new_attribute"),
    "getattr with a constant name":
        scheduler_starts_with("run_batch", 'getattr(self, "brand_new_flag")',
                              "reads self.brand_new_flag"),
    "getattr with a computed name":
        scheduler_starts_with("run_batch", 'getattr(self, "flag" + "_x")',
                              "by a computed name"),
    "merge_batch gains a required parameter": (
        "srt/managers/schedule_batch.py", merge_batch_gains("extra"),
        "merge_batch requires 'extra'"),
    "merge_batch gains a required keyword-only parameter": (
        "srt/managers/schedule_batch.py", merge_batch_gains("*, flag"),
        "merge_batch requires 'flag'"),
    "FutureMap.stash rebound to a value": (
        "srt/managers/overlap_utils.py", lambda t: t + "\nFutureMap.stash = None\n",
        "FutureMap.stash is not a function"),
}


@pytest.mark.parametrize("name", EDITS)
def test_each_edit_is_a_named_problem(tmp_path, name):
    rel, edit, says = EDITS[name]
    root = shadow(tmp_path, rel, edit)
    verdict = contract.evaluate(contract.installed_version(), root,
                                contract.SCHEDULER_ATTRIBUTES, contract.WORKER_KEYWORDS)
    assert verdict.tier == "unsupported", name
    assert any(says in p for p in verdict.problems), verdict.problems


def test_the_pristine_package_has_no_problem():
    verdict = contract.evaluate(contract.installed_version(), ROOT,
                                contract.SCHEDULER_ATTRIBUTES, contract.WORKER_KEYWORDS)
    assert verdict.ok and verdict.problems == []


def test_the_cli_refuses_an_edited_release_with_exit_2(tmp_path, monkeypatch, capsys):
    import targets
    from specrace import cli
    rel, edit, says = EDITS["a new helper reading a new attribute"]
    root = shadow(tmp_path, rel, edit)
    monkeypatch.setattr(static, "package_root", lambda package: root)
    monkeypatch.setattr(targets, "_TARGETS", {})  # loaded afresh, against the edited source
    assert cli.main(["repro", "ngram-filter-race", "--target", "sglang", "--trials", "1",
                     "--no-report"]) == 2
    err = capsys.readouterr().err
    assert "unsupported" in err and says in err and "reproduced" not in err


def test_a_huge_expression_is_a_problem_not_a_traceback(tmp_path):
    """20,000 terms in one expression: the reader gives up, named; it never raises."""
    huge = "x = " + " + ".join(["1"] * 20000) + "\n"
    root = shadow(tmp_path, SCHED, lambda t: t + huge)
    verdict = contract.evaluate(contract.installed_version(), root,
                                contract.SCHEDULER_ATTRIBUTES, contract.WORKER_KEYWORDS)
    assert verdict.tier == "unsupported" and verdict.problems


@pytest.mark.parametrize("rel", [SCHED, "srt/managers/overlap_utils.py"])
def test_a_file_that_does_not_parse_is_a_problem(tmp_path, rel):
    root = shadow(tmp_path, rel, lambda t: t + "\ndef broken(:\n")
    verdict = contract.evaluate(contract.installed_version(), root,
                                contract.SCHEDULER_ATTRIBUTES, contract.WORKER_KEYWORDS)
    assert verdict.tier == "unsupported" and verdict.problems


def test_a_changed_file_that_ran_makes_a_verified_release_compatible_and_is_named(
        tmp_path):
    """``utils/common.py`` (where ``async_d2h`` lives) is in no fixed list: it is checked
    because it ran. Edited, the release is compatible and the report names the file."""
    import targets
    from scenarios.resolve import run_scenario_result
    res = run_scenario_result("ngram-filter-race", target="sglang", backend="sim", trials=1)
    assert res.target_info["sglang_changed_files"] == []
    ran = targets.get("sglang").executed
    common = os.path.join(ROOT, "srt", "utils", "common.py")
    assert common in ran and res.target_info["sglang_executed_files"] == len(ran)
    # the same run's files, one of them edited (the wheel's record beside the copy)
    root = shadow(tmp_path, "srt/utils/common.py", lambda t: t + "\n# edited\n")
    for entry in os.listdir(os.path.dirname(ROOT)):
        if entry.startswith("sglang-") and entry.endswith(".dist-info"):
            os.symlink(os.path.join(os.path.dirname(ROOT), entry), tmp_path / entry)
    verdict = contract.evaluate(contract.installed_version(), root,
                                contract.SCHEDULER_ATTRIBUTES, contract.WORKER_KEYWORDS)
    files = [os.path.join(root, os.path.relpath(p, ROOT)) for p in ran]
    after = contract.with_executed(verdict, root, files)
    assert after.tier == "compatible" and after.changed == ["sglang/srt/utils/common.py"]
    assert "sglang/srt/utils/common.py" in after.line()
    pristine = contract.with_executed(
        contract.evaluate(contract.installed_version(), ROOT, contract.SCHEDULER_ATTRIBUTES,
                          contract.WORKER_KEYWORDS), ROOT, ran)
    assert pristine.changed == [] and pristine.tier == verdict.tier
