"""``specrace``: list | repro | replay | litmus | matrix | bench.

Exit codes: 0 = the outcome matches what was expected (``repro`` without ``--expect``:
it ran), 1 = it does not, 2 = bad input, a report that cannot be written or output that
cannot be (always one line on stderr, never a traceback), 130 / 143 = interrupted by
SIGINT / SIGTERM (one line; the report folder keeps its previous set).
"""
from __future__ import annotations

if __name__ == "__main__":  # ``python -m specrace.cli``: the signal policy before the imports
    from seams import signals as _signals
    _signals.install()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
from typing import List, Optional  # noqa: E402

from specrace import cli_args as A  # noqa: E402

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input: reported as one line (plus one per named problem), exit code 2."""

    def __init__(self, message: object, problems=()) -> None:
        super().__init__(message)
        self.problems = list(problems)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not argparse's usage block
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="specrace", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    sub.required = True

    ls = sub.add_parser("list", help="list scenarios, litmus programs and mutations")
    _target_arg(ls)

    r = sub.add_parser("repro", help="stall-amplified reproduction of a scenario")
    r.add_argument("scenario")
    r.add_argument("--variant", help="fixed | pre-fix | as-installed | ... (per scenario; "
                                     "default on --target sglang: as-installed)")
    r.add_argument("--war-barrier", choices=["fine", "coarse"], default=None,
                   help="default: fine on impl; on sglang the release's own (fine where its "
                        "NGRAM forward publishes read-done, 0.5.18+; else coarse)")
    r.add_argument("--backend", choices=["sim", "cuda", "auto"], default="auto")
    r.add_argument("--policy", type=A.policy, help="simulator schedule policy (eager, lazy, "
                                                  "stall(S), random(SEED), pct(SEED,DEPTH))")
    r.add_argument("--stall-ms", type=A.stall_ms, default=None,
                   help="stall length; default: until forced (sim) / 1 ms (cuda)")
    r.add_argument("--trials", type=A.trials)
    r.add_argument("--seed", type=A.seed, default=0)
    r.add_argument("--expect", choices=["clean", "race"], default=None,
                   help="the outcome the gate expects (exit 1 if not); without it the "
                        "verdict is reported and the exit is 0")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.add_argument("--report-dir", default=None, help="default: reports/runs")
    r.add_argument("--no-report", action="store_true")
    _target_arg(r)

    rp = sub.add_parser("replay", help="re-run a repro report and compare the verdict")
    rp.add_argument("report")
    rp.add_argument("--from", dest="source", choices=["schedule", "seed"],
                    help="each trial's recorded choices (default, if recorded) or the seed")
    rp.add_argument("--max-trials", type=A.trials, default=None,
                    help="refuse a report asking for more trials (default 1000)")
    rp.add_argument("--budget-s", type=A.budget_s, default=None,
                    help="stop past this much wall clock, between trials (default 600)")
    rp.add_argument("--json", action="store_true")

    li = sub.add_parser("litmus", help="run the litmus programs, check expected verdicts")
    li.add_argument("--backend", choices=["sim", "cuda", "auto"], default="sim")
    li.add_argument("--json", action="store_true")

    m = sub.add_parser("matrix", help="the mutation kill matrix")
    m.add_argument("--backend", choices=["sim", "cuda", "auto"], default="sim")
    m.add_argument("--json", action="store_true")
    _target_arg(m)

    rl = sub.add_parser("releases", help="one scenario on every installed release of an "
                                          "upstream target (make upstream SGLANG=V sets "
                                          "one up)")
    rl.add_argument("scenario")
    rl.add_argument("--target", choices=["sglang"], default="sglang",
                    help="the upstream server whose releases run (default: sglang)")
    rl.add_argument("--release", action="append", default=None,
                    help="only this release (repeatable; default: every one set up)")
    rl.add_argument("--variant", default=None, help="default: as-installed")
    rl.add_argument("--war-barrier", choices=["fine", "coarse"], default=None,
                    help="default: each release's own")
    rl.add_argument("--trials", type=A.trials)
    rl.add_argument("--seed", type=A.seed, default=0)
    rl.add_argument("--expect", choices=["clean", "race"], default=None,
                    help="every applicable release must give this outcome")
    rl.add_argument("--json", action="store_true")
    rl.add_argument("--report-dir", default=os.path.join("reports", "releases"))

    b = sub.add_parser("bench", help="benchmarks (figures, not tests)")
    b.add_argument("what", nargs="?", default="all", choices=["all", "runtime", "engine",
                                                              "matrix", "cuda", "grammar"])
    b.add_argument("--json", action="store_true")
    _target_arg(b, default=None, help_text="benchmark this target only (default: impl, and "
                                          "sglang next to it when installed)")
    return p


def _target_arg(p, default: Optional[str] = "impl", help_text: Optional[str] = None) -> None:
    p.add_argument("--target", choices=["impl", "sglang"], default=default,
                   help=help_text or "the code under test: specrace's impl/ mirror (default) "
                                     "or the installed sglang package")


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
        args = build_parser().parse_args(argv)
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
    from seams import signals
    with signals.deferred():  # no interrupt raised into a C extension's initialisation
        import torch  # noqa: F401 -- every command needs it; matplotlib comes before a write
    from harness.runtime import BackendError
    from harness.runtime.limits import LimitError, check_environment
    from harness.target import TargetError
    try:
        if args.command != "list":
            check_environment()  # a bad SPECRACE_* setting fails before any work
        if args.command == "list":
            return cmd_list(args)
        if args.command == "repro":
            return cmd_repro(args)
        if args.command == "replay":
            return cmd_replay(args)
        if args.command == "litmus":
            return cmd_litmus(args)
        if args.command == "matrix":
            return cmd_matrix(args)
        if args.command == "releases":
            return cmd_releases(args)
        if args.command == "bench":
            return cmd_bench(args)
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
        stall_ms=args.stall_ms, trials=args.trials, seed=args.seed, expect=args.expect))
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
            result.report_files = write_reports(result, report_dir)
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
    import subprocess
    cmd = [python, "-m", "specrace.cli", *sys.argv[1:]] if sys.argv[1:2] == ["replay"] \
        else [python, "-m", "specrace.cli", "replay", args.report]
    print(f"specrace: replaying in {_line(os.path.dirname(os.path.dirname(python)))}",
          file=sys.stderr)
    try:
        return subprocess.run(cmd).returncode
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
    rows = A.with_progress(
        lambda prog: run_releases(environments, target.name, scenario.name, options,
                                  args.report_dir, versions, prog),
        len(versions), f"{scenario.name} on {len(versions)} release(s)", quiet=args.json)
    if args.json:
        print(json.dumps(rows, default=str))
    else:
        from seams.text import printable
        print(printable(format_table(target.name, scenario.name, rows), keep_newlines=True))
    bad = [r for r in rows if r["outcome"] == "error"
           or (args.expect and r["outcome"] not in (args.expect, "not applicable"))]
    return EXIT_MISMATCH if bad else EXIT_OK


def cmd_bench(args) -> int:
    if args.target is not None:  # a target asked for and missing: before any figure
        _load_target(args.target)
    from specrace.bench import run_bench
    res = run_bench(args.what, quiet=args.json, target=args.target)
    if args.json:
        print(json.dumps(res, default=str))
    return EXIT_OK


if __name__ == "__main__":  # the process around main() is the console script's
    import runpy
    runpy.run_module("specrace.console", run_name="__main__")
