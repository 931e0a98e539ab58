"""The contract: what the vLLM target relies on in the installed package, and its tier.

Read statically from the source (``targets.static``: nothing imported or run), before the
target touches the package, so a release that moved what the target calls or replaces is
a named problem -- never a crash half-way through a run.

Tiers, as for sglang: *verified* (a release measured here, with the digest of its driven
files), *compatible* (in ``SUPPORTED``, no problem: runs with one line on stderr),
*unsupported* (out of range or any problem: exit 2, every problem named).
"""
from __future__ import annotations

import ast
import inspect
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from packaging.specifiers import SpecifierSet

from targets import driven, static, tiers
from targets.vllm.engine.kernels import KERNEL_SEAMS, OPTIONAL_KERNELS
from targets.vllm.mrv2 import table as mrv2_table
from targets.vllm.boundary import handover, surface
from targets.vllm.boundary.surface import (  # noqa: F401 -- the contract's tables, here too
    CALLED, DRIVEN_MODULES, LATER_DRIVEN_MODULES, MRV2_CALLED, MRV2_MODULES, MRV2_SCENARIOS,
    SLICE_CALLED, SLICE_MODULES, SLICE_SCENARIOS, _GPU, _MRV2_RUNNER, _RUNNER)

# The V1 engine with async scheduling and spec decode from 0.13.0 (the release whose
# drafter made the seq-lens increment in place; a release with no V1 draft-model
# proposer -- 0.13.0, 0.14.0 -- drafts with EAGLE, the method its async scheduling
# accepts: targets/vllm/engine/loop.py draft_method) through to the newest
# release (0.34.0 has no V1 model runner: its scenarios are "not applicable" there, read
# below), and Model Runner V2 driven whole (0.17.0 on; check_mrv2).
SUPPORTED = SpecifierSet(">=0.13.0,<0.35", prereleases=True)

# release -> the digest of its driven files, as measured: every scenario's release sweep
# on the simulator (reports/upstream/vllm-releases.md). 0.17.0's seq-lens race was also
# run on an H100 (reports/gpu/h100-vllm-seq-lens.md).
VERIFIED: Dict[str, str] = {
    # the driven files' digests -- with Model Runner V2's modules (MRV2_MODULES) since
    # MRv2 is driven whole -- of the releases every driven scenario's sweep ran on here
    # (0.33.0 and 0.34.0: the MRv2 scenarios and the draft-token slice; 0.16.0: its V1
    # engine, its MRv2 is not driven)
    "0.16.0": "55cf1a0c6b1ba377",
    "0.17.0": "ed2f222b12d256b7",
    "0.17.1": "3cb1f22c74461a85",
    "0.18.0": "6a2bc46d622ffa33",
    "0.19.0": "4d40e730db203d43",
    "0.23.0": "b09c97afbd81a11c",
    "0.27.1": "16a11bc63e602399",
    "0.33.0": "00e727aa6f72a8de",
    # 0.34.0 has no draft_model.py: its digest was taken while that module counted as
    # "<missing>" (16c33cc8fa7b2b74); the same files without that entry give this one
    "0.34.0": "0d03dda1313cba96",
}

