"""What a user asked for, turned into a ``Run`` -- once, in one place.

A ``RunRequest`` carries names and unset fields (``None``: the default), as they come
from the CLI's arguments, a report handed to ``replay``, a pytest fixture's keywords or a
matrix cell. ``resolve`` takes every default there is to take -- the target's variant and
fence, the backend this machine has, the scenario's policy, trials and stall plan --
checks each against the code that will run, and returns the frozen ``harness.run.Run``
that ``run_repro`` executes. Every front door calls it; none defaults a field itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from harness.policies import SchedulePolicy
from harness.run import MAX_TRIALS, VARIANT_DISABLED, Run, Variant
from harness.runtime import resolve_backend
from harness.runtime.load import get_load
from harness.trials.repro import run_repro
from seams.faults.plan import StallAt
from seams.vocab import Backend, Fence, Verdict

from scenarios.registry import SCENARIOS


class ResolveError(ValueError):
    """The request cannot become a run (unknown name, a variant this code cannot run, an
    option the backend does not take): bad input, shown as one line."""


@dataclass(frozen=True)
class RunRequest:
    scenario: str
    target: str = "impl"
    variant: Optional[str] = None  # None: the target's default for the scenario
    war_barrier: Optional[str] = None  # None: the target's own fence
    backend: str = "auto"
    policy: Optional[SchedulePolicy] = None  # None: the scenario's (simulator only)
    stall_ms: Optional[float] = None
    trials: Optional[int] = None  # None: the scenario's for the backend
    seed: int = 0
    expect: Optional[str] = None
    detect: bool = True
    # a recorded run's fault plan and host-order answers (replay); None: the scenario's
    stall_plan: Optional[Sequence[StallAt]] = None
    host_order: Optional[Mapping[str, Any]] = None
    load: str = "none"  # background work: a name of ``harness.runtime.load.LOADS``
    platform: str = "cuda"  # the hardware the target's code reads itself as running on


def resolve(request: RunRequest, load_target=None) -> Run:
    """The run ``request`` asks for, every default taken (``ResolveError``, or the
    target's ``TargetError``, when it cannot run here). ``load_target``: name -> loaded
    target (default: the registry, ``targets.get``)."""
    scenario = SCENARIOS.get(request.scenario)
    if scenario is None:
        raise ResolveError(f"unknown scenario {request.scenario!r}; known: "
                           f"{', '.join(sorted(SCENARIOS))}")
    if request.variant is not None and request.variant not in scenario.variants:
        raise ResolveError(f"unknown variant {request.variant!r} for {scenario.name}; "
                           f"expected one of: {', '.join(scenario.variants)}")
    if load_target is None:  # after the cheap checks: loading sglang takes seconds
        import targets
        load_target = targets.get
    target = load_target(request.target)
    if not target.supports(scenario.name):
        raise ResolveError(f"scenario {scenario.name} does not run on the {target.name} "
                           f"target: {target.unsupported(scenario.name)}")
    variant = scenario.variants[request.variant or target.default_variant(scenario)]
    _check_variant(target, variant)
    war_barrier = _word(Fence, request.war_barrier or target.default_war_barrier(),
                        "--war-barrier")
    backend = Backend(resolve_backend(str(_word(Backend, request.backend, "--backend"))))
    if backend == Backend.CUDA and request.policy is not None:
        raise ResolveError("--policy applies to the simulator only (--backend sim)")
    trials = request.trials or (scenario.cuda_trials if backend == Backend.CUDA
                                else scenario.sim_trials)
    if not 1 <= trials <= MAX_TRIALS:
        raise ResolveError(f"trials must be in 1..{MAX_TRIALS}, not {trials}")
    return Run(scenario=scenario, target=target, variant=variant, war_barrier=war_barrier,
               backend=backend,
               policy=(request.policy or scenario.default_policy)
               if backend == Backend.SIM else None,
               trials=trials, seed=request.seed, stall_ms=request.stall_ms,
               stalls=tuple(request.stall_plan if request.stall_plan is not None
                            else scenario.stalls(request.stall_ms)),
               host_order=dict(request.host_order if request.host_order is not None
                               else scenario.answers),
               detect=request.detect, load=_load(request.load),
               platform=_platform(target, request.platform),
               expect=None if request.expect is None
               else _word(Verdict, request.expect, "--expect"))


def _check_variant(target, variant: Variant) -> None:
    """A variant whose patch no longer fits the installed code is disabled, named."""
    problem = target.variant_problem(variant)
    if problem:
        raise ResolveError(f"variant {variant.name!r} {VARIANT_DISABLED}: {problem}")
    patch = variant.patch(target)
    if patch is not None:
        from mutations import MutationError
        try:
            patch.check()
        except MutationError as exc:
            raise ResolveError(f"variant {variant.name!r}: {exc}") from None


def _platform(target, platform: str) -> str:
    if platform not in target.platforms:
        raise ResolveError(f"--platform {str(platform)[:40]!r}: the {target.name} target "
                           f"reads its code as {' or '.join(target.platforms)}")
    return platform


def _load(name: str):
    try:
        return get_load(str(name))
    except ValueError as exc:
        raise ResolveError(f"--load: {exc}") from None


def _word(kind, text, what: str):
    try:
        return kind.parse(str(text), what)
    except ValueError as exc:
        raise ResolveError(str(exc)) from None


def run_scenario_result(name: str, **kw):
    """Run a registered scenario like ``specrace repro`` (``kw``: the ``RunRequest``
    fields -- target, variant, war_barrier, backend, policy, stall_ms, trials, seed,
    expect): its ``ReproResult``. For scripts, benchmarks and tests."""
    return run_repro(resolve(RunRequest(scenario=name, **kw)))


def run_scenario(name: str, **kw) -> dict:
    """``run_scenario_result`` as a result dict (what ``specrace repro --json`` prints):
    the pytest plugin's ``scenario_runner`` fixture."""
    return run_scenario_result(name, **kw).to_json()
