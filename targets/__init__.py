"""The code under test: a *target*.

* ``impl``   -- specrace's own mirror of the server code (``impl/``), the default;
* ``sglang`` -- the installed upstream package (``targets/sglang``): its real relay, batch
  and grammar-staging classes driven in the order of its overlap event loop;
* ``vllm``   -- the installed vLLM (``targets/vllm``): its own V1 engine loop with async
  scheduling and speculative decoding.

The same scenarios, fault plans, policies and oracles run against either. What a target
supplies is the interface ``harness.target.Target``; this module is the registry that
turns a name into a loaded target (``get``), the one place a name is looked up.
"""
from __future__ import annotations

from typing import Any, Callable, Dict

from harness.target import Target, TargetError  # the interface; re-exported
from seams import signals
from seams.vocab import TargetName


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

    def mutations(self):
        from mutations import MUTATIONS
        return MUTATIONS

    def grammar_backend(self):
        from impl.grammar import GrammarBackend
        from toys.vocab import EOS_ID, VOCAB
        return GrammarBackend(VOCAB, EOS_ID)


_TARGETS: Dict[str, Target] = {}


def _sglang() -> Target:
    from targets.sglang import SglangTarget
    return SglangTarget()


def _vllm() -> Target:
    from targets.vllm import VllmTarget
    return VllmTarget()


# Every target by its name: an upstream one is imported only when asked for
_REGISTRY: Dict[TargetName, Callable[[], Target]] = {
    TargetName.IMPL: ImplTarget, TargetName.SGLANG: _sglang, TargetName.VLLM: _vllm}


def declared(name: str) -> Target:
    """The target ``name``, not loaded: what it declares (its environments, its
    scenarios) without importing the server it drives."""
    try:
        key = TargetName.parse(name, "target")
    except ValueError as exc:
        raise TargetError(str(exc)) from None
    return _REGISTRY[key]()


def get(name: str) -> Target:
    """The loaded target ``name`` (one per process)."""
    target = _TARGETS.get(name)
    if target is None:
        target = declared(name)
        # loading imports the server's modules (C extensions among them): one interrupted
        # half-way cannot be imported again, so a signal waits for the load to finish
        with signals.deferred():
            target.load()
        _TARGETS[name] = target
    return target