# What a scenario's code is, per release: scenario -> (what the release lacks without
# it, the code that has it). A release without it: the scenario is "not applicable".
SCENARIO_CODE: Dict[str, Tuple[str, str]] = {
    "vllm-accepted-count": ("V1 model runner's hybrid accepted-count update "
                            "(vllm/v1/worker/gpu_model_runner.py; from 0.34.0 only Model "
                            "Runner V2 ships, whose accepted counts stay on the device)",
                            f"{_RUNNER}:GPUModelRunner._update_states_after_model_execute"),
    "vllm-seq-lens-shadow": ("V1 model runner (vllm/v1/worker/gpu_model_runner.py; from "
                             "0.34.0 only Model Runner V2 ships)",
                             f"{_RUNNER}:GPUModelRunner._build_attention_metadata"),
    "vllm-seq-lens-shadow-amplified": ("V1 model runner (vllm/v1/worker/gpu_model_runner.py; "
                                       "from 0.34.0 only Model Runner V2 ships)",
                                       f"{_RUNNER}:GPUModelRunner._build_attention_metadata"),
    "vllm-input-prep": ("V1 model runner's input-prep fence (GPUModelRunner."
                        "synchronize_input_prep)",
                        f"{_RUNNER}:GPUModelRunner.synchronize_input_prep"),
    "vllm-v1-draft-copy": ("V1 model runner's draft-token host copy (vllm/v1/worker/"
                           "gpu_model_runner.py; from 0.34.0 only Model Runner V2 ships, "
                           "which writes no zeros on the host)",
                           f"{_RUNNER}:GPUModelRunner._copy_draft_token_ids_to_cpu"),
    "vllm-v1-valid-count": ("V1 model runner's valid-count copy (vllm/v1/worker/"
                            "gpu_model_runner.py; from 0.34.0 only Model Runner V2 ships)",
                            f"{_RUNNER}:GPUModelRunner._copy_valid_sampled_token_count"),
    "vllm-draft-tokens": ("Model Runner V2 draft-token handler (vllm/v1/worker/gpu/"
                          "spec_decode/utils.py: DraftTokensHandler)",
                          "vllm.v1.worker.gpu.spec_decode.utils:"
                          "DraftTokensHandler.set_draft_tokens"),
}


@dataclass
class Verdict:
    version: str
    tier: str  # verified | compatible | unsupported
    problems: List[str] = field(default_factory=list)
    digest: str = ""
    changed: List[str] = field(default_factory=list)
    engine: List[str] = field(default_factory=list)  # the problems the V1 engine has
    slices: List[str] = field(default_factory=list)  # the problems the slices have
    mrv2: List[str] = field(default_factory=list)  # the problems Model Runner V2 has

    @property
    def ok(self) -> bool:
        return self.tier != "unsupported"

    @property
    def slices_only(self) -> bool:
        """Unsupported for the engine alone: the slices can run."""
        return (not self.ok and bool(self.engine) and not self.slices
                and len(self.problems) == len(self.engine))

    def line(self) -> str:
        if self.tier == "compatible":
            return (f"vllm {self.version} is not a verified release; compatible (in "
                    f"{SUPPORTED}, its API checked): running it")
        return f"vllm {self.version}: {self.tier}"


def installed_version() -> str:
    """The installed vllm's version, or raise LookupError when it is not installed."""
    return tiers.installed_version("vllm")


def check_version(version: str) -> List[str]:
    return tiers.version_problems("vllm", version, SUPPORTED)


def check_api(root: str) -> List[str]:
    """Every difference between the source under ``root`` and what the V1 engine path
    relies on: the engine's shared side and the V1 runner's (``surface``: modules,
    names, parameters; ``targets.driven``), and each Triton kernel's stand-in."""
    problems = driven.problems(root, surface.ENGINE) + driven.problems(root, surface.V1)
    modules = driven_modules(root)
    for name, (fn, defined, launchers) in KERNEL_SEAMS.items():
        got, problem = static.params(root, f"{defined}:{name}")
        if got is None and name in OPTIONAL_KERNELS:
            continue  # not in this release (yet): nothing launches it
        if got is None:
            problems.append(f"the kernel {problem}")
        elif not _takes(fn, tuple(got)):
            ours = tuple(p for p in inspect.signature(fn).parameters if p != "grid")
            problems.append(f"the kernel {defined}.{name}{got} is not what specrace's "
                            f"stand-in takes {ours}")
        if got is None:
            continue
        # bound in each candidate that names it (kernels.installed): one must, and every
        # driven module that launches it must be one of those
        bound = [m for m in launchers if static.has_module_attribute(root, m, name)]
        if not bound:
            problems.append(f"{' / '.join(launchers)} no longer names the kernel {name} "
                            f"(its stand-in is bound where it is named)")
        for module in modules:
            if module not in bound and _launches(root, module, name):
                problems.append(f"{module} launches the kernel {name}, where specrace "
                                f"binds no stand-in")
    return list(dict.fromkeys(problems))  # a module both paths drive is named once


