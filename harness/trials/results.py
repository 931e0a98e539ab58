"""What a ``repro`` run found, typed: ``ReproResult`` and its per-trial ``TrialSummary``.

These are the data every reader uses -- the report files, the console, ``replay``, the
pytest fixture -- and their formatters (``verdict_line``). ``to_json`` is the one place
their JSON keys are written and ``from_json`` the one place they are read back (from a
report ``harness.report.schema`` has validated); the keys are stable, so scripts that read
report files (``tools/reports/h200_summary.py``, ``tools/reports/upstream_audit.py``) keep working.
Divergences are ``harness.oracle.divergence.Divergence`` and races the detector's own
``harness.detect.Race`` (aggregated over the trials, with counts).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from harness.detect import Race
from harness.oracle.divergence import Divergence, DivergenceKind
from seams.faults.plan import StallAt
from harness.runtime.policy import Schedule, decode_schedules
from seams.vocab import FENCED_TARGETS, Backend, Platform, Verdict

if TYPE_CHECKING:
    from harness.runtime.trace import Trace


@dataclass(frozen=True)
class TrialSummary:
    """One trial's row: its seed, whether it reproduced, by which divergence kind."""
    trial: int  # 0-based
    seed: int  # the workload's seed (the run's seed + trial)
    reproduced: bool
    divergence: Optional[DivergenceKind]
    races: int  # race sites found in this trial
    traced: bool  # its trace was captured (the detector ran)
    ms: float
    checked: int  # values the stale-value oracle compared

    def to_json(self) -> Dict[str, Any]:
        return {"trial": self.trial, "seed": self.seed, "reproduced": self.reproduced,
                "divergence": self.divergence, "races": self.races, "traced": self.traced,
                "ms": self.ms, "checked": self.checked}

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "TrialSummary":
        return cls(**{k: doc[k] for k in ("trial", "seed", "reproduced", "divergence",
                                          "races", "traced", "ms", "checked")})

def load_identity(load: str) -> Dict[str, Any]:
    """A run's load as part of its identity: absent when there is none, so a run without
    background work keeps the name it always had."""
    return {} if load == "none" else {"load": load}


def platform_identity(platform: str) -> Dict[str, Any]:
    """A run's platform as part of its identity: absent on CUDA, the default."""
    return {} if platform == Platform.CUDA else {"platform": platform}


def code_identity(target_info: Dict[str, Any]) -> Dict[str, Any]:
    """What of the code under test changes a run: the installed release and its files
    digest (the sglang target); impl/ is this tree's own."""
    return {k: v for k, v in (target_info or {}).items()
            if k.endswith(("_version", "_files_digest"))}

