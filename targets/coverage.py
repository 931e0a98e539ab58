"""Coverage of the census: which ordering sites ran, in which scenario, and why the rest
did not -- read from the runs themselves.

Each scenario runs as ``specrace repro SCENARIO --target T --trials 1`` in a child: the
release's own interpreter (its environment, as ``specrace releases`` runs it), under
coverage.py measuring the package's files (``specrace.coverage_child``). A site ran when
coverage.py saw a line of its statement execute (``Site.span``: a compound statement's
header only). A site that did not run gets the first of its target's reason rules that
names it (``targets/{sglang,vllm}/environments/census.py``: path, function, enclosing
if-tests, the call's text), else "not reached by any scenario". The headline counts the
sites of the single-node paths: all but the other-hardware and multi-node categories.

    coverage(target, release, scenarios=(), progress=...) -> CoverageResult
    ran_sites(sites, lines_by_file) -> set of Site.key      # the mapping alone
    classify(site, rules) -> category
    rule_words(site, rules) -> the matching rule's own words ("pooling models"), or ""
    RowCoverage(target, version)   # a ``specrace releases --coverage`` row's figures
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from harness.run import refused_variant
from seams import children
from seams.children import child_error
from targets.census import Census, CensusError, Site, census, spec_of
from targets.census_rules import NOT_REACHED, OFF_NODE

CHILD_TIMEOUT_S = 1800  # a scenario's run that has not answered by then is a harness error
REFUSED = "refused"  # measure's outcome when the child refused the variant on this release
Key = Tuple[str, int, int, str]


@dataclass(frozen=True)
class ScenarioRun:
    scenario: str  # "name" or "name:variant"
    status: str  # "ran" | "error" | "not applicable" | "not driven"
    note: str = ""
    outcome: Optional[str] = None  # the repro's verdict, where it gave one
    ran: frozenset = frozenset()  # Site.key of every census site it ran


@dataclass
class CoverageResult:
    census: Census
    runs: List[ScenarioRun]
    categories: Dict[Key, str] = field(default_factory=dict)  # the reason rule per site
    whys: Dict[Key, str] = field(default_factory=dict)  # that rule's own words, if any

    @property
    def ran(self) -> Set[Key]:
        out: Set[Key] = set()
        for r in self.runs:
            out |= r.ran
        return out

    def single_node(self, site: Site) -> bool:
        return self.categories.get(site.key, NOT_REACHED) not in OFF_NODE

    def not_run(self) -> List[Tuple[Site, str]]:
        """Every site no scenario ran, with its reason, in census order."""
        ran = self.ran
        return [(s, self.categories.get(s.key, NOT_REACHED)) for s in self.census.sites
                if s.key not in ran]

    def summary(self) -> Dict[str, Any]:
        ran = self.ran
        sites = self.census.sites
        single = [s for s in sites if self.single_node(s)]
        dirs: Dict[str, List[int]] = {}
        for s in sites:
            row = dirs.setdefault(s.directory, [0, 0, 0, 0])
            row[0] += 1
            row[1] += s.key in ran
            if self.single_node(s):
                row[2] += 1
                row[3] += s.key in ran
        reasons: Dict[str, int] = {}
        named: Dict[str, int] = {}  # category and the rule's words: what a reader acts on
        for site, category in self.not_run():
            reasons[category] = reasons.get(category, 0) + 1
            label = ": ".join(x for x in (category, self.whys.get(site.key, "")) if x)
            named[label] = named.get(label, 0) + 1
        return {
            "sites": len(sites), "ran": len(ran), "percent": _pct(len(ran), len(sites)),
            "single_node_sites": len(single),
            "single_node_ran": sum(s.key in ran for s in single),
            "single_node_percent": _pct(sum(s.key in ran for s in single), len(single)),
            "by_directory": [{"directory": d, "sites": v[0], "ran": v[1],
                              "single_node_sites": v[2], "single_node_ran": v[3]}
                             for d, v in sorted(dirs.items())],
            "by_scenario": [{"scenario": r.scenario, "status": r.status, "note": r.note,
                             "outcome": r.outcome, "ran": len(r.ran),
                             "single_node_ran": sum(1 for s in single if s.key in r.ran)}
                            for r in self.runs],
            "not_run_by_reason": dict(sorted(reasons.items())),
            "not_run_by_rule": dict(sorted(named.items(), key=lambda kv: (-kv[1], kv[0]))),
        }

    def to_json(self) -> Dict[str, Any]:
        ran = self.ran
        c = self.census
        return {"target": c.target, "package": c.package, "version": c.version,
                "areas": list(c.areas), "summary": self.summary(),
                "unreadable": [{"file": f, "why": w} for f, w in c.unreadable],
                "sites": [{**s.to_json(), "ran_in": [r.scenario for r in self.runs
                                                      if s.key in r.ran],
                           "reason": None if s.key in ran else self.categories[s.key],
                           "why": None if s.key in ran else self.whys.get(s.key, "")}
                          for s in c.sites]}


def _pct(n: int, d: int) -> Optional[float]:
    return round(100.0 * n / d, 1) if d else None


# --- the mapping and the reasons (pure) --------------------------------------------------

def ran_sites(sites: Iterable[Site], lines_by_file: Dict[str, Iterable[int]]) -> Set[Key]:
    """The sites a run executed: a line of the site's statement span among the lines
    coverage.py measured in its file (``lines_by_file``: package-relative paths)."""
    lines = {f: set(v) for f, v in lines_by_file.items()}
    out = set()
    for s in sites:
        seen = lines.get(s.file)
        if seen and any(n in seen for n in range(s.span[0], s.span[1] + 1)):
            out.add(s.key)
    return out


def _rule(site: Site, rules: Sequence[Tuple[str, ...]]) -> Optional[Tuple[str, ...]]:
    """The first rule that names the site (patterns ignore case: ``HiCacheController``
    is hicache's). A rule is (category, what it reads, pattern[, its own words])."""
    for rule in rules:
        what, pattern = rule[1], rule[2]
        if what == "guard":
            values: Tuple[str, ...] = site.guards
        else:
            values = ({"path": site.file, "function": site.function,
                       "text": site.text}.get(what, ""),)
        if any(re.search(pattern, v, re.IGNORECASE) for v in values):
            return rule
    return None


def classify(site: Site, rules: Sequence[Tuple[str, ...]]) -> str:
    """The category of the first rule that names the site, else "not reached by any
    scenario"."""
    rule = _rule(site, rules)
    return NOT_REACHED if rule is None else rule[0]


def rule_words(site: Site, rules: Sequence[Tuple[str, ...]]) -> str:
    """The matching rule's own words (which configuration, which hardware), or ""."""
    rule = _rule(site, rules)
    return rule[3] if rule is not None and len(rule) > 3 else ""


# --- the runs -----------------------------------------------------------------------------

def _split(spec: str) -> Tuple[str, Optional[str]]:
    name, _, variant = spec.partition(":")
    return name, (variant or None)


def _outcome(stdout: str) -> Optional[str]:
    lines = stdout.strip().splitlines()
    try:
        res = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return res.get("outcome") if isinstance(res, dict) else None


def measure(python: str, root: str, target: str, spec: str, backend: str = "sim",
            trials: int = 1, hop: Optional[str] = None
            ) -> Tuple[Optional[Dict[str, List[int]]], str, Optional[str]]:
    """One scenario under coverage.py in a child (started as ``seams.children`` starts
    every Python child; ``hop``: the release it is handed): (lines by package-relative
    file, or None; the note when there are none; the repro's outcome -- ``REFUSED``
    when the release refused the variant, with no lines: nothing of it ran)."""
    name, variant = _split(spec)
    argv = ["repro", name, "--target", target, "--trials", str(trials), "--seed", "0",
            "--backend", backend, "--no-report", "--json"]
    if variant:
        argv += ["--variant", variant]
    with tempfile.TemporaryDirectory(prefix="specrace-coverage-") as d:
        out = os.path.join(d, "lines.json")
        cmd = children.command(python, "-m", "specrace.coverage_child", out, root, *argv)
        env = children.env(hop=hop, PYTHONUNBUFFERED="1")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                                  timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None, f"no answer in {CHILD_TIMEOUT_S} s", None
        except OSError as exc:
            return None, f"cannot run {python}: {exc.strerror or type(exc).__name__}", None
        lines = read_lines(out)
        if lines is None:
            err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            return None, (err[-1] if err else f"exit {proc.returncode}")[:200], None
    outcome = _outcome(proc.stdout)
    note = ""
    if proc.returncode != 0:
        error = child_error(proc.stderr)
        if refused_variant(proc.returncode, error):
            # the release refused the configuration before any trial: not a run
            return None, error, REFUSED
        note = f"repro exited {proc.returncode}: {error}"[:300]
    return lines, note, outcome


def _python_and_scenarios(target: str, release: Optional[str]):
    import targets
    declared = targets.declared(target)
    if release is None:
        return sys.executable, declared, None
    environments = declared.environments()
    return environments.python(environments.line.check_release(release)), declared, \
        environments


def coverage(target: str, release: Optional[str] = None, scenarios: Sequence[str] = (),
             progress: Callable[[int, Optional[int]], None] = lambda n, t=None: None,
             backend: str = "sim", trials: int = 1,
             census_of: Optional[Census] = None, jobs: int = 1) -> CoverageResult:
    """Which of ``release``'s census sites ``scenarios`` run (default: every scenario of
    the target that applies to the release), each scenario in a child of the release's
    environment (``release=None``: the package installed here, this interpreter), at most
    ``jobs`` children at a time; the runs come back in the order asked."""
    c = census_of or census(target, release)
    spec = spec_of(target)
    python, declared, environments = _python_and_scenarios(target, release)
    # none named: every scenario, and the configurations the target adds for coverage
    asked = list(scenarios) or list(getattr(declared, "coverage_set", ()) or declared.scenarios)
    for s in asked:
        if not declared.supports(_split(s)[0]):
            raise CensusError(f"scenario {s[:80]!r} does not run on the {target} target")

    def run_one(s: str) -> ScenarioRun:
        name = _split(s)[0]
        if environments is not None:
            why = environments.not_applicable(c.version, name)
            if why:
                return ScenarioRun(s, "not applicable", why)
            cannot = environments.not_driven(c.version, name)
            if cannot:
                return ScenarioRun(s, "not driven", cannot)
        lines, note, outcome = measure(python, c.root, target, s, backend, trials,
                                       hop=None if release is None else c.version)
        if outcome == REFUSED:
            return ScenarioRun(s, "not driven", note)
        if lines is None:
            return ScenarioRun(s, "error", note)
        return ScenarioRun(s, "ran", note, outcome, frozenset(ran_sites(c.sites, lines)))

    # each run is a child process: threads here only wait on them
    progress(0, len(asked))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(run_one, s) for s in asked]
        for done, _ in enumerate(as_completed(futures), 1):
            progress(done, len(asked))
    runs = [f.result() for f in futures]
    return CoverageResult(c, runs, {x.key: classify(x, spec.RULES) for x in c.sites},
                          {x.key: rule_words(x, spec.RULES) for x in c.sites})


