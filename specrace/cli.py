"""``specrace``: list | repro | replay | litmus | matrix | releases | census | coverage | audit | bench.

Exit codes: 0 = the outcome matches what was expected (``repro`` without ``--expect``:
it ran), 1 = it does not, 2 = bad input, a report that cannot be written or output that
cannot be (always one line on stderr, never a traceback), 130 / 143 = interrupted by
SIGINT / SIGTERM (one line; the report folder keeps its previous set).
"""
from __future__ import annotations

if __name__ == "__main__":  # ``python -m specrace.cli``: the signal policy before the imports
    from seams import signals as _signals
    _signals.install()

import json  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
from typing import List, Optional  # noqa: E402

from specrace import cli_args as A  # noqa: E402
from specrace.parser import UsageError, build_parser  # noqa: E402,F401

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE = 0, 1, 2


def _load_target(name: str):
    """The target, loaded and checked; a target that cannot run here is bad input."""
    import targets
    try:
        return targets.get(name)
    except targets.TargetError as exc:
        raise UsageError(str(exc), exc.problems) from None


def main(argv: Optional[List[str]] = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a console that cannot show a character
        try:                                 # gets an escape, not a UnicodeEncodeError
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError):
            pass
    try:
        args = build_parser(__doc__.splitlines()[0]).parse_args(argv)
        return _dispatch(args)
    except UsageError as exc:
        _error(exc)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:  # SIGINT / SIGTERM (seams.signals)
        from seams import signals
        name = exc.signame if isinstance(exc, signals.Interrupted) else "SIGINT"
        print(f"specrace: interrupted ({name})", file=sys.stderr)
        return signals.status_of(exc)
    except BrokenPipeError:  # `specrace list | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _error(exc: object) -> None:
    print(f"specrace: error: {_line(exc)}", file=sys.stderr)
    for problem in getattr(exc, "problems", ()):
        print(f"specrace:   {_line(problem)}", file=sys.stderr)


def _line(text: object) -> str:
    """One printable line of bounded length (messages carry text from outside)."""
    from seams.text import bounded, printable
    return bounded(printable(" ".join(str(text).split())))


def _say(text: object) -> None:
    from seams.text import printable
    print(printable(text))


def _dispatch(args) -> int:
    if args.command in ("census", "coverage"):  # static reads and children: no torch here
        from specrace.census_cmd import run
        return run(args)
    from seams import signals
    with signals.deferred():  # no interrupt raised into a C extension's initialisation
        import torch  # noqa: F401 -- every command needs it; matplotlib comes before a write
    from harness.runtime import BackendError
    from harness.runtime.limits import LimitError, check_environment
    from harness.target import TargetError
    try:
        if args.command != "list":
            check_environment()  # a bad SPECRACE_* setting fails before any work
        command = _COMMANDS.get(args.command)
        if command is not None:
            return command(args)
    except (BackendError, LimitError) as exc:
        raise UsageError(str(exc)) from None
    except TargetError as exc:  # a target that cannot run here, or code that does not fit
        raise UsageError(str(exc), exc.problems) from None
    raise UsageError(f"unknown command {args.command!r}")


# --- commands -------------------------------------------------------------------------

def cmd_list(args) -> int:
    from scenarios.registry import SCENARIOS
    target = _load_target(args.target)
    info = target.describe()
    head = ", ".join(f"{k} {v}" for k, v in info.items() if k != "target" and v)
    print(f"target: {target.name} -- {target.summary}" + (f" ({head})" if head else ""))
    print("scenarios:")
    for s in SCENARIOS.values():
        if target.supports(s.name):
            variants = ", ".join(s.variants)
            print(f"  {s.name:<24} {s.summary}  [variants: {variants}]")
    from litmus.programs import PROGRAMS
    print(f"litmus programs: {len(PROGRAMS)} (specrace litmus)")
    print("mutations:")
    for mu in target.mutations():
        print(f"  {mu.name:<32} {mu.summary}")
    return EXIT_OK


def _resolve(request):
    """The run a request asks for; anything it cannot become is bad input (exit 2)."""
    from harness.target import TargetError
    from scenarios.resolve import ResolveError, resolve
    try:
        return resolve(request)
    except TargetError as exc:
        raise UsageError(str(exc), exc.problems) from None
    except ResolveError as exc:
        raise UsageError(str(exc)) from None


