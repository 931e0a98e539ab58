"""The workloads a server sees, as axes -- declared once, for the sglang target (issue 57
item 4). Each axis is either *driven* -- a server arg, or what requests ask for, that a
configuration of a scenario sets without patching code: ``driven_by`` names the
(scenario, variant) pairs -- or *not modelled*, with the reason. Never silently absent:
``check`` (run by the tests over every scenario) names an axis with neither, a declared
driver that no longer engages it (a scenario that dropped the axis), and a shipped
configuration that engages an axis without being declared. The scenarios draw their
variants' args from here (``engage``), the state machines their draws (``draws``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from harness.oracle.workload import Workload


@dataclass(frozen=True)
class Axis:
    name: str
    what: str  # the workload, in upstream's words
    arg: Optional[str] = None  # the server arg that drives it (None: requests, or unmodelled)
    on: Any = None  # the arg's value that engages the axis (a scenario may pick another)
    default: Any = None  # the arg's value as a server starts: the axis off
    # engaged by what the requests ask for, not by a server arg
    requests: Optional[Callable[[Workload], bool]] = None
    driven_by: Tuple[Tuple[str, str], ...] = ()  # (scenario, variant) configurations
    not_modelled: str = ""  # why specrace drives no configuration of it ("": it does)
    draws: Tuple[Any, ...] = ()  # the state machines' draws, the default first (shrinks to it)

    def engaged(self, args: Mapping[str, Any], workload: Workload) -> bool:
        if self.requests is not None:
            return self.requests(workload)
        return self.arg is not None and args.get(self.arg, self.default) != self.default


def _grammar(workload: Workload) -> bool:
    return any(r.schema for r in workload.requests)


AXES: Tuple[Axis, ...] = (
    Axis("overlap-off", "--disable-overlap-schedule (overlap on: every other configuration)",
         "overlap", False, True, driven_by=(("kv-row-reuse", "overlap-off"),)),
    Axis("graphs-off", "--disable-cuda-graph (graphs on: every other configuration)",
         "cuda_graph", False, True,
         driven_by=(("ngram-hidden-readback", "eager-verify"),
                    ("ngram-graph-eligibility", "fixed-graphs-off"))),
    Axis("chunked-prefill", "--chunked-prefill-size N", "chunked_prefill_size", 4, 0,
         driven_by=(("kv-row-reuse", "chunked"), ("kv-row-reuse", "chunked-retract"),
                    ("eagle-v2", "chunked-retract")),
         draws=(0, 0, 3, 7)),
    Axis("mixed-chunk", "--enable-mixed-chunk: a prefill chunk beside decodes in one batch",
         not_modelled="the toy scheduler keeps the chunked request out of the running batch "
                      "(toys.requests.form_prefill): a chunk and decodes are never one batch"),
    Axis("radix-cache", "the radix cache on (prefix match, insert in result processing)",
         not_modelled="the pools run the tree cache the release builds for "
                      "--disable-radix-cache, disabled (0.5.23: UnifiedRadixCache; "
                      "targets/sglang/engine/kv_lifecycle.py): the toy prefill has no real "
                      "prompt to match or insert"),
    Axis("retraction", "running requests retracted (retract_decode), at fixed points",
         "retract_at", ((0, 8),), (),
         driven_by=(("kv-row-reuse", "retract"), ("kv-row-reuse", "chunked-retract"),
                    ("eagle-v2", "retract"), ("eagle-v2", "chunked-retract"))),
    Axis("pressure", "admission on the prefill alone (PrefillAdder): the pool runs short, "
         "the scheduler retracts whom it chooses", "admission", "optimistic", "lifetime",
         driven_by=(("kv-pressure", "as-installed"),), draws=("lifetime", "optimistic")),
    Axis("tree-topk", "--speculative-eagle-topk > 1: a tree draft through the graphs",
         "eagle_topk", 2, 1,
         driven_by=(("eagle-v2", "topk2"), ("eagle-v2", "topk2-plan-stream"),
                    ("eagle-v2-grammar", "topk2"))),
    Axis("grammar", "JSON-schema requests (xgrammar)", requests=_grammar,
         driven_by=tuple((s, v) for s in ("grammar-ngram", "grammar-tree-staging",
                                          "eagle-v2-grammar")
                         for v in ("as-installed", "plan-stream", "topk2")
                         if s == "eagle-v2-grammar" or v == "as-installed")),
    Axis("hidden-states", "--enable-return-hidden-states", "return_hidden_states", True,
         False, driven_by=(("ngram-hidden-readback", "as-installed"),
                           ("ngram-hidden-readback", "eager-verify"))),
    Axis("penalties", "requests with frequency / presence / repetition penalties, "
         "min_new_tokens and logit_bias (penaltylib: state accumulated on the schedule "
         "stream, applied in the verify)", "sampling_penalties", True, False,
         driven_by=(("eagle-v2", "penalties"),)),
    Axis("logprobs", "requests with return_logprob",
         not_modelled="the result processor's logprob_result_processor is a declared "
                      "not-modelled stand-in (targets/sglang/engine/result_processor.py): "
                      "no request asks for logprobs"),
    Axis("page-size", "--page-size > 1",
         not_modelled="the pools are built with page_size=1 (targets/sglang/runner/build.py, "
                      "engine/kv_lifecycle.py): no paged allocator runs"),
    Axis("swa", "a sliding-window model: KV slots paired with SWA slots", "kv_layout", "swa",
         "full", driven_by=(("kv-row-reuse", "swa"),), draws=("full", "swa")),
    Axis("hybrid", "a hybrid model (Mamba / linear-attention state)",
         not_modelled="the sglang target has no Mamba or linear-attention state pool "
                      "(census: configuration not driven); vLLM's hybrid is its own arg"),
    Axis("pd-decode", "the decode side of PD disaggregation (prebuilt KV, the transfer "
         "engine stood in)",
         not_modelled="no scenario is a PD server: the decode mixins "
                      "(srt/disaggregation/decode*.py) need a transfer-engine stand-in "
                      "specrace does not have yet"),
)
BY_NAME: Dict[str, Axis] = {a.name: a for a in AXES}


def engage(name: str, value: Any = None) -> Dict[str, Any]:
    """The server args that engage axis ``name`` (``value``: another engaging value)."""
    axis = BY_NAME[name]
    return {axis.arg: axis.on if value is None else value}


def draws(name: str) -> list:
    """What the state machines draw for axis ``name``, its default first."""
    axis = BY_NAME[name]
    return list(axis.draws or (axis.default, axis.on))


def engaging(scenarios: Mapping[str, Any], target: str = "sglang"
             ) -> Dict[str, List[Tuple[str, str]]]:
    """axis -> the (scenario, variant) shipped configurations that engage it, read from
    the scenarios of ``target`` (a configuration patches no code: ``shipped``)."""
    from scenarios.configurations import shipped
    out: Dict[str, List[Tuple[str, str]]] = {a.name: [] for a in AXES}
    for scenario in scenarios.values():
        workload = scenario.workload(0)
        for conf in shipped(target, scenario):
            args = scenario.variants[conf.variant].args
            for axis in AXES:
                if axis.engaged(args, workload):
                    out[axis.name].append((scenario.name, conf.variant))
    return out


def check(scenarios: Mapping[str, Any], target: str = "sglang") -> List[str]:
    """What is wrong with the axis table against ``scenarios`` (those ``target`` runs),
    one line each: an axis neither driven nor named not modelled, a declared driver that
    no longer engages it, a configuration engaging it undeclared."""
    found = engaging(scenarios, target)
    problems = []
    for axis in AXES:
        if bool(axis.driven_by) == bool(axis.not_modelled):
            problems.append(f"{axis.name}: driven_by or not_modelled, one of them")
        for pair in sorted(set(axis.driven_by) - set(found[axis.name])):
            problems.append(f"{axis.name}: {pair[0]} [{pair[1]}] no longer drives it "
                            f"(not a shipped configuration that engages it)")
        for pair in sorted(set(found[axis.name]) - set(axis.driven_by)):
            problems.append(f"{axis.name}: {pair[0]} [{pair[1]}] drives it undeclared")
    return problems
