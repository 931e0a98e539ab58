"""``specrace audit``'s command: arguments in, the audit run (``specrace.audit``), the table
and files out (``specrace.audit_view``), the exit status a CI job gates on.

Exit: 0 (no gate, or no row meets it), 1 (a row meets ``--fail-on``; one line on stderr
names the first), 2 (bad input: one line). ``--jsonl`` is the child's side of a release
audit (``audit_child`` reads it): the plan, then each configuration's rows, one JSON
object a line on stdout, for the release this interpreter imports.
"""
from __future__ import annotations

import json
import os
import sys

from specrace import cli_args as A
from specrace.parser import UsageError

EXIT_OK, EXIT_FAIL = 0, 1


def cmd_audit(args) -> int:
    import targets
    from specrace.audit import Options, audit_here, releases, run_audit
    target = targets.declared(args.target)  # the server is imported where it runs
    options = Options(target=target.name, trials=args.trials, seed=args.seed,
                      backend=args.backend, scenarios=tuple(args.scenario or ()),
                      report_dir=args.report_dir, reports=not args.no_report,
                      jobs=args.jobs)
    _check_scenarios(target, options.scenarios)
    if args.jsonl:
        if args.release:
            raise UsageError("--jsonl audits the release this interpreter imports; "
                             "--release is for the command that starts it")
        audit_here(options, lambda event: print(json.dumps(event, default=str), flush=True))
        return EXIT_OK
    try:
        where = releases(target, args.release or [])
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    _check_report_dir(options)
    for version, python in where:
        if python is not None:
            print(f"specrace: auditing {target.name} {version} in its environment "
                  f"({os.path.dirname(os.path.dirname(python))})", file=sys.stderr)
    from specrace.audit_view import document, failing, table, write
    done = A.with_progress(lambda prog: run_audit(options, where, prog), None,
                           f"audit of {target.name}", quiet=args.json)
    doc = document(options, done, args.fail_on)
    paths = _write(write, doc, options)
    if args.json:
        print(json.dumps(doc, default=str))
    else:
        from seams.text import printable
        print(printable(table(doc), keep_newlines=True))
        if paths:
            print(f"report: {paths['markdown']} (JSON: {paths['json']})")
    bad = failing(doc)
    if bad:
        first = bad[0]
        what = (first.get("pair") or {}).get("text") or first.get("note") or first["verdict"]
        from seams.text import bounded, printable
        _line = lambda text: bounded(printable(" ".join(str(text).split())))  # noqa: E731
        print(f"specrace: audit: {len(bad)} row(s) meet --fail-on {args.fail_on}; first: "
              f"{first.get('release')} {first['scenario']} [{first.get('variant')}] "
              f"{first['verdict']}: {_line(what)}", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


def _check_scenarios(target, names) -> None:
    from scenarios.registry import get
    for name in names:
        try:
            get(name)
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from None
        if name not in (target.scenarios or ()):
            raise UsageError(f"--scenario {name}: not a scenario of the {target.name} "
                             f"target; it runs: {', '.join(target.scenarios or ())}")


def _check_report_dir(options) -> None:
    """Before any release runs: a folder that cannot take the sets costs nothing."""
    if not options.reports:
        return
    from harness.report import ReportDirError, check_report_dir
    try:
        check_report_dir(options.report_dir)
    except ReportDirError as exc:
        raise UsageError(f"--report-dir: {exc}") from None


def _write(write, doc, options):
    """``audit.json`` / ``audit.md`` beside the report sets; a folder gone meanwhile is a
    line on stderr, not a lost table."""
    if not options.reports:
        return None
    try:
        return write(doc, options.report_dir)
    except OSError as exc:
        print(f"specrace: cannot write the audit to {options.report_dir!r}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return None
