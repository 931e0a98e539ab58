"""The contract: what the sglang target relies on in the installed package, and its tier.

Everything here is read statically from the source files (``static``: no import, nothing
executed, nothing patched), before the target touches the package -- so a release that
turned a function into something else, dropped a dataclass or renamed a module attribute
is a named problem, never a crash, and the check cannot be satisfied by our own changes.

Tiers:

* *verified* -- a release we measured, with the files digest we measured
  (``VERIFIED``);
* *compatible* -- in ``SUPPORTED`` (a ``packaging`` specifier, pre-releases and local
  versions such as a main checkout's ``0.5.24.dev3+gabc`` included) and no problem
  below; the run goes ahead with one line on stderr, and the report records the tier;
* *unsupported* -- out of range, or any problem: exit 2, every problem named.

Problems: a function the target calls or patches whose parameters changed; a dataclass
field it fills or reads gone; a module attribute it sets gone; an attribute upstream's
loop methods read on ``self`` that the target's scheduler object does not provide
(derived from the installed ``Scheduler``'s source by an AST walk); a keyword the loop
passes to the worker that the toy worker does not take. Source patches (variants and
mutations) are dry-fitted separately (``patch_problems``): one that no longer fits
disables only what needs it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, Union

from packaging.specifiers import SpecifierSet

from targets import driven, static, tiers
from targets.sglang.boundary import bootstrap, eagle_seams, loop_contract

SUPPORTED = SpecifierSet(">=0.5.14,<0.6", prereleases=True)

# release -> the digest of its driven files, as measured: the release gate on the
# simulator and the seed scenario on the H200 (reports/upstream/releases.md,
# reports/gpu/sglang-releases-h200/). The module set grew over sessions, over the same release
# files; each earlier set's digests reproduce from the installed wheels (session 8 added
# the result processor and sampling params: before, 51a2dece54485432 / 3ad031963873b6c8 /
# 36c298e3dbf9b5fb; session 6: 352adbbd17f4b9ad / 549547635c77ce29 / 7ed884067df77bb2)
VERIFIED: Dict[str, str] = {
    "0.5.17": "23b34f6456d015c8",
    "0.5.18": "689699c740ec714d",
    "0.5.23": "972344de562a485d",
}

# The modules whose files the target drives (the report's digest covers them): the relay,
# batch, loop and grammar staging; the memory pools and the KV lifecycle
# (targets.sglang.engine.pools, kv_lifecycle); the EAGLE v2 and DSpark slices. A module a
# release does not have counts as missing.
DRIVEN_MODULES = bootstrap.MODULES + (  # the ones loaded at start, then:
    "sglang.srt.mem_cache.memory_pool", "sglang.srt.mem_cache.allocator.token",
    "sglang.srt.mem_cache.allocation", "sglang.srt.mem_cache.allocation_sizing",
    "sglang.srt.mem_cache.common", "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.base_prefix_cache",
    "sglang.srt.speculative.eagle_utils", "sglang.srt.speculative.eagle_worker_v2",
    "sglang.srt.speculative.eagle_worker_common",
    "sglang.srt.model_executor.forward_batch_info",
    "sglang.srt.speculative.dspark_components.dspark_planner",
    "sglang.srt.speculative.ragged_verify", "sglang.srt.speculative.draft_worker_common",
    # the result processing and the request (targets.sglang.engine.result_processor, requests)
    "sglang.srt.managers.scheduler_components.batch_result_processor",
    "sglang.srt.sampling.sampling_params",
)

_OU = "sglang.srt.managers.overlap_utils"
_SB = "sglang.srt.managers.schedule_batch"
_SCHED = "sglang.srt.managers.scheduler"
_SPEC = "sglang.srt.speculative.spec_utils"
_MR = "sglang.srt.model_executor.model_runner"
_EV2 = "sglang.srt.speculative.eagle_worker_v2"
_FB = "sglang.srt.model_executor.forward_batch_info"
# upstream's ModelRunner init steps the runner room calls, in ``__init__``'s order
MODEL_RUNNER_INIT_STEPS = ("init_spec_aux_hidden_state", "init_token_oracle",
                           "_init_post_memory_pool_components", "init_attention_backends",
                           "init_cuda_graphs")

# Functions the target calls itself -> the parameter names it calls them with, which
# must be a prefix (positional) or a subset (keyword) of what the release takes.
CALLED: Dict[str, Tuple[str, ...]] = {
    f"{_OU}:FutureMap.__init__": ("self", "device", "spec_algo", "req_to_token_pool"),
    f"{_SB}:ScheduleBatch.init_new": ("cls", "reqs", "req_to_token_pool",
                                      "token_to_kv_pool_allocator", "tree_cache",
                                      "model_config", "enable_overlap", "spec_algorithm"),
    f"{_SB}:ScheduleBatch.filter_batch": ("self",),
    f"{_SB}:ScheduleBatch.merge_batch": ("self", "other"),
    f"{_SCHED}:Scheduler.event_loop_overlap": ("self",),
    f"{_SCHED}:Scheduler.is_disable_overlap_for_batch": ("self", "batch"),
    f"{_SPEC}:record_stream_for_v2_verify": ("batch", "verify_input", "fwd_stream"),
}
# Of those, the ones the target calls from a wrapper that passes on the rest of upstream's
# own arguments (``type(s).is_disable_overlap_for_batch(s, batch, *rest, **kw)``): a
# parameter upstream added and passes itself needs nothing of the target.
PASSED_THROUGH = (f"{_SCHED}:Scheduler.is_disable_overlap_for_batch",)
CALLED_KEYWORDS: Dict[str, Tuple[str, ...]] = {
    f"{_SB}:ScheduleBatch.filter_batch": ("keep_indices",),
}
# Optional parts: absent in some releases, and then the scenarios that need them are
# "not applicable" there (``features``), not a contract problem.
# feature -> the code that has it: one target, or several that must all exist
FEATURES: Dict[str, Union[str, Tuple[str, ...]]] = {
    "grammar_tree": f"{_SPEC}:GrammarTree.from_device",
    "ngram_relay": f"{_OU}:FutureMap._maybe_init_ngram_bufs",
    "coarse_switch": "sglang.srt.environ:Envs.SGLANG_FORCE_COARSE_WAR_BARRIER",
    "war_barrier": f"{_SCHED}:Scheduler._apply_war_barrier",
    # the DSpark slice (targets/sglang/slices/dspark.py): the budget planner and the confidence
    # relay (0.5.16 on) and the draft input it hands the relay (its config: DRIVER_NEEDS)
    "dspark": ("sglang.srt.speculative.dspark_components.dspark_planner:"
               "DSparkVerifyPlanner.prepare_verify_budget",
               f"{_OU}:ConfidenceRelay.issue_ring_copy",
               "sglang.srt.speculative.draft_worker_common:make_draft_input_v2"),
    # the EAGLE v2 slice (targets/sglang/slices/eagle.py): the v2 worker's step and draft
    # extend, in every release that ships it (the verify is run_eagle_verify from 0.5.16, a
    # worker method before); its config and kernel seams: DRIVER_NEEDS
    "eagle_v2": (f"{_EV2}:EAGLEWorkerV2.forward_batch_generation",
                 f"{_EV2}:EagleDraftWorker._draft_extend_for_decode"),
    # upstream's model runner (targets/sglang/runner): its forward over a forward batch
    "model_runner": (f"{_MR}:ModelRunner.forward", f"{_FB}:ForwardBatch.init_new"),
}
_RC = "sglang.srt.runtime_context"
# How a release makes a run's server config current (``upstream.server_config``): the
# first way whose code it has -- a context of the run's own under ``use_context`` (0.5.22),
# the process's one context snapshotted, reset, set and restored, as ``Engine``'s launch
# restores it when it fails (0.5.19-0.5.21), reset and set by the scheduler's publish shim,
# last publish wins, as a process rebuilding an engine does (0.5.15-0.5.18), or with no
# context to reset (0.5.14) the same shim's module global, saved and put back after the run
_SA = "sglang.srt.server_args"
SERVER_CONFIG_WAYS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("use_context", (f"{_RC}:use_context",)),
    ("snapshot_context", tuple(f"{_RC}:{n}" for n in (
        "snapshot_context", "restore_context", "reset_context", "get_context",
        "RuntimeContext.set_server_args"))),
    ("publish", (f"{_RC}:reset_context", f"{_SA}:set_global_server_args_for_scheduler")),
    ("module_global", (f"{_SA}:set_global_server_args_for_scheduler",
                       f"{_SA}:_global_server_args")))
# What specrace's slice of a feature needs of the release beyond the feature's own code:
# where the release has the code but not these, the code is there and specrace cannot
# drive it -- "not driven", never "not applicable". Every slice makes its server config
# current by one of SERVER_CONFIG_WAYS, and EAGLE's stand-ins bind where the
# release launches each kernel (eagle_seams.EAGLE_KERNEL_WAYS: a launcher function, or the
# Triton kernel object launched by its grid). A need: a "module:qualname", or ways
# (tuples of them), any one of which meets it.
_ANY_SERVER_CONFIG_WAY = tuple(needs for _, needs in SERVER_CONFIG_WAYS)
# A one-rank server's ranks and groups (runner/ranks.py): on the context until clear_stamp
# (0.5.21 on), else in the globals its getters read, as initialize_model_parallel sets them,
# beside the ParallelState placement the scheduler builds (its ``trivial`` factory from
# 0.5.16; 0.5.15's scheduler fills the fields itself)
_PS, _DPA = "sglang.srt.distributed.parallel_state", "sglang.srt.layers.dp_attention"
RANK_WAYS = (("context_stamp", tuple(f"{_RC}:ParallelContext.{n}" for n in (
    "override_permanently", "clear_stamp"))), ("parallel_state_globals", (*(f"{_PS}:{g}" for g in (
        "_WORLD", "_TP", "_PP", "_ATTN_TP")), f"{_DPA}:_ATTN_DP_RANK",
    "sglang.srt.distributed.parallel_state_wrapper:ParallelState")))
DRIVER_NEEDS: Dict[str, Tuple[Union[str, Tuple[Tuple[str, ...], ...]], ...]] = {
    # the run's server config made current (any of SERVER_CONFIG_WAYS); a one-rank
    # server's ranks and groups kept the release's way (any of RANK_WAYS); the
    # runner built from __new__ plus these init steps (runner/build.py), the declared
    # stand-ins' seams (the backend registry, torch_native's extend, RadixAttention, the
    # KV pool's write) and the verify's layout (NgramVerifyInput); where one is missing
    # the NGRAM worker's target forward stays the toy model's
    "model_runner": (_ANY_SERVER_CONFIG_WAY,
                     tuple(needs for _, needs in RANK_WAYS),
                     *(f"{_MR}:ModelRunner.{step}" for step in MODEL_RUNNER_INIT_STEPS),
                     "sglang.srt.layers.attention.attention_registry:ATTENTION_BACKENDS",
                     "sglang.srt.layers.attention.torch_native_backend:"
                     "TorchNativeAttnBackend.forward_extend",
                     "sglang.srt.layers.radix_attention:RadixAttention.forward",
                     "sglang.srt.mem_cache.memory_pool:MHATokenToKVPool.set_kv_buffer",
                     "sglang.srt.speculative.ngram_info:NgramVerifyInput.__init__",
                     # the decode graphs: upstream's runner and full-graph backend, the
                     # capture's group context, the layer layout
                     "sglang.srt.model_executor.runner.decode_cuda_graph_runner:"
                     "DecodeCudaGraphRunner.execute",
                     "sglang.srt.model_executor.runner_backend.full_cuda_graph_backend:"
                     "FullCudaGraphBackend.capture_one",
                     "sglang.srt.distributed.parallel_state:GroupCoordinator.graph_capture",
                     f"{_MR}:resolve_layer_indices",
                     "sglang.srt.model_executor.cuda_graph_config:CudaGraphConfig"),
    "dspark": (_ANY_SERVER_CONFIG_WAY,),
    # the run's server config, a one-rank server's ranks and groups (the forward batch asks
    # for them), the kernel seams; no KV index translator: the toy runners build one where
    # the release's runner does (eagle_runners.builds_translator: 0.5.19 on)
    "eagle_v2": (_ANY_SERVER_CONFIG_WAY,
                 tuple(needs for _, needs in RANK_WAYS),
                 *(tuple((seam,) for seam in seams)
                   for _, seams in eagle_seams.EAGLE_KERNEL_WAYS)),
}

# Optional parts recognised by a line of their code rather than a name: feature -> (what
# the release lacks without it, any of the (function, snippet) places that have it).
SOURCE_FEATURES: Dict[str, Tuple[str, Tuple[Tuple[str, str], ...]]] = {
    # the result D2H as a leaf on its own copy stream (PR #29075, 0.5.15 on); before it,
    # copy_to_cpu ran on the forward stream, ordered before the next forward
    "leaf_result_copy": (
        "leaf result copy (its result D2H runs on the forward stream; the copy stream "
        "starts in 0.5.15)",
        ((f"{_SCHED}:Scheduler.run_batch", "self.copy_stream.wait_stream(self.forward_stream)"),
         (f"{_SCHED}:Scheduler._copy_result_to_cpu",
          "self.copy_stream.wait_stream(self.forward_stream)"))),
}

RESULT_CLASS = "sglang.srt.managers.utils:GenerationBatchResult"
RESULT_FIELDS = ("next_token_ids", "accept_lens", "new_seq_lens", "next_draft_input",
                 "copy_done", "speculative_num_draft_tokens")

# Module attributes the target reads or sets: (module, name)
ATTRIBUTES: Tuple[Tuple[str, str], ...] = (
    (_OU, "_is_cuda"),
    ("sglang.srt.environ", "envs"),
    (_SCHED, "is_cuda"),
)

# What the target's scheduler object carries (``scheduler_object.build_scheduler`` sets
# exactly these; a test holds it to that): real values, our four server-facing methods and
# the values of paths the target does not take (``scheduler_object.NotModelled``).
SCHEDULER_ATTRIBUTES = (
    "device", "device_module", "schedule_stream", "forward_stream", "copy_stream",
    "forward_stream_ctx", "copy_stream_ctx", "req_to_token_pool", "spec_algorithm",
    "future_map", "model_worker", "model_config", "_war_barrier_enabled", "enable_overlap",
    "is_generation", "enable_pdmux", "enable_unified_memory",
    "enable_unified_cache_external_linker", "enable_async_d2h_copy", "async_d2h_worker",
    "attn_dp_enabled", "enable_dp_attention", "require_mlp_sync", "disaggregation_mode",
    "chunked_req", "_confidence_budget_prepare", "gracefully_exit", "_engine_paused",
    "running_batch", "last_batch", "cur_batch", "cur_batch_for_debug", "result_queue",
    "scheduler_stage_metrics", "scripted_scheduler_hook", "forward_sleep_time",
    "metrics_reporter", "profiler_manager", "forward_ct", "processed_tokens_counter",
    "_sched_idled", "batch_record_buf", "batch_record_ct", "server_args", "beam_coordinator",
    # ours: intake, batch formation, result commit, idle
    "ingest_requests", "process_input_requests", "get_next_batch_to_run",
    "process_batch_result", "on_idle",
    "token_to_kv_pool_allocator",
    # read only on paths the target does not take
    "tp_worker", "pp_group", "tree_cache",
    "invariant_checker", "batch_result_processor", "ps",
    # releases before 0.5.20 receive through self.request_receiver.recv_requests()
    "request_receiver",
)
# The keywords the toy worker's forward_batch_generation takes.
WORKER_KEYWORDS = ("on_publish", "grammar_barrier")

# Driven modules that only later releases have (0.5.16 on: the allocation helpers, the
# DSpark and EAGLE v2 common modules): each parses where it is there
LATER_MODULES = ("sglang.srt.mem_cache.allocation", "sglang.srt.mem_cache.allocation_sizing",
                 "sglang.srt.speculative.eagle_worker_common",
                 "sglang.srt.speculative.dspark_components.dspark_planner",
                 "sglang.srt.speculative.ragged_verify",
                 "sglang.srt.speculative.draft_worker_common")
# What the target drives, as the shared discipline proves it (targets.driven): every
# driven module exists and parses, every function it calls has its kind and parameters
SURFACE = driven.Surface(
    modules=tuple(m for m in DRIVEN_MODULES if m not in LATER_MODULES),
    later_modules=LATER_MODULES, functions=CALLED, keywords=CALLED_KEYWORDS,
    passed_through=PASSED_THROUGH)

@dataclass
class Verdict:
    version: str
    tier: str  # verified | compatible | unsupported
    problems: List[str] = field(default_factory=list)
    digest: str = ""
    features: Dict[str, bool] = field(default_factory=dict)
    commit: Optional[str] = None  # a source checkout's git commit
    # files the target drives or ran whose content is not what the wheel recorded
    changed: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.tier != "unsupported"

    def line(self) -> str:
        what = f"sglang {self.version}"
        if self.tier == "compatible" and self.changed:
            return (f"{what} has files that are not the release's ({', '.join(self.changed[:3])}"
                    f"{', ...' if len(self.changed) > 3 else ''}); compatible: running it")
        if self.tier == "compatible":
            return (f"{what} is not a verified release; compatible (in {SUPPORTED}, its "
                    f"API checked; a variant or mutation whose patch no longer fits is "
                    f"disabled, named): running it")
        return f"{what}: {self.tier}"


def installed_version() -> str:
    """The installed sglang's version, or raise LookupError when it is not installed."""
    return tiers.installed_version("sglang")


