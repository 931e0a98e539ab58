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
from seams.vocab import Fence, Relay

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


# (No patch makes the simulator read as a GPU: a simulated tensor answers ``is_cuda`` as
# the GPU it stands for -- one rule, ``harness/runtime/sim/tensor.py`` -- so upstream's
# own GPU paths run, ``_async_d2h`` / ``async_d2h`` and ``record_stream_each`` included.)


def relay_patches(relay: str) -> Tuple[SourcePatch, ...]:
    if relay == Relay.FUTURE_MAP:
        return ()
    if relay == Relay.SPEC_INFO:
        return PRE_FIX
    raise ValueError(f"relay must be future_map or spec_info, not {relay!r}")


@contextlib.contextmanager
def variant_patches(args) -> Iterator[None]:
    """Everything a run with these server args patches, for the duration of the run."""
    from sglang.srt.environ import envs
    with contextlib.ExitStack() as stack:
        stack.enter_context(all_applied(relay_patches(args.relay)))
        if args.war_barrier == Fence.COARSE and hasattr(envs, "SGLANG_FORCE_COARSE_WAR_BARRIER"):
            # upstream's own switch (0.5.16+); before it, a forward that publishes no
            # read-done event is the coarse fence (the toy worker then publishes none)
            stack.enter_context(envs.SGLANG_FORCE_COARSE_WAR_BARRIER.override(True))
        yield
