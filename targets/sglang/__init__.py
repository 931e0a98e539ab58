"""The ``sglang`` target: installed upstream SGLang's own relay, batch and staging code.

``SglangTarget.load`` checks the version contract (``contract``), imports the driven
modules (``bootstrap`` stands in for absent GPU packages), and selects specrace's sglang
platform for simulator runs (``platform``). The engine is upstream's own loop (``loop.UpstreamLoop``);
variants are run-time patches of the real classes (``patches``).
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Dict, Iterator, Optional

from harness.run import AS_INSTALLED
from harness.target import Target, TargetError
from seams.process import changed_for_the_block
from targets import static
from targets.tiers import MetadataError
from targets.sglang.boundary import contract
from targets.sglang.boundary.server_args import SglangArgs

# Scenarios the upstream engine runs: all of them (grammar staging on sglang's own
# xgrammar backend)
SCENARIOS = ("ngram-filter-race", "mixed-overlap", "dp-idle", "grammar-ngram", "kv-row-reuse",
             "kv-pressure",
             "grammar-tree-staging", "slot-reuse", "dspark-confidence-ring",
             "dspark-result-readback", "ngram-hidden-readback", "eagle-v2",
             "eagle-v2-grammar", "ngram-graph-eligibility")


# The first release whose runner publishes read-done for an NGRAM verify (read from
# each release's decode_cuda_graph_runner.py; reports/upstream/releases.md)
NGRAM_PUBLISHES_FROM = "0.5.18"


class SglangTarget(Target):
    name = "sglang"
    summary = "the installed sglang package's relay and batch code"
    scenarios = SCENARIOS
    platforms = ("cuda", "rocm")  # boundary.platform.PLATFORMS
    args_type = SglangArgs

    def __init__(self) -> None:
        self.version = ""
        self.verdict: Optional[contract.Verdict] = None
        self._files: Dict[str, str] = {}
        self.executed: set = set()  # the package's files seen executing (``watching``)

    def load(self) -> None:
        try:
            self.version = contract.installed_version()
        except MetadataError as exc:  # installed, but no version to check: bad input
            raise TargetError(f"--target sglang: {exc}") from None
        except LookupError:
            raise TargetError("--target sglang: sglang is not installed here; set it up "
                              "with `make upstream` (docs/sglang-target.md#set-up-and-first-runs)"
                              ) from None
        # The contract first, on the source alone: nothing is imported or set yet.
        verdict = contract.evaluate(self.version, static.package_root("sglang"),
                                    contract.SCHEDULER_ATTRIBUTES, contract.WORKER_KEYWORDS)
        if not verdict.ok:
            raise TargetError(f"--target sglang: sglang {self.version} is unsupported",
                              problems=verdict.problems)
        self.verdict = verdict
        if verdict.tier == "compatible":
            print(f"specrace: {verdict.line()}", file=sys.stderr)
        # Simulator runs present specrace's platform to sglang (pinned staging as on a
        # GPU); on a GPU machine sglang's CUDA platform stays in charge.
        from targets.sglang.boundary.platform import PLUGIN_NAME
        import torch
        if not torch.cuda.is_available():
            os.environ.setdefault("SGLANG_PLATFORM", PLUGIN_NAME)  # seams.process
        try:
            from targets.sglang.boundary import upstream
        except Exception as exc:  # an import failure of the installed package
            raise TargetError(f"--target sglang: importing sglang {self.version} failed: "
                              f"{type(exc).__name__}: {exc}") from None
        upstream.take_gpu_paths()
        self._files = {name: m.__file__ for name, m in upstream._modules.items()}

    def scheduler(self, args, device, grammar_backend: Any = None):
        from targets.sglang.engine.loop import UpstreamLoop
        return UpstreamLoop(args, device, grammar_backend=grammar_backend)

    def grammar_backend(self):
        from targets.sglang.engine.grammar import UpstreamGrammarBackend
        return UpstreamGrammarBackend()

    def request(self, rid, prompt, max_new_tokens, grammar=None):
        from targets.sglang.engine.requests import make_request
        return make_request(rid, prompt, max_new_tokens, grammar)

    @contextlib.contextmanager
    def variant(self, args, device) -> Iterator[None]:
        from targets.sglang.slices import dspark, eagle
        from targets.sglang.engine import kv_lifecycle
        from targets.sglang.boundary.patches import variant_patches
        from targets.sglang.boundary.platform import as_platform, as_without_gpu
        from targets.sglang.runner import build as runner
        if args.spec_algorithm == "eagle-v2":
            eagle.modules()  # imported with the machine's flags, then masked for the run
        if runner.fits():
            runner.modules()  # the same for upstream's runner and its KV pool
        with variant_patches(args), dspark.server_context(args, device), \
                eagle.server_context(args, device), \
                kv_lifecycle.server_context(args, device), as_without_gpu(device), \
                as_platform(args.platform):
            yield

    def patch_problem(self, target: str, edits) -> str:
        """A variant's or mutation's patch against the installed source, read statically: a
        release that moved the code disables that variant or mutation, named. A patch of
        specrace's own code under this target (the toy worker, the pools' bookkeeping)
        is our tree's: it fits, or applying it is a harness error."""
        if not target.startswith("sglang."):
            return super().patch_problem(target, edits)
        root = static.package_root("sglang")
        return static.patch_fits(root, target, edits) if root else "sglang's source is missing"

    def variant_problem(self, variant) -> str:
        """Why a variant cannot run on this release: a patch of it no longer fits."""
        from targets.sglang.boundary.patches import relay_patches
        args = variant.args
        patches = list(relay_patches(args.get("relay", "future_map")))
        if variant.fix is not None:
            patches.extend(variant.patch(self).parts())
        if args.get("sampling_penalties"):
            from targets.sglang.engine import requests
            if not requests.fits():
                return (f"requests asking sampling penalties are driven where they are "
                        f"upstream's Req, sampled through its SamplingBatchInfo (0.5.22 "
                        f"on); sglang {self.version}'s Req does not fit")
        slices = {"dspark": ("dspark", "DSpark"), "eagle-v2": ("eagle_v2", "EAGLE v2")}
        if args.get("spec_algorithm") in slices:
            feature, name = slices[args["spec_algorithm"]]
            root = static.package_root("sglang")
            missing = (contract.missing_code(root, feature)
                       or contract.undriven(root, feature)) if root else "its source"
            if missing:
                return (f"the {name} slice needs {missing}, which sglang {self.version} "
                        f"does not have")
        for p in patches:
            problem = p.problem(self.patch_problem)
            if problem:
                return f"{p.label} does not fit sglang {self.version}: {problem}"
        return ""

    def default_variant(self, scenario) -> str:
        """A release as it shipped, unless a variant is asked for."""
        return AS_INSTALLED

    def default_war_barrier(self) -> str:
        """The release's own fence for an NGRAM step. Its WAR barrier is fine only when
        the forward publishes a read-done event; upstream's graph runner does that for
        NGRAM's TARGET_VERIFY from 0.5.18 on (``decode_cuda_graph_runner``; before, only
        for DECODE and the dflash family), so older releases always took the coarse
        fallback (reports/upstream/releases.md)."""
        from packaging.version import Version
        try:
            return "fine" if Version(self.version) >= Version(NGRAM_PUBLISHES_FROM) else "coarse"
        except ValueError:
            return "fine"

    def mutations(self):
        from mutations.sglang import MUTATIONS
        from mutations.sglang_dspark import MUTATIONS as DSPARK
        from mutations.sglang_eagle import MUTATIONS as EAGLE
        return MUTATIONS + DSPARK + EAGLE

    def fixes(self):
        from mutations.fixes import FIXES
        return FIXES

    def environments(self):
        from targets.sglang.environments import SglangEnvironments
        return SglangEnvironments()

    def installed_version(self) -> Optional[str]:
        try:
            return contract.installed_version()
        except LookupError:
            return None

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Which of the package's files execute (a profile hook on this thread: greenlets
        switch frames within it), each checked against the wheel's record when the trial
        is over: a file that is not the release's makes a verified release compatible,
        named in the report -- whatever list the contract reads before the run."""
        root = static.package_root("sglang")
        if root is None or self.verdict is None:
            yield
            return
        prefix, seen = os.path.join(root, ""), set()
        self.executed = set()  # this run's (a report describes the run it came from)

        def profile(frame, event, arg):
            # Code run by an import (a module's body, what it calls while loading) is not
            # the run's: a module the first run of a process imports lazily is already
            # loaded for the next, so counting it would make a run's description depend
            # on what its process ran before (`specrace audit` runs many in one process,
            # and each report must replay in a fresh one).
            if event == "call":
                path = frame.f_code.co_filename
                if path.startswith(prefix) and path not in seen and not _importing(frame):
                    seen.add(path)
        try:
            with changed_for_the_block(sys.getprofile, sys.setprofile, profile):
                yield
        finally:
            self.executed |= seen
            before = self.verdict.tier
            self.verdict = contract.with_executed(self.verdict, root, self.executed)
            if self.verdict.tier != before:
                print(f"specrace: {self.verdict.line()}", file=sys.stderr)

    def label(self) -> str:
        return f"sglang {self.version}"

    def describe(self) -> Dict[str, Any]:
        from targets.sglang.boundary.bootstrap import stood_in
        from targets.sglang.engine import kv_lifecycle, requests, result_processor
        from targets.sglang.engine.pools import upstream_pools_fit
        v = self.verdict
        return {"target": self.name, "sglang_version": self.version,
                "sglang_tier": v.tier if v else None,
                "sglang_files_digest": v.digest if v else None,
                "sglang_commit": v.commit if v else None, "stood_in": stood_in(),
                "sglang_executed_files": len(self.executed),
                # files driven or executed that are not what the wheel installed
                "sglang_changed_files": list(v.changed) if v else [],
                "kv_pools": "upstream" if upstream_pools_fit() else "specrace",
                # whose functions allocate and release rows and slots (full layout)
                "kv_lifecycle": "upstream" if upstream_pools_fit() and kv_lifecycle.fits()
                else "specrace",
                # whose request class and result processing (the full layout: the SWA
                # layout's allocator is specrace's, and so is its commit)
                "requests": "upstream" if requests.fits() else "specrace",
                "result_processor": "upstream" if upstream_pools_fit() and kv_lifecycle.fits()
                and result_processor.fits() else "specrace"}


def _importing(frame) -> bool:
    """Is ``frame`` running under importlib's machinery (a module being loaded)?"""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False