def check_version(version: str) -> List[str]:
    return tiers.version_problems("sglang", version, SUPPORTED)


def check_api(root: str, provided: Tuple[str, ...], worker_keywords: Tuple[str, ...]
              ) -> List[str]:
    """Every difference between the source under ``root`` and what the target relies on.
    ``provided``: the attributes the target's scheduler object carries."""
    problems = driven.problems(root, SURFACE)
    broken = {m for m in (*SURFACE.modules, *SURFACE.later_modules)
              if static.module_problem(root, m)}  # said once, above
    fields, problem = static.dataclass_fields(root, RESULT_CLASS)
    if fields is None:
        if RESULT_CLASS.partition(":")[0] not in broken:
            problems.append(problem)
    else:
        problems += [f"GenerationBatchResult.{f} is missing" for f in RESULT_FIELDS
                     if f not in fields]
    for module, name in ATTRIBUTES:
        if module not in broken and not static.has_module_attribute(root, module, name):
            problems.append(f"{module}.{name} is missing")
    problems += loop_contract.loop_problems(root, provided, worker_keywords)
    return problems


def missing_code(root: str, feature: str) -> Optional[str]:
    """The first piece of ``feature``'s code the release at ``root`` lacks (None: all);
    for a feature recognised by its code (``SOURCE_FEATURES``), what the release has
    instead."""
    if feature in SOURCE_FEATURES:
        lacks, places = SOURCE_FEATURES[feature]
        found = any(snippet in (static.source_of(root, target) or "")
                    for target, snippet in places)
        return None if found else f"{feature}:{lacks}"
    needed = FEATURES[feature]
    return _first_absent(root, (needed,) if isinstance(needed, str) else needed)