@dataclass
class ReproResult:
    scenario: str
    variant: str
    war_barrier: str
    backend: str  # sim | cuda
    policy: str  # the simulator policy's spelling; "hardware" on CUDA
    stall_ms: Optional[float]
    seed: int  # trial i ran workload seed + i
    trials: int
    reproduced: int  # trials that diverged or raced
    expect: Optional[str]  # clean | race; None: nobody stated one
    target: str = "impl"
    first_trial: Optional[int] = None  # 0-based, the first that reproduced
    first_divergence: Optional[Divergence] = None
    races: List[Race] = field(default_factory=list)  # every trial's sites, counted
    trial_results: List[TrialSummary] = field(default_factory=list)
    # every trial's schedule (simulator; None on CUDA, and for a trial that never ran):
    # replay re-runs from these; a report keeps their text form (``Schedule.encode``)
    schedules: Optional[List[Optional[Schedule]]] = None
    median_trial_ms: Optional[float] = None
    expected_by_scenario: Optional[str] = None
    target_info: Dict[str, Any] = field(default_factory=dict)
    stall_plan: List[StallAt] = field(default_factory=list)
    host_order: Dict[str, Any] = field(default_factory=dict)
    command: Optional[str] = None  # the command line that ran it (the CLI's)
    load: str = "none"  # background work beside the run (``harness.runtime.load``)
    platform: str = "cuda"  # the hardware the code under test read itself as running on
    report_files: Optional[Dict[str, Optional[str]]] = None  # where its report set went
    # The trial the report shows (the first failing one, else trial 0): its trace and
    # the races in it. Not part of the JSON -- a report set writes them as its own files.
    trace: Optional[Trace] = field(default=None, repr=False, compare=False)
    trace_races: List[Race] = field(default_factory=list, repr=False, compare=False)

    @property
    def outcome(self) -> str:
        return Verdict.RACE if self.reproduced else Verdict.CLEAN

    @property
    def reference_crashed(self) -> bool:
        """The first reproduction is the synchronous reference run crashing, and no trial
        raced: the engine fails without any overlap, so nothing about a race was shown."""
        d = self.first_divergence
        return (d is not None and d.kind in ("crash", "deadlock") and d.where == "reference"
                and not self.races)

    @property
    def matches_expectation(self) -> Optional[bool]:
        """None without an expectation: an outcome nobody stated cannot mismatch. A race
        expected is not met by a reference run that crashed (``reference_crashed``)."""
        if self.expect is None:
            return None
        if self.expect == Verdict.RACE and self.reference_crashed:
            return False
        return self.outcome == self.expect

    @property
    def rate(self) -> float:
        return self.reproduced / self.trials if self.trials else 0.0

    @property
    def traced_trials(self) -> int:
        return sum(t.traced for t in self.trial_results)

    @property
    def detected(self) -> bool:
        """Were the trials traced for races (``--outputs-only``: not)? Every trial is, or
        none (a report without trial rows: as a run that traced)."""
        return all(t.traced for t in self.trial_results) if self.trial_results else True

    def identity(self) -> Dict[str, Any]:
        """Every setting that changed what ran (``Run.identity`` before the run
        gives the same): the report set's name is made from it."""
        return {"scenario": self.scenario, "target": self.target, "variant": self.variant,
                "war_barrier": self.war_barrier, "backend": self.backend,
                "policy": self.policy, "stall_ms": self.stall_ms, "trials": self.trials,
                "seed": self.seed,
                "detect": self.detected,
                "stall_plan": [s.to_json() for s in self.stall_plan],
                "host_order": dict(self.host_order),
                "code": code_identity(self.target_info), **load_identity(self.load),
                **platform_identity(self.platform)}

    def heading(self) -> str:
        """``SCENARIO [VARIANT, FENCE fence] on BACKEND``: how every view names the run (the
        fence only where the target has one: ``FENCED_TARGETS``)."""
        return f"{self.scenario} [{self.variant}{self._fence()}] on {self.backend}"

    def _fence(self) -> str:
        return f", {self.war_barrier} fence" if self.target in FENCED_TARGETS else ""

    def verdict_line(self) -> str:
        n, t = self.reproduced, self.trials
        extra = f", first at trial {self.first_trial + 1}" if self.first_trial is not None else ""
        median = "?" if self.median_trial_ms is None else f"{self.median_trial_ms:.1f}"
        return (f"{'reproduced' if n else 'clean'} {n}/{t} ({100.0 * self.rate:.0f}%){extra}, "
                f"median trial {median} ms -- {self.scenario}{self.target_tag()} "
                f"[{self.variant}{self._fence()}] on {self.backend} "
                f"({self.policy}{'' if self.load == 'none' else ', load ' + self.load}"
                f"{'' if self.platform == 'cuda' else ', read as ' + self.platform}); "
                f"{len(self.races)} race site(s)" + self._expectation())

    def _expectation(self) -> str:
        if self.expect is None:
            return ""
        return f"; expected {self.expect}: {'OK' if self.matches_expectation else 'MISMATCH'}"

    def repro_command(self, backend: Optional[str] = None) -> str:
        """The ``specrace repro`` command line that runs this again (on ``backend``: the
        simulator, say, for a CUDA report on a machine without a GPU)."""
        parts = ["specrace", "repro", self.scenario]
        if self.target != "impl":
            parts += ["--target", self.target]
        parts += ["--variant", self.variant]
        if self.target in FENCED_TARGETS:
            parts += ["--war-barrier", self.war_barrier]
        parts += ["--backend", backend or self.backend]
        if self.backend == Backend.SIM:  # a CUDA run's schedule was the GPU's
            parts += ["--policy", self.policy]
        if self.stall_ms is not None:
            parts += ["--stall-ms", str(self.stall_ms)]
        if self.load != "none":
            parts += ["--load", self.load]
        if not self.detected:
            parts += ["--outputs-only"]
        if self.platform != Platform.CUDA:
            parts += ["--platform", self.platform]
        parts += ["--trials", str(self.trials), "--seed", str(self.seed)]
        if self.expect is not None:
            parts += ["--expect", self.expect]
        return shlex.join(parts)

    def target_tag(self) -> str:
        if self.target == "impl":
            return ""
        version = self.target_info.get(f"{self.target}_version")
        return f" (target {self.target}{' ' + str(version) if version else ''})"

    def to_json(self) -> Dict[str, Any]:
        out = {
            "scenario": self.scenario, "target": self.target, "target_info": self.target_info,
            "variant": self.variant, "war_barrier": self.war_barrier,
            "backend": self.backend, "policy": self.policy,
            "stall_ms": self.stall_ms, "stall_plan": [s.to_json() for s in self.stall_plan],
            "host_order": dict(self.host_order),
            "seed": self.seed, "trials": self.trials, "reproduced": self.reproduced,
            "rate": self.rate, "first_trial": self.first_trial,
            "median_trial_ms": self.median_trial_ms,
            "expect": self.expect, "expected_by_scenario": self.expected_by_scenario,
            "outcome": self.outcome, "matches_expectation": self.matches_expectation,
            "first_divergence": (None if self.first_divergence is None
                                 else self.first_divergence.to_json()),
            "races": [r.to_json() for r in self.races],
            "traced_trials": self.traced_trials,
            "trial_results": [t.to_json() for t in self.trial_results],
            "schedules": (None if self.schedules is None else
                          [None if s is None else s.encode() for s in self.schedules]),
            "command": self.command, "load": self.load, "platform": self.platform,
        }
        if self.report_files is not None:
            out["report_files"] = dict(self.report_files)
        return out

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "ReproResult":
        """From a report ``harness.report.schema`` validated: the keys it may lack (older
        reports, crafted ones) get the values a run without them would have. ``outcome``,
        ``rate`` and the like are derived, never read."""
        div = doc.get("first_divergence")
        return cls(
            scenario=doc["scenario"], variant=doc["variant"], war_barrier=doc["war_barrier"],
            backend=doc["backend"], policy=doc["policy"], stall_ms=doc["stall_ms"],
            seed=doc["seed"], trials=doc["trials"], reproduced=doc["reproduced"],
            expect=doc.get("expect"), target=doc.get("target", "impl"),
            first_trial=doc.get("first_trial"),
            first_divergence=None if div is None else Divergence.from_json(div),
            races=[Race.from_json(r) for r in doc["races"]],
            trial_results=[TrialSummary.from_json(t) for t in doc.get("trial_results") or []],
            schedules=_schedules(doc.get("schedules")),
            median_trial_ms=doc.get("median_trial_ms"),
            expected_by_scenario=doc.get("expected_by_scenario"),
            target_info=dict(doc.get("target_info") or {}),
            stall_plan=[StallAt(s["point"], s.get("ms"), s.get("every", 1))
                        for s in doc.get("stall_plan") or []],
            host_order=dict(doc.get("host_order") or {}), command=doc.get("command"),
            report_files=doc.get("report_files"), load=doc.get("load", "none"),
            platform=doc.get("platform", "cuda"))


def _schedules(texts: Optional[List[Optional[str]]]) -> Optional[List[Optional[Schedule]]]:
    """A report's schedules, decoded under ``Schedule.decode``'s caps (``ValueError``:
    ``'schedules'[i]: ...``)."""
    if texts is None:
        return None
    try:
        return decode_schedules(texts)
    except ValueError as exc:
        raise ValueError(f"'schedules'{exc}") from None
