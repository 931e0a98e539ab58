"""Which of a scenario's variants are a server *as shipped*, and the server flags and
environment variables each stands for -- what ``specrace audit`` runs and prints.

A variant is shipped code when it applies no patch: no seeded bug (``mutation``), no
candidate fix (``fix``), and no server arg that the target can only reach by patching the
installed source (sglang's ``relay="spec_info"`` is the pre-#35198 relay patched back in).
Everything else a variant sets is a configuration a user of that server chooses, and each
target's table below says how they choose it, in that server's own words: an sglang flag
never shows on a vLLM row, nor the other way round.

The tables speak of upstream's spellings at the newest release driven (sglang 0.5.23,
vLLM 0.17.0 - 0.34.0); a setting without a flag of its own (a model kind, memory pressure,
what requests ask for) is described, in parentheses.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from harness.run import AS_INSTALLED
from scenarios.base import Scenario

# server arg -> {value: why a run with it patches the code}: such a variant is not shipped
_PATCHING: Dict[str, Dict[str, Dict[Any, str]]] = {
    "sglang": {"relay": {"spec_info": "the pre-#35198 relay, patched back in"}},
    "vllm": {},
}

Describe = Callable[[Any, Mapping[str, Any]], Optional[str]]


def _sglang_algorithm(value: Any, args: Mapping[str, Any]) -> Optional[str]:
    if value == "eagle-v2":
        return "--speculative-algorithm " + ("EAGLE3" if args.get("eagle3") else "EAGLE")
    return {"ngram": "--speculative-algorithm NGRAM",
            "dspark": "--speculative-algorithm DSPARK",
            # the sglang target's own tree drafter under upstream's loop (no upstream worker)
            "eagle": "--speculative-algorithm EAGLE (a toy device tree drafter)"}.get(value)


def _dspark_only(text: Callable[[Any], Optional[str]]) -> Describe:
    """A DSpark setting: it means nothing to the other algorithms."""
    return lambda v, args: text(v) if args.get("spec_algorithm") == "dspark" else None


def _backend_seq_lens(value: Any, args: Mapping[str, Any]) -> Optional[str]:
    """The attention backend's ``needs_cpu_seq_lens``: what DSpark's and EAGLE v2's
    relay and draft extend branch on (the toy NGRAM worker reads neither)."""
    if args.get("spec_algorithm") not in ("dspark", "eagle-v2"):
        return None
    return ("(an attention backend that needs CPU seq lens: FlashInfer)" if value else
            "(an attention backend without CPU seq lens: FA3, Triton, TRT-LLM, DSV4)")


# sglang: server arg -> its flag / env var at that value (None: upstream's default, or
# meaningless in this configuration)
SGLANG: Dict[str, Describe] = {
    "spec_algorithm": _sglang_algorithm,
    "dp_attention": lambda v, a: "--enable-dp-attention" if v else None,
    "cuda_graph": lambda v, a: None if v else "--disable-cuda-graph",
    "overlap": lambda v, a: None if v else "--disable-overlap-schedule",
    "return_hidden_states": lambda v, a: ("--enable-return-hidden-states (requests ask for "
                                          "their hidden states)" if v else None),
    "ragged_verify_mode": _dspark_only(
        lambda v: None if v == "static" else f"SGLANG_RAGGED_VERIFY_MODE={v}"),
    "needs_cpu_seq_lens": _backend_seq_lens,
    "folded_accept": _dspark_only(
        lambda v: "(greedy, grammar-free batches: the accept folded into the verify graph)"
        if v else "(sampling or grammar in the batch: the accept runs eagerly)"),
    "kv_layout": lambda v, a: ("(a sliding-window model: SWA KV layout)" if v == "swa"
                               else None),
    "chunked_prefill_size": lambda v, a: f"--chunked-prefill-size {v}" if v else None,
    "retract_at": lambda v, a: "(memory pressure: running requests retracted)" if v else None,
    "admission": lambda v, a: ("(admission on the prefill alone, as PrefillAdder does: the "
                               "pool runs short)" if v == "optimistic" else None),
    "eagle_topk": lambda v, a: f"--speculative-eagle-topk {v}" if v and v > 1 else None,
    "plan_stream": lambda v, a: "SGLANG_ENABLE_OVERLAP_PLAN_STREAM=1" if v else None,
    "sampling_penalties": lambda v, a: ("(requests ask frequency, presence and repetition "
                                        "penalties, min_new_tokens and a logit bias)"
                                        if v else None),
}

def _vllm_graphs(value: Any, args: Mapping[str, Any]) -> Optional[str]:
    """vLLM's CUDA graphs: on by default (Model Runner V2 drives upstream's capture and
    replay); ``--enforce-eager`` turns them off; the V1 runner's graphs are not driven."""
    if args.get("vllm_slice"):
        return None
    if not value:
        return "--enforce-eager"
    return None if args.get("vllm_runner") == "v2" else (
        "(the V1 runner's CUDA graphs are not driven: its steps run eager)")


