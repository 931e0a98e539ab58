"""Where the EAGLE v2 slice binds its declared kernel stand-ins (``slices/eagle_kernels``).

Each GPU kernel on upstream's EAGLE v2 path that has no torch path is launched through a
module-level name of the module that calls it, and releases spell that launch
differently: 0.5.23 calls launcher functions (``assign_draft_cache_locs_contiguous_func``
and kin), 0.5.19-0.5.22 launch the Triton kernel object itself
(``assign_draft_cache_locs_contiguous[(bs,)](...)``) or call the tree-build wrapper's
platform kernel (``sgl_build_tree_kernel_efficient``), and take the accepted tree path's
target slots from ``req_to_token`` (``assign_extend_cache_locs[(bs,)]``) where 0.5.23
takes them from the verify window's front (``fill_front_out_cache_loc_func``). A release
is read, never its version: for each kernel the first way whose seam its source binds is
the one the slice binds (the stand-in of that name), and each kernel needs one
(``contract.DRIVER_NEEDS``: ways, any one of which meets it; a release with none is "not
driven", the first way named).

Read statically, like the contract: nothing here imports sglang.
"""
from __future__ import annotations

from typing import Optional, Tuple

from targets import static

_OU = "sglang.srt.managers.overlap_utils"
_EWC = "sglang.srt.speculative.eagle_worker_common"
_EU = "sglang.srt.speculative.eagle_utils"
_SU = "sglang.srt.speculative.spec_utils"
_CL = "sglang.kernels.ops.speculative.cache_locs"
_FBI = "sglang.srt.model_executor.forward_batch_info"
_EV2 = "sglang.srt.speculative.eagle_worker_v2"
# the kernels' module before they moved to sglang.kernels (0.5.15)
_TCL = "sglang.srt.speculative.triton_ops.cache_locs"

# kernel -> the "module:name" seams a release launches it through, the newest way first
# (the first is the one named when a release has none). A seam's stand-in is the
# eagle_kernels attribute of the same name, with the same parameters as what it replaces.
EAGLE_KERNEL_WAYS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("the relayed draft state's row gather", (f"{_OU}:gather_spec_extras",)),
    # the launcher function (0.5.23), or the Triton kernel launched by its grid
    # (0.5.15: the kernel in its own module, which prepare_for_draft imports at each call)
    ("the draft's KV slots", (f"{_EWC}:assign_draft_cache_locs_contiguous_func",
                              f"{_EWC}:assign_draft_cache_locs_contiguous",
                              f"{_TCL}:assign_draft_cache_locs_contiguous")),
    # the launcher function, or the Triton kernel the worker's verify launches (0.5.15)
    ("the bonus tokens", (f"{_EWC}:fill_bonus_tokens_func", f"{_EV2}:fill_bonus_tokens")),
    # the launcher function (0.5.23), or the platform kernel the tree-build wrapper calls
    # on CUDA / HIP (and on the simulator: its other branches are NPU, XPU, CPU engine)
    ("the verify tree's build", (f"{_EU}:build_tree_kernel_efficient_func",
                                 f"{_EU}:sgl_build_tree_kernel_efficient")),
    ("the greedy tree verify", (f"{_EU}:verify_tree_greedy_func",)),
    # topk > 1, the accepted path's KV move (move_accept_tokens_to_target_kvcache): its
    # target slots from the verify window's front (0.5.23), or from req_to_token
    ("the accepted path's target slots", (f"{_SU}:fill_front_out_cache_loc_func",
                                          f"{_SU}:assign_extend_cache_locs")),
    ("the accepted path's source slots", (f"{_SU}:fill_accept_out_cache_loc_func",
                                          f"{_SU}:fill_accept_out_cache_loc")),
    # the verify window's slots off a GPU: the out-of-tree platform's seam, which the
    # simulator platform answers (0.5.21 on: nothing to bind), or the launcher the
    # verify's uniform launcher falls back to there -- which, before the platform seam,
    # has no branch for another device and returns None (0.5.19, 0.5.20)
    ("the verify window's slots", (f"{_CL}:_get_oot_speculative_cache_locs_fn",
                                   f"{_CL}:assign_extend_cache_locs_func",
                                   f"{_TCL}:assign_extend_cache_locs_func")),
    # an extend's positions (the forward batch's, on a backend that supports Triton)
    ("the extend positions", (f"{_FBI}:compute_position_triton",)),
)
# ways the platform answers (targets/sglang/boundary/platform.py): found, nothing bound
PLATFORM_WAYS = (f"{_CL}:_get_oot_speculative_cache_locs_fn",)


def binds(root: str, seam: str) -> bool:
    """Does the release at ``root`` bind ``module:name`` at its module's top level -- an
    import behind a platform gate (``if _is_cuda or _is_hip:``) included: the call site
    looks the name up when it runs, so the stand-in bound there is what it calls."""
    module, _, name = seam.partition(":")
    return static.has_module_attribute(root, module, name, gated=True)


def seams_in(root: str) -> Tuple[str, ...]:
    """The seam the slice binds for each kernel: the first way the release binds (a way
    the platform answers binds nothing)."""
    chosen = (next((seam for seam in ways if binds(root, seam)), None)
              for _, ways in EAGLE_KERNEL_WAYS)
    return tuple(seam for seam in chosen if seam and seam not in PLATFORM_WAYS)


def missing(root: str) -> Optional[str]:
    """The first kernel none of whose seams the release binds, its first way named
    (None: every kernel has one)."""
    return next((ways[0] for _, ways in EAGLE_KERNEL_WAYS
                 if not any(binds(root, seam) for seam in ways)), None)