# --- one release's row (``specrace releases --coverage``) ----------------------------------

def read_lines(path: str) -> Optional[Dict[str, List[int]]]:
    """The lines ``specrace.coverage_child`` wrote, or None (it wrote nothing readable)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return {str(k): [int(n) for n in v] for k, v in data["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


class RowCoverage:
    """What ``specrace releases --coverage`` adds to a release's row: its child runs under
    coverage.py (``command``), and ``figures`` maps what ran onto the release's census
    (the single-node paths' sites, as the headline counts them)."""

    def __init__(self, target: str, version: str) -> None:
        self.rules = spec_of(target).RULES
        self.problem = ""
        try:
            self.census: Optional[Census] = census(target, version)
        except CensusError as exc:  # the row still runs, its coverage says why not
            self.census, self.problem = None, str(exc)
        self._dir = tempfile.mkdtemp(prefix="specrace-coverage-")
        self.out = os.path.join(self._dir, "lines.json")

    def command(self, cmd: List[str]) -> List[str]:
        """A child command of ``specrace.cli`` (as ``seams.children`` writes it), run
        under coverage.py instead."""
        if self.census is None or "specrace.cli" not in cmd:
            return cmd
        i = cmd.index("specrace.cli")
        return [*cmd[:i], "specrace.coverage_child", self.out, self.census.root, *cmd[i + 1:]]

    def figures(self) -> Dict[str, Any]:
        import shutil
        try:
            lines = read_lines(self.out)
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
        if self.census is None:
            return {"coverage_sites": None, "coverage_ran": None, "coverage_percent": None,
                    "coverage_note": self.problem}
        single = [s for s in self.census.sites if classify(s, self.rules) not in OFF_NODE]
        ran = ran_sites(single, lines) if lines is not None else None
        return {"coverage_sites": len(single),
                "coverage_ran": None if ran is None else len(ran),
                "coverage_percent": None if ran is None else _pct(len(ran), len(single))}
