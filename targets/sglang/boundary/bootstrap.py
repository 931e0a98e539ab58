"""Import the installed sglang without its GPU-only dependencies.

The modules specrace drives (the FutureMap relay, the batch, three Scheduler methods, the
grammar staging) import GPU kernel packages at module level even though the code under
test never calls them: ``triton`` (``@triton.jit`` kernels, ``sglang/srt/utils/common.py``),
``torchvision`` (a multimodal config chain), ``sgl_kernel`` (quantisation schemes,
imported behind CUDA gates) and, in releases before 0.5.18 on a GPU, ``flashinfer`` and
``deep_gemm`` (module-level imports behind ``is_cuda()``). Where such a package is not installed, a *stand-in* takes its
place -- the approach sglang's own ``_platform_stubs`` takes for triton on macOS: every
attribute is another stand-in, a call is a pass-through decorator, a CamelCase name is a
class that can be subclassed or instantiated. Nothing in a stand-in ever runs a kernel;
if the code under test reached one, the run would fail loudly (``StandInCalled``).

The installed package is never edited. ``load()`` is idempotent and cheap after the first
call.
"""
from __future__ import annotations

import enum
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any, Dict, Iterable, Optional

from seams import process

# Packages that may be stood in for, and attributes that must be real values because
# someone inspects them at import time (transformers reads torchvision's version and maps
# PIL modes through InterpolationMode; torch._inductor reads triton's version).
STAND_IN_PACKAGES = ("triton", "torchvision", "sgl_kernel", "flashinfer", "deep_gemm")


class StandInCalled(RuntimeError):
    """Code under test called into a stood-in GPU package."""


class _InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class _Constexpr:
    """``triton.language.constexpr``: a compile-time constant's wrapper, which modules
    also build at import time and read back (``tl.constexpr(64).value``)."""

    def __init__(self, value: Any = None) -> None:
        self.value = value


_FIXED: Dict[str, Any] = {
    "triton.language.constexpr": _Constexpr,
    "triton.__version__": "3.6.0",
    "triton.cdiv": lambda a, b: -(a // -b),
    "triton.next_power_of_2": lambda n: 1 << (n - 1).bit_length() if n > 0 else 1,
    "torchvision.__version__": "0.0.0+specrace.standin",
    "torchvision.transforms.InterpolationMode": _InterpolationMode,
    "sgl_kernel.__version__": "0.0.0+specrace.standin",
}


class _StandInClass:
    """What a CamelCase attribute of a stand-in is: subclassable, constructible, inert."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__()


class StandIn(types.ModuleType):
    """A module whose attributes are stand-ins too."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__ = []  # a package: submodules import through the finder
        self.__file__ = f"<specrace stand-in for {name}>"
        self.__specrace_stand_in__ = True

    def __getattr__(self, attr: str) -> Any:
        full = f"{self.__name__}.{attr}"
        if full in _FIXED:
            value = _FIXED[full]
        elif attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        elif full in sys.modules:
            value = sys.modules[full]
        elif attr[:1].isupper():
            value = type(attr, (_StandInClass,), {"__module__": self.__name__})
        else:
            value = importlib.import_module(full)
        setattr(self, attr, value)
        return value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # @triton.jit / @triton.autotune(...)(fn): definitions stay importable
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        if not args and kwargs or args and not callable(args[0]):
            return lambda fn: fn
        raise StandInCalled(f"{self.__name__} was called: a GPU kernel package is "
                            f"stood in for on this machine")

    def __bool__(self) -> bool:
        return False

    def __iter__(self):
        return iter(())

    def __repr__(self) -> str:
        return f"<specrace stand-in {self.__name__}>"


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``import triton.language`` & co. from stand-ins (loader protocol included,
    so the import system builds real stand-in modules, not namespace packages)."""

    def __init__(self, roots: Iterable[str]) -> None:
        self.roots = tuple(roots)

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname.split(".")[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec) -> StandIn:
        return StandIn(spec.name)

    def exec_module(self, module) -> None:
        pass


_FINDER: Optional[_StandInFinder] = None


def _missing(packages: Iterable[str]) -> list:
    return [p for p in packages if p not in sys.modules and importlib.util.find_spec(p) is None]


def install_stand_ins() -> list:
    """Stand in for the GPU packages that are not installed; returns their names."""
    global _FINDER
    missing = _missing(STAND_IN_PACKAGES)
    if missing and _FINDER is None:
        _FINDER = _StandInFinder(missing)
        sys.meta_path.insert(0, _FINDER)
        process.note("sglang-stand-ins")
    return list(_FINDER.roots) if _FINDER else []


def stood_in() -> list:
    """The packages stood in for in this process."""
    return list(_FINDER.roots) if _FINDER else []


# The modules the upstream target drives. Importing them pulls about 5,000 modules
# (transformers, openai, xgrammar, dynamo): 5-15 s the first time in a process.
MODULES = (
    "sglang.srt.managers.overlap_utils",
    "sglang.srt.speculative.ngram_info",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.managers.utils",
    "sglang.srt.managers.scheduler",
    "sglang.srt.speculative.spec_utils",
    "sglang.srt.constrained.xgrammar_backend",
)


def load() -> Dict[str, types.ModuleType]:
    """Import the driven sglang modules (stand-ins first where needed)."""
    install_stand_ins()
    # Quiet, CPU-friendly defaults that change nothing in the code under test.
    os.environ.setdefault("SGLANG_IS_IN_CI", "0")
    process.note("sglang-env-defaults")
    return {name: importlib.import_module(name) for name in MODULES}
