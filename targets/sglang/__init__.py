"""The ``sglang`` target: installed upstream SGLang's own relay, batch and staging code.

``SglangTarget.load`` checks the version contract (``contract``), imports the driven
modules (``bootstrap`` stands in for absent GPU packages), and selects specrace's sglang
platform for simulator runs (``platform``). The engine is upstream's own loop (``loop.UpstreamLoop``);
variants are run-time patches of the real classes (``patches``).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
from typing import Any, Dict, Iterator

from .. import Target, TargetError
from . import contract

# Scenarios the upstream engine runs: all of them (grammar staging on sglang's own
# xgrammar backend)
SCENARIOS = ("ngram-filter-race", "mixed-overlap", "dp-idle", "grammar-ngram",
             "grammar-tree-staging", "slot-reuse")


class SglangTarget(Target):
    name = "sglang"
    summary = "the installed sglang package's relay and batch code"
    scenarios = SCENARIOS

    def __init__(self) -> None:
        self.version = ""
        self._files: Dict[str, str] = {}

    def load(self) -> None:
        try:
            self.version = contract.installed_version()
        except LookupError:
            raise TargetError("--target sglang: sglang is not installed here; set it up "
                              "with `make upstream` (README: Verifying installed sglang)"
                              ) from None
        problems = contract.check_version(self.version)
        if problems:
            raise TargetError("--target sglang: " + "; ".join(problems))
        # Simulator runs present specrace's platform to sglang (pinned staging as on a
        # GPU); on a GPU machine sglang's CUDA platform stays in charge.
        from .platform import PLUGIN_NAME
        import torch
        if not torch.cuda.is_available():
            os.environ.setdefault("SGLANG_PLATFORM", PLUGIN_NAME)
        try:
            from . import upstream
        except Exception as exc:  # an import failure of the installed package
            raise TargetError(f"--target sglang: importing sglang {self.version} failed: "
                              f"{type(exc).__name__}: {exc}") from None
        problems = contract.check_api()
        if problems:
            raise TargetError(f"--target sglang: sglang {self.version} differs from what "
                              f"specrace drives: " + "; ".join(problems))
        self._files = {name: m.__file__ for name, m in upstream._modules.items()}

    def scheduler(self, args, device, grammar_backend: Any = None):
        from .loop import UpstreamLoop
        return UpstreamLoop(args, device, grammar_backend=grammar_backend)

    def grammar_backend(self):
        from .grammar import UpstreamGrammarBackend
        return UpstreamGrammarBackend()

    def request(self, rid, prompt, max_new_tokens, grammar=None):
        from .worker import Req
        return Req(rid, list(prompt), max_new_tokens, grammar)

    @contextlib.contextmanager
    def variant(self, args) -> Iterator[None]:
        from .patches import variant_patches
        with variant_patches(args):
            yield

    def describe(self) -> Dict[str, Any]:
        h = hashlib.sha256()
        for name in sorted(self._files):
            with open(self._files[name], "rb") as f:
                h.update(name.encode() + b"\0" + hashlib.sha256(f.read()).digest())
        from .bootstrap import stood_in
        return {"target": self.name, "sglang_version": self.version,
                "sglang_files_digest": h.hexdigest()[:16], "stood_in": stood_in()}
