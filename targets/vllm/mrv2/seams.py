"""Where Model Runner V2's Triton kernels and its one compiled op are replaced for a run.

MRv2 launches each kernel as ``name[grid](...)`` through a module-level name of the
module that defines it (0.17.0 has no kernel-override seam of its own), so, as for the
V1 path (``targets/vllm/engine/kernels.py``), each stand-in is bound under that name for
the run and the original put back after. ``MRV2_KERNEL_SEAMS`` lists every kernel the
driven path launches -- greedy sampling, EAGLE spec decode, async scheduling, structured
outputs -- with its launching module; the kernels it does not launch (temperature,
penalties, logit bias, bad words, min-p, logprobs, M-RoPE, pooling, context parallel)
are left unbound, so reaching one fails loudly (a ``@triton.jit`` function without
Triton is a plain function: ``'function' object is not subscriptable``).

The compiled op: ``UvaBuffer`` maps pinned host memory into the device's address space
with ``get_accelerator_view_from_cpu_tensor`` (``torch.ops._C.get_cuda_view_from_cpu_
tensor``, in vLLM's compiled extension, absent from a python-only install). Bound in
``buffer_utils`` under that name: on the simulator, the runtime's UVA view of the pinned
buffer (``harness.runtime.sim.runtime.SimRuntime.uva_view``: a device tensor on the
buffer's own storage, read by a kernel when it executes).
"""
from __future__ import annotations

import contextlib
import importlib
from typing import Callable, Dict, Iterator, Tuple

import torch

from targets.vllm.engine.kernels import GridKernel, _next_power_of_2
from targets.vllm.mrv2 import kernels as K
from targets.vllm.mrv2 import spec_kernels as S

_GPU = "vllm.v1.worker.gpu"
_BATCH = f"{_GPU}.input_batch"
_EAGLE = f"{_GPU}.spec_decode.eagle.speculator"

# kernel name -> (its stand-in, the module that defines and launches it)
MRV2_KERNEL_SEAMS: Dict[str, Tuple[Callable, str]] = {
    "_apply_write_kernel": (K.apply_write, f"{_GPU}.buffer_utils"),
    "_prepare_prefill_inputs_kernel": (K.prepare_prefill_inputs, _BATCH),
    "_prepare_pos_seq_lens_kernel": (K.prepare_pos_seq_lens, _BATCH),
    "_combine_sampled_and_draft_tokens_kernel": (K.combine_sampled_and_draft_tokens,
                                                 _BATCH),
    "_get_num_sampled_and_rejected_kernel": (K.get_num_sampled_and_rejected, _BATCH),
    "_post_update_kernel": (K.post_update, _BATCH),
    "_expand_idx_mapping_kernel": (K.expand_idx_mapping, _BATCH),
    "_gather_block_tables_kernel": (K.gather_block_tables, f"{_GPU}.block_table"),
    "_compute_slot_mappings_kernel": (K.compute_slot_mappings, f"{_GPU}.block_table"),
    "_gumbel_sample_kernel": (S.gumbel_sample, f"{_GPU}.sample.gumbel"),
    "_rejection_sample_kernel": (S.rejection_sample, f"{_GPU}.spec_decode.rejection_sample"),
    "_prepare_eagle_inputs_kernel": (S.prepare_eagle_inputs, _EAGLE),
    "_prepare_eagle_docode_kernel": (S.prepare_eagle_decode, _EAGLE),  # (sic) upstream
    "_update_eagle_inputs_kernel": (S.update_eagle_inputs, _EAGLE),
    "_apply_grammar_bitmask_kernel": (S.apply_grammar_bitmask, f"{_GPU}.structured_outputs"),
}

# the compiled op's name in the module that calls it
UVA_SEAM = (f"{_GPU}.buffer_utils", "get_accelerator_view_from_cpu_tensor")


def uva_view(cpu_tensor: torch.Tensor) -> torch.Tensor:
    """``cpu_tensor``'s pinned memory as a device tensor (what the compiled op makes)."""
    from seams.context import current
    dev = current().sim_device
    if dev is None:
        # on CUDA the view needs the capture's storage map (CudaRuntime.uva_view); MRv2
        # is driven on the simulator only so far
        raise NotImplementedError("Model Runner V2's UVA buffers are driven on the "
                                  "simulator only (targets/vllm/mrv2/seams.py)")
    from harness.runtime.sim.runtime import SimRuntime
    return SimRuntime(dev).uva_view(cpu_tensor)


# Triton's launch options (how the GPU runs a kernel, not what it computes)
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas")


class _Launch(GridKernel):
    """``stand_in[grid](*args, **kwargs)`` with Triton's launch options dropped."""

    def __getitem__(self, grid):
        launch = GridKernel.__getitem__(self, grid)
        return lambda *args, **kwargs: launch(
            *args, **{k: v for k, v in kwargs.items() if k not in LAUNCH_OPTIONS})


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """The stand-ins and the UVA view bound for the block; Triton's ``cdiv`` and
    ``next_power_of_2`` (MRv2 sizes grids with them on the host) given to vLLM's Triton
    placeholder where Triton is absent."""
    import vllm.triton_utils as triton_utils
    saved = []
    for name, (fn, module) in MRV2_KERNEL_SEAMS.items():
        mod = importlib.import_module(module)
        if not hasattr(mod, name):
            raise LookupError(f"{module} no longer defines the kernel {name}")
        saved.append((mod, name, getattr(mod, name)))
        setattr(mod, name, _Launch(name, fn))
    mod = importlib.import_module(UVA_SEAM[0])
    saved.append((mod, UVA_SEAM[1], getattr(mod, UVA_SEAM[1])))
    setattr(mod, UVA_SEAM[1], uva_view)
    triton = triton_utils.triton
    added = [n for n, f in (("cdiv", _cdiv), ("next_power_of_2", _next_power_of_2))
             if not hasattr(triton, n)]
    for n in added:
        setattr(triton, n, {"cdiv": _cdiv, "next_power_of_2": _next_power_of_2}[n])
    try:
        yield
    finally:
        for mod, name, before in reversed(saved):
            setattr(mod, name, before)
        for n in added:
            delattr(triton, n)
