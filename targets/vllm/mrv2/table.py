"""Which of Model Runner V2's Triton kernels the driven path launches, release by
release, and the stand-in for each -- read by ``seams`` (binding them for a run) and by
the contract (``boundary/contract.py``: checking them from source before a run).

``KERNELS``: (the module that defines the kernel, its name, the stand-ins). A release
binds each kernel only where it is defined, and the stand-in whose parameters are the
kernel's own, name for name and in order (``params_match``) -- so 0.17.0's and 0.34.0's
``_post_update_kernel`` each get theirs, and a kernel a release lacks is skipped there.

``DRIVEN_MODULES``: the modules the greedy EAGLE path with async scheduling and
structured outputs runs (upstream's ``GPUModelRunner`` and what it calls), per release
where they exist. Every ``@triton.jit`` kernel one of them launches must have a
stand-in here or be listed in ``NOT_LAUNCHED`` with why the path never launches it; the
contract names any other as a problem, and at run time an unbound kernel of theirs
raises (``seams._Missing``) instead of running nothing.
"""
from __future__ import annotations

import ast
import functools
import inspect
from typing import Callable, Dict, List, Tuple

from targets import static

from targets.vllm.mrv2 import draft_kernels_late as D
from targets.vllm.mrv2 import kernels as K
from targets.vllm.mrv2 import kernels_late as KL
from targets.vllm.mrv2 import logprob_kernels as LP
from targets.vllm.mrv2 import spec_kernels as S
from targets.vllm.mrv2 import spec_kernels_late as SL
from targets.vllm.mrv2 import variants as V

_GPU = "vllm.v1.worker.gpu"
_BATCH = f"{_GPU}.input_batch"
_TABLE = f"{_GPU}.block_table"
_GUMBEL = f"{_GPU}.sample.gumbel"
_REJECT = f"{_GPU}.spec_decode.rejection_sampler"
_RUTILS = f"{_GPU}.spec_decode.rejection_sampler_utils"
_AR = f"{_GPU}.spec_decode.target_dependent_ar.speculator"
_ARV = f"{_GPU}.spec_decode.autoregressive.speculator"
_LOGPROB, _PROMPT_LOGPROB = f"{_GPU}.sample.logprob", f"{_GPU}.sample.prompt_logprob"