def undriven(root: str, feature: str) -> Optional[str]:
    """What specrace's slice of ``feature`` needs that the release lacks (None: it can be
    driven); only meaningful where the feature's own code is there. A need of several
    ways lacks only where every way does: its first way's first absent piece is named."""
    for need in DRIVER_NEEDS.get(feature, ()):
        absent = [_first_absent(root, way)
                  for way in (((need,),) if isinstance(need, str) else need)]
        if all(absent):
            return absent[0]
    return None


def server_config_way(root: str, ways=SERVER_CONFIG_WAYS) -> Optional[str]:
    """The first of ``ways`` (how a run's config is made current; RANK_WAYS) it has."""
    return next((name for name, needs in ways if _first_absent(root, needs) is None), None)


def _first_absent(root: str, targets) -> Optional[str]:
    for target in targets:
        node, _ = static.find(root, target)
        module, _, name = target.partition(":")
        # a module-level name may be imported there (a kernel launcher the module calls),
        # on some platforms only (imported behind ``if _is_cuda:``; the slice binds it)
        if node is None and ("." in name or not static.has_module_attribute(
                root, module, name, gated=True)):
            return target
    return None


def features(root: str) -> Dict[str, bool]:
    return {name: missing_code(root, name) is None for name in (*FEATURES, *SOURCE_FEATURES)}


