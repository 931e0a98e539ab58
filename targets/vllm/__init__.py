"""The ``vllm`` target: installed vLLM's own V1 engine loop with async scheduling and
speculative decoding, on the simulator or on a GPU.

``VllmTarget.load`` checks the contract on the source (``boundary.contract``), sets
vLLM's process defaults and platform answers (``boundary.platform``), imports the driven
modules and registers the toy models. The engine is upstream's ``EngineCore`` /
``AsyncScheduler`` / ``UniProcExecutor`` / ``GPUModelRunner`` (``engine.loop``); the
Triton kernels on the spec-decode path run as torch stand-ins for the run
(``engine.kernels``). Docs: docs/vllm-target.md.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Dict, Iterator, Optional

from harness.run import AS_INSTALLED
from harness.target import Target, TargetError
from targets import static
from targets.tiers import MetadataError
from targets.vllm.boundary import contract
from targets.vllm.boundary.server_args import VllmArgs

SCENARIOS = ("vllm-accepted-count", "vllm-seq-lens-shadow", "vllm-input-prep",
             "vllm-draft-tokens", "vllm-mrv2", "vllm-mrv2-draft-tokens",
             "vllm-v1-draft-copy", "vllm-mrv2-uva-pool", "vllm-v1-valid-count",
             "vllm-seq-lens-shadow-amplified")
# What ``specrace coverage`` runs by default: every scenario as shipped, and the
# configurations that run census sites none of them does -- structured outputs on the V1
# runner (its grammar bitmask, structured_output/utils.py) and requests asking for
# logprobs and prompt logprobs (their host copies, outputs.py and the runner's
# prompt-logprobs chunks: +8 sites on 0.17.0; on Model Runner V2 +3 on 0.34.0, where
# V1 is gone). The other axes measured
# (async off, the hybrid model; MRv2 with async off, chunked prefill, structured outputs,
# 1 or 4 proposed tokens) ran no further site on 0.17.0 (2026-12-07).
COVERAGE_SET = SCENARIOS + ("vllm-v1-draft-copy:structured", "vllm-input-prep:logprobs",
                            "vllm-mrv2:logprobs")


class VllmTarget(Target):
    name = "vllm"
    summary = "the installed vLLM's V1 engine loop (async scheduling, spec decode)"
    scenarios = SCENARIOS
    coverage_set = COVERAGE_SET
    platforms = ("cuda",)
    args_type = VllmArgs

    def __init__(self) -> None:
        self.version = ""
        self.on_gpu = False
        self.verdict: Optional[contract.Verdict] = None

    def load(self) -> None:
        try:
            self.version = contract.installed_version()
        except MetadataError as exc:  # installed, but no version to check: bad input
            raise TargetError(f"--target vllm: {exc}") from None
        except LookupError:
            raise TargetError(_not_installed_here()) from None
        verdict = contract.evaluate(self.version, static.package_root("vllm"))
        if not verdict.ok and not verdict.slices_only:
            raise TargetError(f"--target vllm: vllm {self.version} is unsupported",
                              problems=verdict.problems)
        self.verdict = verdict
        if verdict.slices_only:  # the V1 engine is not driven here; the slices are
            what = "neither engine (V1 nor Model Runner V2) is" if verdict.mrv2 else \
                "its V1 engine is not"
            print(f"specrace: vllm {self.version}: {what} driven "
                  f"({verdict.engine[0]}); the slice scenarios run "
                  f"({', '.join(contract.SLICE_SCENARIOS)})", file=sys.stderr)
        elif verdict.tier == "compatible":
            print(f"specrace: {verdict.line()}", file=sys.stderr)
        # The platform answers for the GPU, simulated or real (boundary.platform: why the
        # base platform on both)
        import torch
        from targets.vllm.boundary import platform
        self.on_gpu = torch.cuda.is_available()
        platform.set_env_defaults()
        try:
            if self.on_gpu:
                platform.base_platform_first()
            from targets.vllm.engine import absent
            absent.install()  # 0.13.0 / 0.14.0's runner imports numba, never calls it
            import vllm  # noqa: F401  (vLLM's platform resolves here)
            platform.as_gpu("cuda" if self.on_gpu else "sim")
            from targets.vllm.engine import model
            model.register()
            from targets.vllm.mrv2 import model as mrv2_model
            mrv2_model.register()  # Model Runner V2's toy EAGLE head (targets/vllm/mrv2/)
        except Exception as exc:  # an import failure of the installed package
            raise TargetError(f"--target vllm: importing vllm {self.version} failed: "
                              f"{type(exc).__name__}: {exc}") from None

    def scheduler(self, args, device, grammar_backend: Any = None):
        import torch
        if self.on_gpu != (torch.device(device).type == "cuda"):
            # vLLM's platform was fixed at load, by the machine: its device is the GPU
            # there and the simulator elsewhere
            raise TargetError(f"--target vllm on this machine runs on "
                              f"{'cuda' if self.on_gpu else 'sim'} only (vLLM resolves "
                              f"its platform once per process): --backend "
                              f"{'cuda' if self.on_gpu else 'sim'}")
        if grammar_backend is not None:
            raise TargetError("the vllm target runs no structured outputs yet")
        if args.vllm_slice and self.verdict is not None and self.verdict.slices:
            raise TargetError(f"--target vllm: vllm {self.version}'s slice code does not "
                              f"fit: {self.verdict.slices[0]}")
        if args.vllm_slice == "draft-tokens":
            from targets.vllm.slices.draft_tokens import DraftTokensEngine
            return DraftTokensEngine(args, device)
        if self.verdict is not None and self.verdict.slices_only:
            raise TargetError(f"--target vllm: vllm {self.version}'s V1 engine is not "
                              f"driven: {self.verdict.engine[0]}")
        from targets.vllm.engine.loop import VllmEngine
        return VllmEngine(args, device)

    def request(self, rid, prompt, max_new_tokens, grammar=None):
        from targets.vllm.engine.loop import VllmRequest
        return VllmRequest(rid, prompt, max_new_tokens)

    @contextlib.contextmanager
    def variant(self, args, device) -> Iterator[None]:
        from targets.vllm.engine import kernels
        with kernels.installed():
            if args.vllm_runner != "v2":
                yield
                return
            from targets.vllm.mrv2 import seams  # Model Runner V2's kernels and UVA op
            with seams.installed():
                yield

    def patch_problem(self, target: str, edits) -> str:
        if not target.startswith("vllm."):
            return super().patch_problem(target, edits)
        root = static.package_root("vllm")
        return static.patch_fits(root, target, edits) if root else "vllm's source is missing"

    def variant_problem(self, variant) -> str:
        if variant.fix is not None:
            fix = variant.patch(self)
            for p in fix.parts():
                problem = p.problem(self.patch_problem)
                if problem:
                    return f"{fix.label} does not fit vllm {self.version}: {problem}"
        return ""

    def default_variant(self, scenario) -> str:
        return AS_INSTALLED

    def supports(self, scenario: str) -> bool:
        """The scenarios whose code the installed release lets the target drive: the V1
        engine's, Model Runner V2's, the slices' (``contract.scenario_problems``)."""
        if scenario not in self.scenarios:
            return False
        return self.verdict is None or not contract.scenario_problems(self.verdict, scenario)

    def unsupported(self, scenario: str) -> str:
        problems = ([] if self.verdict is None or scenario not in self.scenarios
                    else contract.scenario_problems(self.verdict, scenario))
        why = f"vllm {self.version}: {problems[0]}; " if problems else ""
        return why + super().unsupported(scenario)

    def mutations(self):
        from mutations import vllm, vllm_mrv2
        return vllm.MUTATIONS + vllm_mrv2.MUTATIONS

    def fixes(self):
        from mutations.vllm import FIXES
        return FIXES

    def environments(self):
        from targets.vllm.environments import VllmEnvironments
        return VllmEnvironments()

    def installed_version(self) -> Optional[str]:
        try:
            return contract.installed_version()
        except LookupError:
            return None

    def label(self) -> str:
        return f"vllm {self.version}"

    def describe(self) -> Dict[str, Any]:
        v = self.verdict
        tier = v.tier if v else None
        if v is not None and v.slices_only:
            tier = "slices only"  # the engine unsupported here: a slice ran
        return {"target": self.name, "vllm_version": self.version,
                "vllm_tier": tier,
                "vllm_files_digest": v.digest if v else None,
                "vllm_changed_files": list(v.changed) if v else []}


def _not_installed_here() -> str:
    """What to do when this interpreter has no vLLM: run in a release's environment --
    the ones set up here named, with the interpreter to run (a user who set 0.17.0 up was
    told to set 0.17.0 up)."""
    from targets.vllm.environments import LINE
    ready = LINE.installed()
    if not ready:
        return ("--target vllm: vllm is not installed here; set a release up with "
                f"`{LINE.hint('0.17.0')}` and run in its environment (docs/vllm-target.md)")
    newest = ready[-1]
    return (f"--target vllm: vllm is not installed in this interpreter; set up here: "
            f"{', '.join(ready)} -- run in one's environment: "
            f"`{os.path.relpath(LINE.env_python(newest))} -m specrace.cli ...` "
            f"(`specrace audit --target vllm` does so by itself; docs/vllm-target.md)")

