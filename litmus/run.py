"""The litmus oracle: does a backend give every litmus program its expected verdict?

On the simulator each program runs under each schedule policy; on CUDA it runs twice,
without and with the injected stall (policies ``cuda`` and ``cuda+stall``). A run
*agrees* when its observed staleness matches the program's expectation for that policy
kind (None accepts both) and the happens-before detector reports a race exactly when
the program has one. Agreement on both backends is how we know the simulator tells the
truth about the hardware.

A sim policy may carry a ``+stall`` suffix (``eager+stall``): the body then injects its
stall too. ``eager+stall`` is held to the ``cuda_stall`` expectation -- the simulator's
virtual-time stalls on an otherwise synchronous device must expose what a real stall
exposes; any other ``X+stall`` is held to X's expectation.
"""
from __future__ import annotations

from typing import Iterable, List, Optional, Sequence, Tuple, Union

from harness.detect import detect
from seams.vocab import Backend

DEFAULT_SIM_POLICIES = ("eager", "lazy", "stall", "random(1)", "random(2)", "pct(1,3)",
                        "pct(2,3)")
CUDA_POLICIES = ("cuda", "cuda+stall")


def _verdict(stale: Optional[bool], race: bool) -> str:
    s = "any" if stale is None else ("stale" if stale else "fresh")
    return f"{s}+{'race' if race else 'norace'}"


def sim_policy_spec(policy: str, program) -> Tuple[str, str, bool]:
    """(policy spelling for parse_policy, expectation kind, inject stall?) for a sim run.

    ``stall`` alone means ``stall(<the program's stalled stream>)``.
    """
    stall = policy.endswith("+stall")
    base = policy[: -len("+stall")] if stall else policy
    if base == "stall":
        base = f"stall({program.stalled_stream})"
    kind = base.split("(", 1)[0].strip()
    if stall and kind == "eager":
        kind = "cuda_stall"  # a synchronous device plus the stall: what the GPU shows
    # Other policies already defer streams; a stall marker changes none of their verdicts.
    return base, kind, stall


def _judge(program, policy: str, kind: str, observed: bool, races) -> dict:
    expected = program.expected_stale(kind)
    found = bool(races)
    agree = (expected is None or expected == observed) and found == program.race
    return {"name": program.name, "policy": policy,
            "expected": _verdict(expected, program.race),
            "observed": _verdict(observed, found),
            "races": [r.summary() for r in races],
            "agree": agree}


def _error_row(program, policy: str, kind: str, exc: BaseException) -> dict:
    return {"name": program.name, "policy": policy,
            "expected": _verdict(program.expected_stale(kind), program.race),
            "observed": f"error: {type(exc).__name__}: {exc}", "races": [], "agree": False}


def run_one_sim(program, policy: str) -> dict:
    from harness.policies import parse_policy
    from harness.runtime.sim.runtime import sim_runtime

    spec, kind, stall = sim_policy_spec(policy, program)
    shown = spec if policy == "stall" else policy
    pol = parse_policy(spec)  # a bad spelling is the caller's error: raise it
    try:
        with sim_runtime(pol) as rt:
            observed = program.run(rt, stall)
        races = detect(rt.trace)
    except Exception as exc:  # a simulator bug: report the row, keep the sweep going
        return _error_row(program, shown, kind, exc)
    return _judge(program, shown, kind, observed, races)


def run_one_cuda(program, policy: str) -> dict:
    from harness.runtime import open_runtime

    stall = policy == "cuda+stall"
    kind = "cuda_stall" if stall else "cuda"
    try:
        with open_runtime("cuda") as rt:
            observed = program.run(rt, stall)
            rt.synchronize()
        races = detect(rt.trace)
    except Exception as exc:
        return _error_row(program, policy, kind, exc)
    return _judge(program, policy, kind, observed, races)


def _select(programs) -> List:
    from litmus.programs import PROGRAMS, get
    if programs is None:
        return list(PROGRAMS)
    return [get(p) if isinstance(p, str) else p for p in programs]


def run_litmus(backend: str = "sim", policies: Optional[Sequence[str]] = None,
               programs: Optional[Iterable[Union[str, object]]] = None) -> dict:
    """Run the litmus programs on ``backend`` ("sim" or "cuda"); see the module docstring."""
    progs = _select(programs)
    rows = []
    if backend == Backend.SIM:
        for p in progs:
            for pol in (policies or DEFAULT_SIM_POLICIES):
                rows.append(run_one_sim(p, pol))
    elif backend == Backend.CUDA:
        for p in progs:
            for pol in (policies or CUDA_POLICIES):
                if pol not in CUDA_POLICIES:
                    raise ValueError(f"cuda litmus policy must be one of {CUDA_POLICIES}")
                rows.append(run_one_cuda(p, pol))
    else:
        raise ValueError(f"unknown litmus backend {backend!r}; expected sim or cuda")
    return {"backend": backend, "total": len(rows),
            "agree": sum(1 for r in rows if r["agree"]), "programs": rows}