def _takes(fn, got: Tuple[str, ...]) -> bool:
    """Does the stand-in ``fn`` take the kernel parameters ``got``: each of them, in the
    same order, leaving out only parameters of its own with a default (one a later or
    earlier release adds: 0.23.0's synthetic rejection mode, 0.27.1's kernel blocks)?"""
    params = [p for p in inspect.signature(fn).parameters.values() if p.name != "grid"]
    kept = tuple(p.name for p in params if p.name in got)
    return kept == got and all(p.name in got for p in params if p.default is p.empty)


def _launches(root: str, module: str, name: str) -> bool:
    """Does ``module`` launch ``name[grid](...)``?"""
    parsed = static.parse(static.module_path(root, module))
    return parsed is not None and any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript)
        and isinstance(n.func.value, ast.Name) and n.func.value.id == name
        for n in ast.walk(parsed[0]))


def driven_modules(root: str) -> List[str]:
    """The driven modules of the release at ``root``: those of every release, and the
    later ones where it has them (so earlier releases' digests stay what they were)."""
    later = LATER_DRIVEN_MODULES + SLICE_MODULES + MRV2_MODULES
    return list(DRIVEN_MODULES) + [m for m in dict.fromkeys(later)
                                   if os.path.exists(static.module_path(root, m))]


def not_applicable(root: str, scenario: str) -> str:
    """Why ``scenario`` does not apply to the release at ``root`` ("" when it does)."""
    lacks, code = SCENARIO_CODE.get(scenario, ("", ""))
    if code and static.find(root, code)[0] is None:
        return f"the release has no {lacks}"
    return ""


def evaluate(version: str, root: Optional[str]) -> Verdict:
    problems = check_version(version)
    if root is None:
        return Verdict(version, "unsupported", problems + ["vllm's source cannot be found"])
    mrv2 = _guarded(check_mrv2, root)
    runner = driven.module_problem(root, _RUNNER)
    if runner.endswith(" is missing") or (
            not runner and static.find(root, f"{_RUNNER}:GPUModelRunner")[0] is None):
        # the engine's shared side still has to fit, for Model Runner V2's sake
        engine = _guarded(lambda r: driven.problems(r, surface.ENGINE), root)
        engine.append("vllm.v1.worker.gpu_model_runner.GPUModelRunner is missing (this "
                      "release ships Model Runner V2 only" + (
                          f", which the target cannot drive here: {mrv2[0]})" if mrv2
                          else "; the target drives it: " + ", ".join(MRV2_SCENARIOS) + ")"))
    else:  # a runner that is there and does not parse is named as such (check_api)
        engine = _guarded(check_api, root)
    # One engine driven is enough to run: the other's scenarios are refused when their
    # engine is built (path_problem), each with its first problem named
    problems += engine if mrv2 else []
    digest, changed = tiers.driven_files(root, driven_modules(root))
    return Verdict(version, tiers.release_tier(version, problems, digest, changed, VERIFIED),
                   problems, digest, changed, engine, check_slices(root), mrv2)


def _guarded(check, root: str) -> List[str]:
    try:
        return check(root)
    except (RecursionError, MemoryError) as exc:
        return [f"the contract could not read the source to the end ({type(exc).__name__})"]