KERNELS: Tuple[Tuple[str, str, Tuple[Callable, ...]], ...] = (
    (f"{_GPU}.buffer_utils", "_apply_write_kernel", (K.apply_write, KL.apply_write)),
    (_BATCH, "_prepare_prefill_inputs_kernel",
     (K.prepare_prefill_inputs, KL.prepare_prefill_inputs)),
    (_BATCH, "_prepare_pos_seq_lens_kernel", (K.prepare_pos_seq_lens,)),
    (_BATCH, "_combine_sampled_and_draft_tokens_kernel",
     (K.combine_sampled_and_draft_tokens, KL.combine_sampled_and_draft_tokens)),
    (_BATCH, "_get_num_sampled_and_rejected_kernel", (K.get_num_sampled_and_rejected,)),
    (_BATCH, "_post_update_kernel", (K.post_update, KL.post_update)),
    (_BATCH, "_post_update_num_computed_tokens_kernel",
     (KL.post_update_num_computed_tokens,)),
    (_BATCH, "_expand_idx_mapping_kernel", (K.expand_idx_mapping,)),
    (_TABLE, "_gather_block_tables_kernel",
     (K.gather_block_tables, KL.gather_block_tables, V.GATHER_TABLES_0271,
      V.GATHER_TABLES_0180)),
    (_TABLE, "_compute_slot_mappings_kernel",
     (K.compute_slot_mappings, KL.compute_slot_mappings, V.SLOTS_0271)),
    (_GUMBEL, "_gumbel_sample_kernel", (S.gumbel_sample, SL.gumbel_sample, V.GUMBEL_033,
                                          V.GUMBEL_0271, V.GUMBEL_0230,
                                          V.GUMBEL_0180)),
    (_GUMBEL, "_gumbel_combine_kernel", (SL.gumbel_combine,)),
    (f"{_GPU}.sample.greedy_argmax", "_argmax_partial", (SL.argmax_partial,)),
    (f"{_GPU}.sample.greedy_argmax", "_argmax_finish", (SL.argmax_finish,)),
    # 0.17.0: one rejection kernel; 0.34.0: four, and the draft tokens' gather
    (f"{_GPU}.spec_decode.rejection_sample", "_rejection_sample_kernel",
     (S.rejection_sample,)),
    (_REJECT, "_strict_rejection_sample_kernel", (S.rejection_sample,)),  # 0.18.0-0.19.0
    (_REJECT, "_gather_draft_sampled_kernel", (SL.gather_draft_sampled,)),
    (_REJECT, "_flatten_sampled_kernel", (SL.flatten_sampled,)),
    (_RUTILS, "_compute_local_logits_stats_kernel",
     (SL.compute_local_logits_stats, V.STATS_033, V.STATS_0271)),
    (_RUTILS, "_rejection_kernel",
     (SL.rejection, V.REJECTION_033, V.REJECTION_0271, V.REJECTION_0230)),
    (_RUTILS, "_resample_kernel",
     (SL.resample, V.RESAMPLE_033, V.RESAMPLE_0271, V.RESAMPLE_0230)),
    (_RUTILS, "_compute_block_stats_kernel", (V.STATS_0271,)),  # 0.23.0's name
    (_RUTILS, "_insert_resampled_kernel", (SL.insert_resampled,)),
    # the EAGLE drafter: 0.17.0's own speculator; 0.34.0's EAGLE / MTP base
    (f"{_GPU}.spec_decode.eagle.speculator", "_prepare_eagle_inputs_kernel",
     (S.prepare_eagle_inputs,)),
    (f"{_GPU}.spec_decode.eagle.speculator", "_prepare_eagle_docode_kernel",  # (sic)
     (S.prepare_eagle_decode,)),
    (f"{_GPU}.spec_decode.eagle.speculator", "_update_eagle_inputs_kernel",
     (S.update_eagle_inputs,)),
    # ... 0.23.0-0.27.1's autoregressive/speculator.py (no draft sampling key)
    (_ARV, "_prepare_prefill_inputs_kernel", (D.prepare_prefill_inputs,)),
    (_ARV, "_prepare_decode_inputs_kernel", (V.DECODE_0271,)),
    (_ARV, "_update_draft_inputs_kernel", (V.UPDATE_DRAFT_0271,)),
    (_AR, "_prepare_prefill_inputs_kernel", (D.prepare_prefill_inputs,)),
    (_AR, "_prepare_decode_inputs_kernel", (D.prepare_decode_inputs,)),
    (_AR, "_update_draft_inputs_kernel", (D.update_draft_inputs, V.UPDATE_DRAFT_033)),
    (f"{_GPU}.structured_outputs", "_apply_grammar_bitmask_kernel",
     (S.apply_grammar_bitmask, SL.apply_grammar_bitmask)),
    # requests asking for logprobs and prompt logprobs (a configuration beside the driven
    # path: its modules stay out of DRIVEN_MODULES, whose files the verified releases'
    # digests cover; a kernel of theirs with no stand-in fails on its launch, unnamed)
    (_LOGPROB, "_topk_log_softmax_kernel",
     (LP.topk_log_softmax, LP.topk_log_softmax_blocked, LP.topk_log_softmax_strided)),
    (_LOGPROB, "_ranks_kernel", (LP.ranks,)),
    (_PROMPT_LOGPROB, "_prompt_logprobs_token_ids_kernel",
     (LP.prompt_logprobs_token_ids, LP.prompt_logprobs_prefill_token_ids)),
)