VLLM: Dict[str, Describe] = {
    "overlap": lambda v, a: None if v else "(async scheduling off: --no-async-scheduling)",
    "cuda_graph": _vllm_graphs,
    # (the draft-token slice runs no model of the server's: no model kind to name)
    "hybrid": lambda v, a: None if a.get("vllm_slice") else (
        "(a hybrid model: Mamba-style state, e.g. Qwen3-Next)" if v else "(a dense model)"),
    "vllm_runner": lambda v, a: "VLLM_USE_V2_MODEL_RUNNER=1" if v == "v2" else None,
    "vllm_slice": lambda v, a: ("(Model Runner V2's draft-token handler, driven as a slice)"
                                if v == "draft-tokens" else None),
    "vllm_structured_outputs": lambda v, a: ("(structured-output requests)" if v else None),
    "vllm_presence_penalty": lambda v, a: (f"(requests with presence_penalty={v:g})" if v
                                           else None),
    "vllm_logprobs": lambda v, a: (f"(requests with logprobs={v}, prompt_logprobs={v})"
                                   if v else None),
    # a step's token budget: vLLM chunks any prompt longer than what is left of it
    "chunked_prefill_size": lambda v, a: f"--max-num-batched-tokens {v}" if v else None,
}

_TABLES = {"sglang": SGLANG, "vllm": VLLM}

# what every run of a scenario has, whatever the variant (its workload's requests)
_SCENARIO_NOTES: Dict[str, Tuple[str, ...]] = {
    "grammar-ngram": ("(JSON-schema requests: xgrammar)",),
    "grammar-tree-staging": ("(JSON-schema requests: xgrammar)",),
    "eagle-v2-grammar": ("(JSON-schema requests: xgrammar)",),
    "mixed-overlap": ("(every other decode step run without overlap)",),
}

# server args a target's runs have unless a variant says otherwise (impl.server_args)
_BASE: Dict[str, Dict[str, Any]] = {
    "sglang": {"spec_algorithm": "ngram"},
    "vllm": {"hybrid": True},
}


@dataclass(frozen=True)
class Configuration:
    """One way a server as shipped runs a scenario: the variant that selects it (what
    ``specrace repro --variant`` takes) and the flags that reach it."""
    variant: str
    flags: Tuple[str, ...]

    def text(self) -> str:
        return " ".join(self.flags) if self.flags else "(defaults)"


def patched_by(target: str, variant) -> str:
    """Why ``variant`` (a ``harness.run.Variant``) is not the code as shipped ("": it is)."""
    if variant.mutation is not None:
        return f"seeded bug {variant.mutation}"
    if variant.fix is not None:
        return f"candidate fix {variant.fix}"
    for key, values in _PATCHING.get(target, {}).items():
        if key in variant.args and variant.args[key] in values:
            return values[variant.args[key]]
    return ""


def flags(target: str, scenario: Scenario, args: Mapping[str, Any]) -> Tuple[str, ...]:
    """The flags, env vars and conditions a run of ``scenario`` with server ``args`` stands
    for on ``target`` (specrace's own mirror, impl: none -- it ships nothing)."""
    table = _TABLES.get(target)
    if table is None:
        return ()
    full = {**_BASE.get(target, {}), **args}
    out: List[str] = []
    for key, describe in table.items():
        if key in full:
            text = describe(full[key], full)
            if text:
                out.append(text)
    # the drafting width right after the algorithm that drafts (sglang), else first
    at = 1 if target == "sglang" and out[:1] and out[0].startswith("--speculative") else 0
    out[at:at] = _drafts(target, scenario, full)
    return tuple(out) + _SCENARIO_NOTES.get(scenario.name, ())


def _drafts(target: str, scenario: Scenario, args: Mapping[str, Any]) -> Tuple[str, ...]:
    """The speculative-decoding width: a variant's own ``draft_token_num``, else the
    scenario's workload's (seed 0: every seed of a scenario drafts alike)."""
    drafts = args.get("draft_token_num", scenario.workload(0).draft_token_num)
    if target == "vllm":
        # async scheduling: on (--async-scheduling), or as the release has it by default
        # for EAGLE-family drafting (vllm_async_default: off in 0.13.0, on from 0.14.0)
        async_flag = (() if not args.get("overlap", True) else
                      ("(async scheduling as the release's default: on from 0.14.0, off "
                       "in 0.13.0)",) if args.get("vllm_async_default") else
                      ("--async-scheduling",))
        if drafts <= 1:
            return ("--async-scheduling (no speculative decoding)",) if args.get(
                "overlap", True) else ()
        method = ("EAGLE: Model Runner V2's speculator" if args.get("vllm_runner") == "v2"
                  else "a draft model; EAGLE where the release has no draft-model "
                       "proposer: 0.13.0, 0.14.0")
        return async_flag + (
            f"--speculative-config num_speculative_tokens={drafts - 1} ({method})",)
    if args.get("spec_algorithm") == "ngram":
        return (f"--speculative-num-draft-tokens {drafts}",)
    return ()


def shipped(target: str, scenario: Scenario) -> List[Configuration]:
    """Every configuration of ``scenario`` the server ships: its variants that patch
    nothing, one per distinct set of server args (``as-installed`` first; a ``fixed``
    with the same args as shipped is the same run, not a second row)."""
    names = [AS_INSTALLED] + [n for n in scenario.variants if n != AS_INSTALLED]
    seen, out = set(), []
    for name in names:
        variant = scenario.variants.get(name)
        if variant is None or patched_by(target, variant):
            continue
        key = tuple(sorted((k, repr(v)) for k, v in variant.args.items()))
        if key in seen:
            continue
        seen.add(key)
        out.append(Configuration(name, flags(target, scenario, variant.args)))
    return out
