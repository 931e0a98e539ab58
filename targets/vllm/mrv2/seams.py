"""Where Model Runner V2's Triton kernels and its one compiled op are replaced for a run.

MRv2 launches each kernel as ``name[grid](...)`` through a module-level name. Which
kernels the path launches, and the stand-in for each per release, is ``table``
(``KERNELS``); each is bound only where the release defines it, with the stand-in whose
parameters are the kernel's. How it is bound depends on the release:

* with vLLM's own kernel-override seam (``vllm/triton_utils/dispatcher.py``:
  ``register_kernels``, what a platform's ``register_triton_kernel_overrides`` calls)
  where it hands the implementation the launch's grid (0.34.0; ``_dispatcher_passes_
  grid``: 0.33.0's does not), through it: it replaces the defining module's name and every ``from ... import``
  copy. Its registrations are for the process (it has no undo), so each kernel is
  registered once, as a switch that runs the stand-in while ``installed()`` is active
  and raises outside it;
* without it (0.17.0 has none; 0.33.0's drops the grid), the name is rebound in the defining module and in every
  vLLM module holding the same kernel object, and put back after the run.

Either way, a ``@triton.jit`` kernel of a driven module (``table.DRIVEN_MODULES``) that
no stand-in covers is bound for the run to ``_Missing``, which raises naming it: a
kernel the path reaches without a stand-in fails loudly, never silently (without Triton
vLLM's placeholder leaves a kernel a plain function, ``'function' object is not
subscriptable`` at best).

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
import importlib.util
import logging
import sys
import warnings
from typing import Callable, Dict, Iterator, List, Tuple

import torch

from targets.vllm.engine.kernels import GridKernel, _next_power_of_2
from targets.vllm.mrv2 import table
from targets.vllm.mrv2.table import MRV2_KERNEL_SEAMS  # noqa: F401  (0.17.0's table)

# the compiled op's name in the module that calls it
UVA_SEAM = (f"{table._GPU}.buffer_utils", "get_accelerator_view_from_cpu_tensor")
DISPATCHER = "vllm.triton_utils.dispatcher"


def uva_view(cpu_tensor: torch.Tensor) -> torch.Tensor:
    """``cpu_tensor``'s pinned memory as a device tensor (what the compiled op makes): on
    the simulator the runtime's UVA view; on CUDA the same zero-copy mapping the op makes,
    its accesses recorded as the pinned buffer's in a traced run (not yet run on a GPU:
    docs/gpus.md, owed GPU measurements)."""
    from seams.context import current
    ctx = current()
    if ctx.sim_device is not None:
        from harness.runtime.sim.runtime import SimRuntime
        return SimRuntime(ctx.sim_device).uva_view(cpu_tensor)
    from harness.runtime.cuda.runtime import mapped_view
    return mapped_view(cpu_tensor, torch.device("cuda", torch.cuda.current_device()),
                       ctx.cuda_capture)


# Triton's launch options (how the GPU runs a kernel, not what it computes)
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas")


class _Launch(GridKernel):
    """``stand_in[grid](*args, **kwargs)`` with Triton's launch options dropped."""

    def __getitem__(self, grid):
        launch = GridKernel.__getitem__(self, grid)
        return lambda *args, **kwargs: launch(
            *args, **{k: v for k, v in kwargs.items() if k not in LAUNCH_OPTIONS})


class _Missing:
    """A driven module's kernel no stand-in covers: launching it is an error."""

    def __init__(self, qualname: str) -> None:
        self.qualname = qualname

    def __getitem__(self, grid):
        raise NotImplementedError(f"{self.qualname} was launched, and specrace has no "
                                  f"stand-in for it (targets/vllm/mrv2/table.py)")


_ACTIVE = [0]  # how many installed() blocks are open (the dispatcher's switches)
_REGISTERED: Dict[str, "_Switch"] = {}  # dispatcher registrations of this process


class _Switch:
    """A kernel registered with vLLM's dispatcher: the stand-in while a run is on."""

    def __init__(self, qualname: str, launch: _Launch) -> None:
        self.qualname, self.launch = qualname, launch

    def __getitem__(self, grid):
        if not _ACTIVE[0]:
            raise RuntimeError(f"{self.qualname} launched outside a specrace run (its "
                               f"stand-in is registered for runs only)")
        return self.launch[grid]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def bindings() -> List[Tuple[str, str, Callable]]:
    """(module, kernel, stand-in) for each kernel of ``table.KERNELS`` the installed
    release defines (importing its module); a kernel no stand-in takes is an error."""
    out = []
    for module, name, fns in table.KERNELS:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue  # not in this release
        if not hasattr(mod, name):
            continue
        params = table.kernel_params(getattr(mod, name))
        fn = table.choose(fns, params)
        if fn is None:
            raise LookupError(f"{module}.{name}{params}: no stand-in of specrace's takes "
                              f"these parameters")
        out.append((module, name, fn))
    return out


