"""The ``specrace`` command line: its parser, one builder per subcommand; a parse error
is one line (``UsageError``), never argparse's usage block."""
from __future__ import annotations

import argparse
import os
from typing import Optional

from seams.vocab import TargetName

from specrace import cli_args as A

TARGETS = tuple(t.value for t in TargetName)  # what --target takes
UPSTREAM_TARGETS = ("sglang", "vllm")  # the targets with release environments


class UsageError(Exception):
    """Bad input: reported as one line (plus one per named problem), exit code 2."""

    def __init__(self, message: object, problems=()) -> None:
        super().__init__(message)
        self.problems = list(problems)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not argparse's usage block
        raise UsageError(message)


def build_parser(description: str = "specrace") -> argparse.ArgumentParser:
    p = _Parser(prog="specrace", description=description)
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    sub.required = True
    _target_arg(sub.add_parser("list", help="list scenarios, litmus programs and mutations"))
    _repro(sub.add_parser("repro", help="stall-amplified reproduction of a scenario"))
    _replay(sub.add_parser("replay", help="re-run a repro report and compare the verdict"))
    li = sub.add_parser("litmus", help="run the litmus programs, check expected verdicts")
    li.add_argument("--backend", choices=["sim", "cuda", "auto"], default="sim")
    li.add_argument("--json", action="store_true")
    m = sub.add_parser("matrix", help="the mutation kill matrix")
    m.add_argument("--backend", choices=["sim", "cuda", "auto"], default="sim")
    m.add_argument("--json", action="store_true")
    _target_arg(m)
    _releases(sub.add_parser("releases", help="one scenario on every installed release of "
                                              "an upstream target (make upstream SGLANG=V "
                                              "sets one up)"))
    from specrace.census_args import add_parsers as _census_parsers
    _census_parsers(sub)  # census, coverage
    _audit(sub.add_parser("audit", help="every scenario in every shipped configuration of "
                                        "the installed server (or each release named): "
                                        "one table, known races matched, a CI gate"))
    b = sub.add_parser("bench", help="benchmarks (figures, not tests)")
    b.add_argument("what", nargs="?", default="all", choices=["all", "runtime", "engine",
                                                              "matrix", "cuda", "grammar"])
    b.add_argument("--json", action="store_true")
    _target_arg(b, default=None, help_text="benchmark this target only (default: impl, and "
                                          "sglang next to it when installed)")
    return p


def _repro(r: argparse.ArgumentParser) -> None:
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
    r.add_argument("--load", default="none",
                   help="background work beside every trial, named for what causes it in "
                        "a server: none, bulk-d2h (KV offload), bulk-h2d (weight / LoRA "
                        "loads), host-busy (a CPU-bound host thread)")
    r.add_argument("--platform", choices=["cuda", "rocm"], default="cuda",
                   help="the hardware the target's code reads itself as running on "
                        "(sglang: every upstream is_cuda()/_is_hip branch as on it)")
    r.add_argument("--outputs-only", action="store_true",
                   help="judge the outputs only: no trace, no race detection -- on CUDA "
                        "the host then runs at its own speed (a traced op costs ~100 us), "
                        "so the wrong-token rate is the one a server sees")
    r.add_argument("--trials", type=A.trials)
    r.add_argument("--seed", type=A.seed, default=0)
    r.add_argument("--expect", choices=["clean", "race"], default=None,
                   help="the outcome the gate expects (exit 1 if not); without it the "
                        "verdict is reported and the exit is 0")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.add_argument("--report-dir", default=None, help="default: reports/runs")
    r.add_argument("--no-report", action="store_true")
    _target_arg(r)


def _replay(rp: argparse.ArgumentParser) -> None:
    rp.add_argument("report")
    rp.add_argument("--from", dest="source", choices=["schedule", "seed"],
                    help="each trial's recorded choices (default, if recorded) or the seed")
    rp.add_argument("--max-trials", type=A.trials, default=None,
                    help="refuse a report asking for more trials (default 1000)")
    rp.add_argument("--budget-s", type=A.budget_s, default=None,
                    help="stop past this much wall clock, between trials (default 600)")
    rp.add_argument("--json", action="store_true")


def _releases(rl: argparse.ArgumentParser) -> None:
    rl.add_argument("scenario")
    rl.add_argument("--target", choices=UPSTREAM_TARGETS, default="sglang",
                    help="the upstream server whose releases run (default: sglang)")
    rl.add_argument("--release", action="append", default=None,
                    help="only this release (repeatable; default: every one set up)")
    rl.add_argument("--variant", default=None,
                    help="default: every configuration the server ships (no patch): a row "
                         "per release x configuration")
    rl.add_argument("--war-barrier", choices=["fine", "coarse"], default=None,
                    help="default: each release's own")
    rl.add_argument("--load", default=None, help="as repro's --load")
    rl.add_argument("--platform", choices=["cuda", "rocm"], default=None,
                    help="as repro's --platform")
    rl.add_argument("--trials", type=A.trials)
    rl.add_argument("--seed", type=A.seed, default=0)
    rl.add_argument("--expect", choices=["clean", "race"], default=None,
                    help="every applicable release must give this outcome")
    rl.add_argument("--json", action="store_true")
    rl.add_argument("--coverage", action="store_true",
                    help="run each release under coverage.py: a column of the census sites "
                         "of the single-node paths it ran (docs/census.md)")
    rl.add_argument("--report-dir", default=os.path.join("reports", "releases"))


def _audit(au: argparse.ArgumentParser) -> None:
    au.add_argument("--target", choices=UPSTREAM_TARGETS, default="sglang",
                    help="the upstream server audited (default: sglang)")
    au.add_argument("--release", action="append", default=None,
                    help="audit this release, in its environment (repeatable; default: the "
                         "release this interpreter imports, else the newest set up)")
    au.add_argument("--scenario", action="append", default=None,
                    help="only this scenario (repeatable; default: every one)")
    au.add_argument("--trials", type=A.trials, default=3,
                    help="trials per configuration (default 3)")
    au.add_argument("--seed", type=A.seed, default=0)
    au.add_argument("--backend", choices=["sim", "cuda", "auto"], default="auto")
    au.add_argument("--jobs", type=A.int_in(1, 256), default=None,
                    help="configurations run side by side on the simulator, each in a fork "
                         "of the loaded process (default: one per core)")
    au.add_argument("--fail-on", choices=["race", "new"], default=None,
                    help="exit 1 when a row is a race (known or not) / a race no known "
                         "finding matches; an error row fails either (default: report only)")
    au.add_argument("--json", action="store_true", help="print the audit as one JSON object")
    au.add_argument("--jsonl", action="store_true",
                    help="stream the plan and each configuration's rows as JSON lines (what "
                         "a release's child prints)")
    au.add_argument("--report-dir", default=os.path.join("reports", "audit"),
                    help="audit.json, audit.md and the report sets (default: reports/audit)")
    au.add_argument("--no-report", action="store_true",
                    help="write nothing: no report sets, no audit.json / audit.md")


def _target_arg(p, default: Optional[str] = "impl", help_text: Optional[str] = None) -> None:
    p.add_argument("--target", choices=TARGETS, default=default,
                   help=help_text or "the code under test: specrace's impl/ mirror (default) "
                                     "or the installed sglang package")
