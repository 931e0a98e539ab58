"""The code under test: a *target*.

* ``impl``   -- specrace's own mirror of the server code (``impl/``), the default;
* ``sglang`` -- the installed upstream package (``targets/sglang``): its real relay, batch
  and grammar-staging classes driven in the order of its overlap event loop.

The same scenarios, fault plans, policies and oracles run against either. A target
supplies the engine (a scheduler with ``step``/``has_work``/``run_to_completion``/
``streams``), the request type, the run-time patches a variant needs, and a description
for reports (version, digest of the files driven).
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, Optional, Tuple

TARGET_NAMES = ("impl", "sglang")


class TargetError(ValueError):
    """The target cannot run here (not installed, unsupported version): bad input.
    ``problems``: every reason, each shown on a line of its own."""

    def __init__(self, message: str, problems=()) -> None:
        super().__init__(message)
        self.problems = list(problems)


class Target:
    name = "target"
    summary = ""
    # scenario names this target runs (None: every scenario)
    scenarios: Optional[Tuple[str, ...]] = None

    def load(self) -> None:
        """Import and check the code under test (raises ``TargetError``)."""

    def scheduler(self, args, device, grammar_backend: Any = None):
        raise NotImplementedError

    def request(self, rid: int, prompt, max_new_tokens: int, grammar: Any = None):
        raise NotImplementedError

    def grammar_backend(self):
        raise TargetError(f"the {self.name} target has no grammar backend")

    @contextlib.contextmanager
    def variant(self, args, device) -> Iterator[None]:
        """Run-time patches a run with these server args on ``device`` needs (none by
        default)."""
        yield

    def describe(self) -> Dict[str, Any]:
        return {"target": self.name}

    def patch_problem(self, target: str, edits) -> str:
        """Why a source patch of ``target`` cannot be applied to this code ("" if it fits).
        On our own tree a patch that does not fit is a harness error (``PatchError``, raised
        when it is applied), so nothing is disabled here."""
        return ""

    def variant_problem(self, overrides) -> str:
        """Why a variant (its server-arg overrides) cannot run on this code ("": it can)."""
        return ""

    def default_war_barrier(self) -> str:
        """The fence a run gets when none is asked for: the code's own."""
        return "fine"

    def supports(self, scenario: str) -> bool:
        return self.scenarios is None or scenario in self.scenarios


class ImplTarget(Target):
    name = "impl"
    summary = "specrace's mirror of the server code (impl/)"
    # every scenario but the sglang target's DSpark slice (impl/ has no DSpark)
    scenarios = ("ngram-filter-race", "mixed-overlap", "dp-idle", "grammar-ngram",
                 "grammar-tree-staging", "slot-reuse", "kv-row-reuse", "kv-pressure")

    def scheduler(self, args, device, grammar_backend: Any = None):
        from impl.scheduler import Scheduler
        return Scheduler(args, device, grammar_backend=grammar_backend)

    def request(self, rid, prompt, max_new_tokens, grammar=None):
        from impl.schedule_batch import Req
        return Req(rid, list(prompt), max_new_tokens, grammar)

    def grammar_backend(self):
        from impl.grammar import GrammarBackend
        from impl.vocab import EOS_ID, VOCAB
        return GrammarBackend(VOCAB, EOS_ID)


_TARGETS: Dict[str, Target] = {}


def get(name: str) -> Target:
    """The loaded target ``name`` (one per process)."""
    target = _TARGETS.get(name)
    if target is not None:
        return target
    if name == "impl":
        target = ImplTarget()
    elif name == "sglang":
        from targets.sglang import SglangTarget
        target = SglangTarget()
    else:
        raise TargetError(f"unknown target {name!r}; expected one of: {', '.join(TARGET_NAMES)}")
    target.load()
    _TARGETS[name] = target
    return target
