"""The sglang target's variants, as run-time patches of the installed classes.

``pre-fix`` is the inverse of PR #35198 patched into upstream's own functions: before it,
``NgramVerifyInput.filter_batch`` / ``merge_batch`` gathered ``accept_tokens`` /
``accept_lens`` on the schedule stream (they now only slice ``future_indices``), and the
FutureMap neither stashed nor resolved ngram state (it rode on ``batch.spec_info``). The
fence: ``coarse`` is upstream's own switch ``SGLANG_FORCE_COARSE_WAR_BARRIER``.

Each patch must fit the installed source exactly (``seams.sourcepatch``): a release
that moved the code is a harness error naming the patch, never a silent pass.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Tuple

from seams.sourcepatch import SourcePatch, all_applied

_NGRAM = "sglang.srt.speculative.ngram_info:NgramVerifyInput"
_FUTURE_MAP = "sglang.srt.managers.overlap_utils:FutureMap"

PRE_FIX: Tuple[SourcePatch, ...] = (
    SourcePatch(f"{_NGRAM}.filter_batch", ((
        "            self.future_indices = self.future_indices[new_indices]\n"
        "            return\n",
        "            self.future_indices = self.future_indices[new_indices]\n"),),
        "pre-fix filter_batch (gathers accept state on the schedule stream)"),
    SourcePatch(f"{_NGRAM}.merge_batch", ((
        "                (self.future_indices, spec_info.future_indices), dim=0\n"
        "            )\n"
        "            return\n",
        "                (self.future_indices, spec_info.future_indices), dim=0\n"
        "            )\n"),),
        "pre-fix merge_batch (concatenates accept state on the schedule stream)"),
    SourcePatch(f"{_FUTURE_MAP}.stash", ((
        "        if self.spec_algo.is_ngram():\n"
        "            self._maybe_init_ngram_bufs(payload)\n",
        "        if self.spec_algo.is_ngram():\n"
        "            return  # pre-#35198: ngram state rides on batch.spec_info\n"),),
        "pre-fix stash (no ngram relay)"),
    SourcePatch(f"{_FUTURE_MAP}._resolve_spec_extras", ((
        "            draft_input.accept_tokens = self.accept_tokens_buf[indices].flatten()\n"
        "            draft_input.accept_lens = self.accept_lens_buf[indices]\n",
        ""),),
        "pre-fix _resolve_spec_extras (no ngram resolve)"),
)


# The simulator as the GPU it stands for. Releases up to 0.5.22 branch their result D2H
# (``managers/utils.py:_async_d2h``, in 0.5.22 ``utils/common.py:async_d2h``) on
# ``is_cuda``, which a simulated tensor is not,
# and would take the host path with no pinned buffer and no ``record_stream``. On the
# simulator only, that test reads as a GPU reads it (0.5.23's own ``async_d2h`` is
# device-generic and needs no patch; where the snippet is absent the patch is skipped).
SIM_AS_GPU: Tuple[SourcePatch, ...] = (
    SourcePatch("sglang.srt.managers.utils:_async_d2h", (
        ("    if not t.is_cuda:\n", "    if t.device.type == \"cpu\":\n"),
        ("t.record_stream(torch.cuda.current_stream(t.device))",
         "t.record_stream(torch.get_device_module(t.device).current_stream())")),
        "the simulator as a GPU in _async_d2h (releases up to 0.5.22)"),
    # 0.5.22 moved it to utils/common.py:async_d2h, with the same test
    SourcePatch("sglang.srt.utils.common:async_d2h", (
        ("    if not tensor.is_cuda:\n", "    if tensor.device.type == \"cpu\":\n"),
        ("tensor.record_stream(torch.cuda.current_stream(tensor.device))",
         "tensor.record_stream(torch.get_device_module(tensor.device).current_stream())")),
        "the simulator as a GPU in async_d2h (0.5.22)"),
)


def platform_patches() -> Tuple[SourcePatch, ...]:
    """The SIM_AS_GPU patches that fit the installed release, on a machine without CUDA."""
    import torch
    from targets import static
    if torch.cuda.is_available():
        return ()
    root = static.package_root("sglang")
    return tuple(p for p in SIM_AS_GPU if root and not static.patch_fits(root, p.target,
                                                                         p.edits))


def relay_patches(relay: str) -> Tuple[SourcePatch, ...]:
    if relay == "future_map":
        return ()
    if relay == "spec_info":
        return PRE_FIX
    raise ValueError(f"relay must be future_map or spec_info, not {relay!r}")


@contextlib.contextmanager
def variant_patches(args) -> Iterator[None]:
    """Everything a run with these server args patches, for the duration of the run."""
    from sglang.srt.environ import envs
    with contextlib.ExitStack() as stack:
        stack.enter_context(all_applied(platform_patches() + relay_patches(args.relay)))
        if args.war_barrier == "coarse" and hasattr(envs, "SGLANG_FORCE_COARSE_WAR_BARRIER"):
            # upstream's own switch (0.5.16+); before it, a forward that publishes no
            # read-done event is the coarse fence (the toy worker then publishes none)
            stack.enter_context(envs.SGLANG_FORCE_COARSE_WAR_BARRIER.override(True))
        yield
