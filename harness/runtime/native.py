"""Declared effects of native calls that write tensors behind torch's back.

Some libraries hand a tensor's memory to C++ (DLPack, a data pointer) and write it there:
no aten op runs, so neither backend's dispatch mode sees the write. For pinned host
memory that hides a real bug class from the detector -- the host filling a staging buffer
after the non_blocking copy that reads it was queued ("upload before fill"). Each such
call is declared here with the access it makes, and wrapped once per process (never per
run: swapping class attributes around every traced run crashed CPython on the H200, see
``cuda.api``). The wrapper reports to whichever run is recording (the current run's
``recorder``, ``seams.context``) and is a plain call otherwise.

Declared:

* ``xgrammar.GrammarMatcher.fill_next_token_bitmask(bitmask, index)`` writes row
  ``index`` of ``bitmask`` (the whole tensor when it is one row).
"""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable, Optional, Tuple

import torch

from seams.context import current
from harness.runtime.trace import user_frame


def _bitmask_row(args: tuple, kwargs: dict) -> Optional[torch.Tensor]:
    """The part of the bitmask ``fill_next_token_bitmask(self, bitmask, index=0)`` writes."""
    bitmask = args[1] if len(args) > 1 else kwargs.get("bitmask")
    index = args[2] if len(args) > 2 else kwargs.get("index", 0)
    if not isinstance(bitmask, torch.Tensor):
        return None
    return bitmask.select(0, int(index)) if bitmask.dim() > 1 else bitmask


# (module, class, method, the tensor written given the call's arguments)
DECLARED: Tuple[Tuple[str, str, str, Callable[[tuple, dict], Optional[torch.Tensor]]], ...] = (
    ("xgrammar", "GrammarMatcher", "fill_next_token_bitmask", _bitmask_row),
)

_WRAPPED = set()
# hostmem.note_host(t, write, frame), handed over by ``ensure_wrapped`` (hostmem calls it:
# importing hostmem here would make the two modules a circle)
_note_host: Callable[..., None] = lambda t, write, frame: None


def _wrap(orig: Callable[..., Any], written: Callable[[tuple, dict], Optional[torch.Tensor]]
          ) -> Callable[..., Any]:
    @functools.wraps(orig)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        res = orig(*args, **kwargs)
        ctx = current()
        if ctx.recorder is not None and ctx.pinned:
            t = written(args, kwargs)
            if t is not None:
                _note_host(t, True, user_frame(2))
        return res

    wrapped._specrace_native = True
    return wrapped


def ensure_wrapped(note_host: Callable[..., None]) -> None:
    """Wrap every declared call whose library is loaded (cheap once all are done); the
    wrappers report through ``note_host`` (``hostmem.note_host``)."""
    global _note_host
    _note_host = note_host
    if len(_WRAPPED) == len(DECLARED):
        return
    for mod_name, cls_name, meth, written in DECLARED:
        key = (mod_name, cls_name, meth)
        mod = sys.modules.get(mod_name)
        if key in _WRAPPED or mod is None:
            continue  # not imported (yet): nothing can call it
        cls = getattr(mod, cls_name, None)
        orig = getattr(cls, meth, None) if cls is not None else None
        if orig is None:
            continue
        if not getattr(orig, "_specrace_native", False):
            setattr(cls, meth, _wrap(orig, written))
        _WRAPPED.add(key)
