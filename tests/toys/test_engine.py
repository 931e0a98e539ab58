"""Every target's engine is a ``toys.engine.Engine``: the members the harness drives are on
each engine class (the mirror's, the sglang target's loop, the vLLM target's engine and
its draft-token slice), each shares ``EngineLoop.run_to_completion``, and a built engine
passes the protocol's own runtime check."""
from __future__ import annotations

import pytest

from toys.engine import Engine, EngineLoop

METHODS = ("add_request", "has_work", "step", "run_to_completion", "close")


def _missing(cls) -> list:
    """The protocol members ``cls`` lacks (``iteration`` is an instance's: checked on one)."""
    missing = [m for m in METHODS if not callable(getattr(cls, m, None))]
    if not isinstance(getattr(cls, "streams", None), property):
        missing.append("streams")
    return missing


def _engine_classes():
    from impl.scheduler import Scheduler
    from targets.sglang.engine.loop import UpstreamLoop
    from targets.vllm.engine.loop import VllmEngine
    from targets.vllm.slices.draft_tokens import DraftTokensEngine
    return [Scheduler, UpstreamLoop, VllmEngine, DraftTokensEngine]


def test_the_protocol_names_what_the_harness_drives():
    assert set(METHODS) | {"streams", "iteration"} == {
        n for n in vars(Engine) if not n.startswith("_")} | set(Engine.__annotations__)


@pytest.mark.parametrize("cls", _engine_classes(), ids=lambda c: c.__qualname__)
def test_every_targets_engine_class_has_the_protocols_members(cls):
    assert _missing(cls) == []
    # run_to_completion written once: none of them has its own
    assert issubclass(cls, EngineLoop) and cls.run_to_completion is EngineLoop.run_to_completion


def test_the_member_check_catches_an_engine_without_close_or_streams():
    class Partial(EngineLoop):
        def add_request(self, req): ...
        def has_work(self): return False
        def step(self): ...
        streams = {}  # a plain dict, not the property every engine has
    assert _missing(Partial) == ["close", "streams"]


@pytest.mark.parametrize("name", ["impl", "sglang"])
def test_a_built_engine_passes_the_runtime_check(name):
    """The engines this interpreter can build (vLLM's need its release's interpreter)."""
    import targets
    from harness.runtime.sim.runtime import sim_runtime
    try:
        target = targets.get(name)
    except targets.TargetError as exc:
        pytest.skip(f"the {name} target does not load here: {exc}")
    args = target.server_args()
    with sim_runtime() as rt, target.variant(args, rt.device):
        engine = target.scheduler(args, rt.device)
        try:
            assert isinstance(engine, Engine) and engine.iteration == 0
            engine.run_to_completion()  # nothing to do: returns, drained
        finally:
            engine.close()
    assert not isinstance(object(), Engine)
