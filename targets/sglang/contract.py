"""The version contract: what the sglang target relies on in the installed package.

Checked once, before anything runs: the installed version must be a supported release,
and the functions the engine calls or patches must have the signatures it was written
against (a renamed argument would otherwise surface as a confusing crash -- or, worse, a
variant patch that silently no longer applies). Every difference is named in the error.
"""
from __future__ import annotations

import importlib.metadata
import inspect
from typing import Any, Dict, List, Tuple

SUPPORTED_VERSIONS = ("0.5.23",)

# (module, qualname) -> the parameter names it must take, in order (self included)
SIGNATURES: Dict[Tuple[str, str], Tuple[str, ...]] = {
    ("sglang.srt.managers.overlap_utils", "FutureMap.__init__"):
        ("self", "device", "spec_algo", "req_to_token_pool", "needs_cpu_seq_lens",
         "needs_confidence_relay"),
    ("sglang.srt.managers.overlap_utils", "FutureMap.stash"):
        ("self", "future_indices", "payload"),
    ("sglang.srt.managers.overlap_utils", "FutureMap.publish"):
        ("self", "future_indices", "new_seq_lens", "confidence"),
    ("sglang.srt.managers.overlap_utils", "FutureMap._resolve_spec_extras"): ("self", "batch"),
    ("sglang.srt.managers.overlap_utils", "FutureMap._maybe_init_ngram_bufs"):
        ("self", "payload"),
    ("sglang.srt.managers.overlap_utils", "FutureMap.resolve_seq_lens_cpu"):
        ("self", "batch", "stream_ordered"),
    ("sglang.srt.managers.overlap_utils", "resolve_forward_inputs"): ("batch", "future_map"),
    ("sglang.srt.managers.overlap_utils", "RelayPayload.from_ngram"): ("cls", "draft_input"),
    ("sglang.srt.speculative.ngram_info", "NgramVerifyInput.filter_batch"):
        ("self", "new_indices", "new_indices_cpu"),
    ("sglang.srt.speculative.ngram_info", "NgramVerifyInput.merge_batch"):
        ("self", "spec_info"),
    ("sglang.srt.managers.schedule_batch", "ScheduleBatch.filter_batch"):
        ("self", "reqs_to_exclude", "keep_indices"),
    ("sglang.srt.managers.schedule_batch", "ScheduleBatch.merge_batch"): ("self", "other"),
    ("sglang.srt.managers.schedule_batch", "ScheduleBatch.init_new"):
        ("cls", "reqs", "req_to_token_pool", "token_to_kv_pool_allocator", "tree_cache",
         "model_config", "enable_overlap", "spec_algorithm", "chunked_req", "dllm_config"),
    ("sglang.srt.managers.scheduler", "Scheduler._relay_forward_payload"):
        ("self", "batch", "future_indices", "batch_result"),
    ("sglang.srt.managers.scheduler", "Scheduler._copy_result_to_cpu"):
        ("self", "batch_result", "batch"),
    ("sglang.srt.managers.scheduler", "Scheduler._apply_war_barrier"): ("self",),
    ("sglang.srt.managers.scheduler", "Scheduler._forward_isolation"):
        ("self", "batch", "overlap"),
    ("sglang.srt.managers.scheduler", "Scheduler.record_batch_in_overlap"):
        ("self", "batch"),
    ("sglang.srt.managers.utils", "GenerationBatchResult.copy_to_cpu"):
        ("self", "return_logprob", "return_hidden_states"),
    ("sglang.srt.speculative.spec_utils", "record_stream_for_v2_verify"):
        ("batch", "verify_input", "fwd_stream"),
    ("sglang.srt.speculative.spec_utils", "GrammarTree.from_device"):
        ("cls", "retrieve_next_token", "retrieve_next_sibling", "draft_token"),
    ("sglang.srt.speculative.spec_utils", "GrammarTree.from_host"):
        ("cls", "retrieve_next_token", "retrieve_next_sibling", "draft_token"),
    ("sglang.srt.speculative.spec_utils", "build_grammar_vocab_mask"):
        ("reqs", "tree", "sampling_info", "device", "barrier"),
    ("sglang.srt.speculative.spec_utils", "generate_token_bitmask"):
        ("reqs", "retrieve_next_token_cpu", "retrieve_next_sibling_cpu", "draft_tokens_cpu",
         "vocab_size"),
}

# module attributes the engine reads or sets: (module, name)
ATTRIBUTES: Tuple[Tuple[str, str], ...] = (
    ("sglang.srt.managers.overlap_utils", "_is_cuda"),
    ("sglang.srt.managers.utils", "GenerationBatchResult"),
    ("sglang.srt.environ", "envs"),
)

# dataclass fields of GenerationBatchResult the engine fills or reads
RESULT_FIELDS = ("next_token_ids", "accept_lens", "new_seq_lens", "next_draft_input",
                 "copy_done", "speculative_num_draft_tokens")


def installed_version() -> str:
    """The installed sglang's version, or raise LookupError when it is not installed."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        raise LookupError("sglang is not installed") from None


def check_version(version: str) -> List[str]:
    if version not in SUPPORTED_VERSIONS:
        return [f"sglang {version} is not a supported release "
                f"(supported: {', '.join(SUPPORTED_VERSIONS)})"]
    return []


def _lookup(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = inspect.getattr_static(obj, part) if isinstance(obj, type) else getattr(obj, part)
    if isinstance(obj, (classmethod, staticmethod)):
        obj = obj.__func__
    return obj


def check_api() -> List[str]:
    """Every difference between the installed sglang and what the engine relies on."""
    import dataclasses
    problems: List[str] = []
    for (module, qualname), expected in SIGNATURES.items():
        try:
            fn = _lookup(module, qualname)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{module}.{qualname} is missing ({type(exc).__name__})")
            continue
        params = tuple(inspect.signature(inspect.unwrap(fn)).parameters)
        if params != expected:
            problems.append(f"{module}.{qualname}{params} differs from {expected}")
    for module, name in ATTRIBUTES:
        if not hasattr(importlib.import_module(module), name):
            problems.append(f"{module}.{name} is missing")
    from sglang.srt.managers.utils import GenerationBatchResult
    fields = {f.name for f in dataclasses.fields(GenerationBatchResult)}
    for name in RESULT_FIELDS:
        if name not in fields:
            problems.append(f"GenerationBatchResult.{name} is missing")
    return problems