def _rebind(original, replacement, saved: list) -> None:
    """Every vLLM module attribute that is ``original``, bound to ``replacement``."""
    for modname, mod in list(sys.modules.items()):
        if not modname.startswith("vllm") or mod is None:
            continue
        for attr, value in list(getattr(mod, "__dict__", {}).items()):
            if value is original:
                saved.append((mod, attr, value))
                setattr(mod, attr, replacement)


def _register(binds: List[Tuple[str, str, Callable]]) -> None:
    """The kernels with vLLM's dispatcher, once per process."""
    from vllm.triton_utils.dispatcher import register_kernels
    new = {}
    for module, name, fn in binds:
        key = f"{module}.{name}"
        if key not in _REGISTERED:
            _REGISTERED[key] = new[key] = _Switch(key, _Launch(name, fn))
    if new:
        # its scan reads every module's attributes: quiet the deprecation warnings and
        # torch's "Triton not available" note that touching some of them raises
        with warnings.catch_warnings(), _quiet("torch._library.triton"):
            warnings.simplefilter("ignore")
            register_kernels(new)


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    log = logging.getLogger(logger)
    before = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(before)


def _dispatcher_passes_grid() -> bool:
    """Does the release's kernel-override seam hand an implementation the launch's grid
    (0.34.0: an implementation with ``__getitem__`` gets ``[grid]``)? 0.33.0's calls it
    with the launch arguments alone, and the stand-ins need the grid (it is how many
    programs run): there the names are rebound as where there is no seam."""
    if importlib.util.find_spec(DISPATCHER) is None:
        return False
    from vllm.triton_utils.dispatcher import KernelOverride

    def kernel(x):  # a kernel as vLLM's Triton placeholder leaves it: a plain function
        return x

    class Launcher:
        def __getitem__(self, grid):
            return grid

    try:
        return KernelOverride(kernel, Launcher())[(3,)] == (3,)
    except Exception:  # its constructor or launch refuses such an implementation
        return False


def _unbound(bound: set) -> List[Tuple[str, str]]:
    """(module, kernel) of each ``@triton.jit`` function of a driven module that no
    stand-in covers (read from the module's source)."""
    out = []
    for module in table.DRIVEN_MODULES:
        mod = sys.modules.get(module)
        if mod is None or not getattr(mod, "__file__", None):
            continue
        for name in table.jit_functions(mod.__file__):
            if (module, name) not in bound:
                out.append((module, name))
    return out


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """The stand-ins and the UVA view bound for the block; Triton's ``cdiv`` and
    ``next_power_of_2`` (MRv2 sizes grids with them on the host) given to vLLM's Triton
    placeholder where Triton is absent."""
    import vllm.triton_utils as triton_utils
    from targets.vllm.boundary.contract import refuse_undriven
    refuse_undriven(True)  # a release whose MRv2 the contract refuses: named, not bound
    with _quiet("torch._library.triton"):  # (a module's op registration asks for Triton)
        for module in table.DRIVEN_MODULES:
            try:
                importlib.import_module(module)
            except ImportError:
                pass  # not in this release
    binds = bindings()
    saved: list = []
    use_dispatcher = _dispatcher_passes_grid()
    if use_dispatcher:
        _register(binds)
    else:
        for module, name, fn in binds:
            mod = sys.modules[module]
            _rebind(getattr(mod, name), _Launch(name, fn), saved)
    bound = {(m, n) for m, n, _ in binds}
    for module, name in _unbound(bound):
        mod = sys.modules[module]
        saved.append((mod, name, getattr(mod, name)))
        setattr(mod, name, _Missing(f"{module}.{name}"))
    mod = importlib.import_module(UVA_SEAM[0])
    saved.append((mod, UVA_SEAM[1], getattr(mod, UVA_SEAM[1])))
    setattr(mod, UVA_SEAM[1], uva_view)
    triton = triton_utils.triton
    added = [n for n, f in (("cdiv", _cdiv), ("next_power_of_2", _next_power_of_2))
             if not hasattr(triton, n)]
    for n in added:
        setattr(triton, n, {"cdiv": _cdiv, "next_power_of_2": _next_power_of_2}[n])
    _ACTIVE[0] += 1
    try:
        yield
    finally:
        _ACTIVE[0] -= 1
        for mod, name, before in reversed(saved):
            setattr(mod, name, before)
        for n in added:
            delattr(triton, n)