def check_mrv2(root: str) -> List[str]:
    """What Model Runner V2 driven whole needs of the release at ``root``: the functions
    it calls with their parameters, the compiled op it stands in for, and each Triton
    kernel the driven modules launch -- defined where ``table`` says, with a stand-in
    that takes exactly its parameters (``table.choose``), or listed as never launched on
    the path (``table.NOT_LAUNCHED``)."""
    problems = driven.problems(root, surface.ENGINE)  # the engine's side it shares
    if static.find(root, _MRV2_RUNNER)[0] is None:
        module = _MRV2_RUNNER.partition(":")[0]
        unread = driven.module_problem(root, module)
        return problems + [unread if unread and not unread.endswith(" is missing") else
                           f"{_MRV2_RUNNER.replace(':', '.')} is missing (no Model Runner V2)"]
    problems += driven.problems(root, surface.MRV2)
    module, op = f"{_GPU}.buffer_utils", "get_accelerator_view_from_cpu_tensor"
    if not static.has_module_attribute(root, module, op):
        problems.append(f"{module} no longer names {op} (specrace's UVA view is bound "
                        f"there)")
    bound = set()
    for module, name, fns in mrv2_table.KERNELS:
        got, _ = static.params(root, f"{module}:{name}")
        if got is None:
            continue  # not in this release: bound only where defined
        bound.add((module, name))
        if mrv2_table.choose(fns, got) is None:
            problems.append(f"the kernel {module}.{name}{got} is not what any of "
                            f"specrace's stand-ins for it takes")
    for module in mrv2_table.DRIVEN_MODULES:
        for defined, name in mrv2_table.launched(root, module):
            if (defined, name) not in bound and (defined, name) not in \
                    mrv2_table.NOT_LAUNCHED:
                problems.append(f"{module} launches the kernel {defined}.{name}, for "
                                f"which specrace has no stand-in")
    return problems


def scenario_problems(verdict: Verdict, scenario: str) -> List[str]:
    """What stops ``scenario`` on a release: the version's own problems, then those of
    the code it drives -- its slice, Model Runner V2, or the V1 engine (a release may
    drive one and not another: 0.34.0 ships MRv2 only, 0.16.0's MRv2 kernels differ)."""
    own = (verdict.slices if scenario in SLICE_SCENARIOS else
           verdict.mrv2 if scenario in MRV2_SCENARIOS else verdict.engine)
    return check_version(verdict.version) + own


def path_problem(v2: bool) -> str:
    """Why the installed release's V1 engine (``v2`` False) or Model Runner V2 cannot be
    driven ("" when it can): its first problem, read from source once per process."""
    verdict = _installed_verdict()
    problems = verdict.mrv2 if v2 else verdict.engine
    return problems[0] if problems else ""


def refuse_undriven(v2: bool) -> None:
    """Raise ``TargetError`` naming why the engine a run asks for (the V1 runner, or Model
    Runner V2) is not driven in the installed release: a release may run one and not
    the other (0.34.0 ships MRv2 only; 0.16.0's MRv2 kernels differ), and the other's
    scenarios stop before anything is bound or built, the problem named, instead of
    crashing half-way through a run."""
    problem = path_problem(v2)
    if problem:
        from harness.target import TargetError
        what = "Model Runner V2" if v2 else "V1 engine"
        raise TargetError(f"--target vllm: vllm {installed_version()}'s {what} is not "
                          f"driven: {problem}")


_VERDICTS: Dict[str, Verdict] = {}


def _installed_verdict() -> Verdict:
    version, root = installed_version(), static.package_root("vllm")
    key = f"{version}@{root}"
    if key not in _VERDICTS:
        _VERDICTS[key] = evaluate(version, root)
    return _VERDICTS[key]


def check_slices(root: str) -> List[str]:
    """What the slices call, where the release has their code (a release without it: the
    slice scenario is not applicable there, no problem): their modules parse, each
    function they call has its kind and parameters, and what upstream hands the
    draft-token handler is what the slice's stand-in hands it (``handover``)."""
    present = {t: e for t, e in SLICE_CALLED.items()
               if static.find(root, t.rsplit(".", 1)[0])[0] is not None}
    problems = driven.problems(root, driven.Surface(later_modules=SLICE_MODULES,
                                                    functions=present))
    if present and not problems:
        # the slice's own speculator hands over a temporary: it reports on a release only
        # where upstream's does too (0.20.0-0.23.0 hand over a persistent buffer)
        problems += [p for p in [handover.problem(root)] if p]
    return problems