def cmd_repro(args) -> int:
    from harness.trials.repro import run_repro
    from harness.runtime.limits import gpu_watchdog
    from scenarios.resolve import RunRequest
    run = _resolve(RunRequest(
        scenario=args.scenario, target=args.target, variant=args.variant,
        war_barrier=args.war_barrier, backend=args.backend, policy=args.policy,
        stall_ms=args.stall_ms, trials=args.trials, seed=args.seed, expect=args.expect,
        load=args.load, platform=args.platform, detect=not args.outputs_only))
    report_dir = args.report_dir or os.path.join("reports", "runs")
    if not args.no_report:  # before the run: a folder that cannot take the set costs no trial
        from harness.report import ReportDirError, check_report_dir
        try:
            check_report_dir(report_dir)
        except ReportDirError as exc:
            raise UsageError(f"--report-dir: {exc}") from None
    with gpu_watchdog(str(run.backend), run.trials, args.stall_ms, "specrace repro"):
        result = A.with_progress(lambda prog: run_repro(run, prog), run.trials,
                                 f"{run.scenario.name} on {run.backend}", quiet=args.json)
    # Quoted, so it pastes into a shell as it ran (``--policy 'pct(7,3)'``).
    result.command = shlex.join(["specrace", *sys.argv[1:]]) if sys.argv else None
    write_error = None
    if not args.no_report:
        from harness.report import ReportDirError, write_reports
        try:
            from specrace.audit import report_context
            result.report_files = write_reports(result, report_dir,
                                                context=report_context(result))
        except ReportDirError as exc:  # the folder went away during the run
            write_error = f"--report-dir: {exc}"
        except OSError as exc:  # a full disk, a folder gone read-only: the verdict stands
            write_error = (f"cannot write the report to {report_dir!r}: "
                           f"{exc.strerror or exc}")
    if args.json:
        print(json.dumps(result.to_json(), indent=None, default=str))
    else:
        _say(result.verdict_line())
        if result.first_divergence is not None:
            _say("  first divergence: " + result.first_divergence.message)
        for race in result.races[:5]:
            _say("  race: " + race.summary())
        if result.report_files:
            _say("  report: " + result.report_files["markdown"])
    if write_error is not None:
        _error(write_error)
        return EXIT_USAGE
    return EXIT_MISMATCH if result.matches_expectation is False else EXIT_OK


def cmd_replay(args) -> int:
    from specrace.replay import load_report, release_python, replay_report
    from harness.runtime.limits import gpu_watchdog
    from specrace.replay import check_bounds
    try:
        report = load_report(args.report)  # validated first: the watchdog's budget is its trials
        check_bounds(report, args.max_trials)  # before the watchdog and the first trial
        python = release_python(report)
        if python is not None:  # the report's release, in its own environment
            return _in_release(python, args)
        run = report.result
        with gpu_watchdog(run.backend, run.trials, run.stall_ms, "specrace replay"):
            verdict = A.with_progress(
                lambda prog: replay_report(report, prog, from_=args.source,
                                           max_trials=args.max_trials,
                                           budget_s=args.budget_s),
                run.trials, "replay", quiet=args.json)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps(verdict, default=str))
    else:
        _say(verdict["summary"])
    return EXIT_OK if verdict["same"] else EXIT_MISMATCH


def _in_release(python: str, args) -> int:
    """This replay, run by the interpreter of the report's release environment (it reads
    and validates the report again itself); its output is this command's, its exit status
    this command's status."""
    from specrace.replay import hand_off
    argv = sys.argv[1:] if sys.argv[1:2] == ["replay"] else ["replay", args.report]
    print(f"specrace: replaying in {_line(os.path.dirname(os.path.dirname(python)))}",
          file=sys.stderr)
    try:
        return hand_off(python, argv)
    except OSError as exc:
        raise UsageError(f"cannot run {python}: {exc.strerror or exc}") from None


