"""Ours, named as such: a placeholder for a package a release imports on the driven path
but never calls there, where the release environment does not have it.

``numba``: vLLM's V1 runner imports the n-gram proposer at module level in 0.13.0 and
0.14.0 (0.13.0 ``v1/worker/gpu_model_runner.py:148``, 0.14.0 ``:153``; 0.17.0 only under
TYPE_CHECKING and where the n-gram method is built, ``:198``, ``:501``), and that module imports numba and JIT-compiles two
functions with it (``v1/spec_decode/ngram_proposer.py:6``, ``:175``, ``:204``). The
proposer is built only for ``method == "ngram"``; the target drafts with EAGLE or a
draft model, so nothing of numba runs, and numba is a large compiled package (with
llvmlite) that the release environments do not install. So where it is absent, ``numba`` is this placeholder, as vLLM's own ``triton_utils`` puts a placeholder
in for an absent Triton: its decorators hand back a function that raises when called,
and its thread calls raise -- a run that reached the n-gram proposer would stop with the
reason, never compute something the release does not.
"""
from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any, Callable

REASON = ("numba is not installed in this release environment (a placeholder stands in "
          "for its import: targets/vllm/engine/absent.py); the n-gram proposer cannot run")


def _unavailable(*args: Any, **kwargs: Any):
    raise RuntimeError(REASON)


def _decorator(*args: Any, **kwargs: Any) -> Callable:
    """``@jit`` / ``@njit``, bare or with options: the function, replaced by one that
    raises when called."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return _never(args[0])
    return _never


def _never(fn: Callable) -> Callable:
    def unavailable(*args: Any, **kwargs: Any):
        raise RuntimeError(f"{REASON} ({getattr(fn, '__qualname__', fn)!s} was called)")
    unavailable.__name__ = getattr(fn, "__name__", "unavailable")
    unavailable.__wrapped__ = fn
    return unavailable


def install() -> None:
    """``numba`` as the placeholder, where the environment has none (never over a real
    one); idempotent."""
    if "numba" in sys.modules or importlib.util.find_spec("numba") is not None:
        return
    mod = types.ModuleType("numba", "specrace's placeholder for an absent numba")
    mod.__specrace_placeholder__ = True
    mod.jit = mod.njit = _decorator
    mod.prange = range  # only ever read inside a JIT-compiled body, which never runs
    mod.get_num_threads = mod.set_num_threads = _unavailable
    sys.modules["numba"] = mod
    from seams import process
    process.note("vllm-numba-placeholder")