DRIVEN_MODULES = (
    f"{_GPU}.model_runner", f"{_GPU}.async_utils", f"{_GPU}.buffer_utils", _BATCH,
    _TABLE, f"{_GPU}.states", f"{_GPU}.structured_outputs", f"{_GPU}.sample.sampler",
    f"{_GPU}.sample.states", _GUMBEL, f"{_GPU}.sample.greedy_argmax",
    f"{_GPU}.spec_decode.utils", f"{_GPU}.spec_decode.rejection_sample", _REJECT, _RUTILS,
    f"{_GPU}.spec_decode.speculator", f"{_GPU}.spec_decode.eagle.speculator",
    _ARV, _AR,
)

# (module, kernel) -> why the driven path never launches it
NOT_LAUNCHED: Dict[Tuple[str, str], str] = {
    (_GUMBEL, "_temperature_kernel"): "greedy requests: no temperature to apply",
    (_RUTILS, "_compute_cumulative_log_p_kernel"): "block verification only",
    (_RUTILS, "_compute_local_residual_mass_kernel"): "block verification only",
    (f"{_GPU}.mm.rope", "_prepare_rope_positions_kernel"): "M-RoPE models only",
    (_BATCH, "_post_update_pool_kernel"): "pooling models only",
    # 0.18.0-0.19.0: rejection_sample_method "probabilistic" (the default is "strict")
    **{(_REJECT, k): "probabilistic rejection sampling only" for k in (
        "_probabilistic_rejection_sample_kernel", "_probabilistic_rejection_kernel",
        "_compute_residual_logits_kernel", "_gather_draft_logits_and_target_argmax_kernel")},
}


@functools.lru_cache(maxsize=None)
def jit_functions(path: str) -> Tuple[str, ...]:
    """The module-level ``@triton.jit`` functions of the source file at ``path``."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return ()
    return tuple(n.name for n in tree.body if isinstance(n, ast.FunctionDef)
                 and any("jit" in ast.unparse(d) for d in n.decorator_list))


def kernel_params(obj) -> Tuple[str, ...]:
    """A kernel's parameter names: a Triton ``JITFunction``'s ``arg_names``, or (no
    Triton: vLLM's placeholder leaves the function itself) its signature's."""
    names = getattr(obj, "arg_names", None)
    if names is None:
        names = inspect.signature(getattr(obj, "fn", obj)).parameters
    return tuple(names)


def stand_in_params(fn: Callable) -> Tuple[str, ...]:
    return tuple(p for p in inspect.signature(fn).parameters if p != "grid")


def params_match(fn: Callable, params: Tuple[str, ...]) -> bool:
    return stand_in_params(fn) == tuple(params)


def choose(stand_ins: Tuple[Callable, ...], params: Tuple[str, ...]):
    """The stand-in that takes exactly ``params``, or None."""
    return next((fn for fn in stand_ins if params_match(fn, params)), None)


# 0.17.0's table, by kernel name (what the module bound before releases were told
# apart): name -> (stand-in, module)
MRV2_KERNEL_SEAMS: Dict[str, Tuple[Callable, str]] = {
    name: (fns[0], module) for module, name, fns in KERNELS
    if fns[0].__module__ in (K.__name__, S.__name__)}


def launched(root: str, module: str) -> List[Tuple[str, str]]:
    """(the defining module, the kernel) of each ``name[grid](...)`` launch in the source
    of ``module`` (under the package at ``root``) whose name is a ``@triton.jit``
    function of the module itself or imported from another of the package."""
    parsed = static.parse(static.module_path(root, module))
    if parsed is None:
        return []
    own = set(jit_functions(static.module_path(root, module)))
    imported = static.imported_names(root, module)
    out = []
    for n in ast.walk(parsed[0]):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript)
                and isinstance(n.func.value, ast.Name)):
            continue
        name = n.func.value.id
        if name in own:
            out.append((module, name))
        elif name in imported and name in jit_functions(
                static.module_path(root, imported[name])):
            out.append((imported[name], name))
    return sorted(set(out))
