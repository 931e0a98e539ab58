"""``specrace audit`` from a server's own test suite: the ``specrace_audit`` fixture (the
specrace pytest plugin registers it) and ``run_audit``, the function under it.

    def test_no_new_cross_stream_race(specrace_audit):
        specrace_audit(target="sglang")                   # fails on a race no finding knows

    def test_the_relay_scenarios(specrace_audit):
        doc = specrace_audit(scenarios=["ngram-filter-race"], fail_on="race")
        assert doc["rows"]                                # every row, as audit.json has it

The audit runs as the CLI runs it -- ``specrace audit --json`` in a child of this
interpreter (``seams.children``: the working directory off its path, its hash seed
pinned) -- so the test judges the server this interpreter imports (a pull request's
editable checkout, in a server's CI) with the start-up paid once, and a crash of the code
under test is a failed test with its cause, never a lost pytest worker. A failing audit
fails the test with the table; the report sets go under the test's ``tmp_path`` unless
``report_dir`` says where (a CI job keeps that folder as an artifact).
"""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Dict, Optional, Sequence

import pytest

AUDIT_TIMEOUT_S = 3600


class AuditError(RuntimeError):
    """The audit could not run (bad input, a server that cannot be loaded): its one line."""


def run_audit(target: str = "sglang", scenarios: Sequence[str] = (), trials: int = 3,
              fail_on: Optional[str] = "new", report_dir: Optional[str] = None,
              releases: Sequence[str] = (), python: Optional[str] = None,
              extra: Sequence[str] = ()) -> Dict[str, Any]:
    """``specrace audit --json`` run by ``python`` (default: this interpreter): the audit's
    document (``specrace.audit_view.document``: ``rows``, ``failing``, ``summary``, ...)."""
    from seams import children
    args = ["-m", "specrace.cli", "audit", "--target", target, "--json", "--trials",
            str(trials)]
    args += [a for s in scenarios for a in ("--scenario", s)]
    args += [a for r in releases for a in ("--release", r)]
    if fail_on:
        args += ["--fail-on", fail_on]
    args += ["--report-dir", report_dir] if report_dir else ["--no-report"]
    proc = subprocess.run(children.command(python or sys.executable, *args, *extra),
                          capture_output=True, text=True, timeout=AUDIT_TIMEOUT_S,
                          env=children.env())
    lines = proc.stdout.strip().splitlines()
    if proc.returncode not in (0, 1) or not lines:
        from seams.children import child_error
        raise AuditError(child_error(proc.stderr) or f"specrace audit exited {proc.returncode}")
    return json.loads(lines[-1])


@pytest.fixture
def specrace_audit(tmp_path):
    """``specrace_audit(target="sglang", scenarios=(), trials=3, fail_on="new", ...)``: the
    audit of the installed server; the test fails when a row meets ``fail_on`` (None:
    never), with the table and the report folder in its message."""
    def audit(fail_on: Optional[str] = "new", report_dir: Optional[str] = None,
              **kw: Any) -> Dict[str, Any]:
        folder = report_dir or str(tmp_path / "specrace-audit")
        try:
            doc = run_audit(fail_on=fail_on, report_dir=folder, **kw)
        except AuditError as exc:
            pytest.fail(f"specrace audit could not run: {exc}", pytrace=False)
        from specrace.audit_view import failing, table
        bad = failing(doc)
        if bad:
            pytest.fail(f"specrace audit: {len(bad)} row(s) meet --fail-on {fail_on} "
                        f"(reports: {folder})\n{table(doc, width=160)}", pytrace=False)
        return doc
    return audit