def source_commit(root: str) -> Optional[str]:
    """The git commit of a source checkout (``pip install -e`` of sglang's repo)."""
    import os
    import subprocess
    top = os.path.dirname(os.path.dirname(root))  # .../python/sglang -> repo
    if not os.path.isdir(os.path.join(top, ".git")):
        return None
    try:
        out = subprocess.run(["git", "-C", top, "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def evaluate(version: str, root: Optional[str], provided: Tuple[str, ...],
             worker_keywords: Tuple[str, ...]) -> Verdict:
    """The tier of the release at ``root`` (its version string from the metadata)."""
    problems = check_version(version)
    if root is None:
        problems.append("the sglang package's source cannot be found")
        return Verdict(version, "unsupported", problems)
    try:
        problems += check_api(root, provided, worker_keywords)
    except (RecursionError, MemoryError) as exc:  # the reader is bounded: never a crash
        problems.append(f"the contract could not read the source to the end "
                        f"({type(exc).__name__}): not provably drivable")
    digest, changed = tiers.driven_files(root, list(DRIVEN_MODULES))
    return Verdict(version, tiers.release_tier(version, problems, digest, changed, VERIFIED),
                   problems, digest, features(root), source_commit(root), changed)


def with_executed(verdict: Verdict, root: str, files) -> Verdict:
    """The verdict once a run has shown which of the package's files executed: one that
    is not the wheel's makes a verified release compatible, and is named."""
    changed = sorted(set(verdict.changed) | set(tiers.changed_files(root, files)))
    tier = verdict.tier
    if changed and tier == "verified":
        tier = "compatible"
    return dataclasses.replace(verdict, tier=tier, changed=changed)