def cmd_litmus(args) -> int:
    from litmus.run import run_litmus
    from harness.runtime import resolve_backend
    res = run_litmus(backend=resolve_backend(args.backend))
    if args.json:
        print(json.dumps(res, default=str))
    else:
        for p in res["programs"]:
            mark = "ok " if p["agree"] else "BAD"
            print(f"{mark} {p['name']:<36} {p['policy']:<16} expected {p['expected']:<14} "
                  f"observed {p['observed']}")
        print(f"{res['agree']}/{res['total']} agree ({res['backend']})")
    return EXIT_OK if res["agree"] == res["total"] else EXIT_MISMATCH


def cmd_matrix(args) -> int:
    from harness.runtime import resolve_backend
    from matrix.run import format_matrix, matrix_ok, problem_line, run_matrix
    target = _load_target(args.target)
    backend = resolve_backend(args.backend)
    res = A.with_progress(lambda prog: run_matrix(backend, prog, target=target.name), None,
                         f"mutation matrix ({target.name})", quiet=args.json)
    if args.json:
        print(json.dumps(res, default=str))
    else:
        from seams.text import printable
        print(printable(format_matrix(res), keep_newlines=True))  # findings quote exceptions
    problem = problem_line(res)
    if problem is not None:
        print(f"specrace: {_line(problem)}", file=sys.stderr)
    return EXIT_OK if matrix_ok(res) else EXIT_MISMATCH


def cmd_releases(args) -> int:
    import targets
    from scenarios.registry import get
    from targets.releases import format_table, repro_options, run_releases
    target = targets.declared(args.target)  # the server is imported by each child only
    environments = target.environments()
    try:
        scenario = get(args.scenario)
        if not target.supports(scenario.name):
            raise ValueError(f"scenario {scenario.name} does not run on the {target.name} "
                             f"target")
        versions = environments.chosen(args.release or [])
        options = repro_options(scenario, args)
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for folder, why in environments.skipped():
        print(f"specrace: skipping release folder {_line(folder)}: {_line(why)}",
              file=sys.stderr)
    from harness.report import ReportDirError, check_report_dir
    try:  # before any release runs: a folder that cannot take the sets costs nothing
        check_report_dir(args.report_dir)
    except ReportDirError as exc:
        raise UsageError(f"--report-dir: {exc}") from None
    # no --variant: every configuration of the scenario the server ships (no patch), a
    # row per release x configuration
    from scenarios.configurations import shipped
    confs = [] if args.variant else [(c.variant, c.text()) for c in shipped(target.name,
                                                                              scenario)]
    cells = len(versions) * max(len(confs), 1)
    rows = A.with_progress(
        lambda prog: run_releases(environments, target.name, scenario.name, options,
                                  args.report_dir, versions, prog,
                                  coverage=getattr(args, "coverage", False),
                                  configurations=confs),
        cells, f"{scenario.name}: {cells} release x configuration cell(s)", quiet=args.json)
    from specrace.audit import annotate_known
    annotate_known(target.name, scenario.name, rows)  # each racing pair: known, or new
    from targets.releases import settle
    settle(rows)  # settled pairs only: the scenario's own race is absent
    if args.json:
        print(json.dumps(rows, default=str))
    else:
        from seams.text import printable
        print(printable(format_table(target.name, scenario.name, rows), keep_newlines=True))
    bad = [r for r in rows if r["outcome"] == "error"
           or (args.expect and r["outcome"] not in (args.expect, "not applicable",
                                                    "not driven"))]
    return EXIT_MISMATCH if bad else EXIT_OK


def cmd_bench(args) -> int:
    if args.target is not None:  # a target asked for and missing: before any figure
        _load_target(args.target)
    from specrace.bench import run_bench
    res = run_bench(args.what, quiet=args.json, target=args.target)
    if args.json:
        print(json.dumps(res, default=str))
    return EXIT_OK


def cmd_audit(args) -> int:
    from specrace.audit_cmd import cmd_audit as audit  # its own module: loaded when asked for
    return audit(args)


# The commands ``_dispatch`` runs once torch is loaded (census and coverage run before:
# static reads and children that need none of it).
_COMMANDS = {"list": cmd_list, "repro": cmd_repro, "replay": cmd_replay, "litmus": cmd_litmus,
             "matrix": cmd_matrix, "releases": cmd_releases, "bench": cmd_bench,
             "audit": cmd_audit}


if __name__ == "__main__":  # the process around main() is the console script's
    import runpy
    runpy.run_module("specrace.console", run_name="__main__")

