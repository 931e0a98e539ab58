"""The words specrace's runs are made of, as enums: a misspelt word is an error where it
comes in, not a comparison that is silently false.

Each member *is* its string (a ``str`` subclass whose ``str()`` and format are the value),
so reports, JSON and server args carry the same words as before and compare equal to
them; code that means one of these words names the member.
"""
from __future__ import annotations

import enum


class Word(str, enum.Enum):
    """A ``str`` enum that prints as its value (``enum.StrEnum`` is Python 3.11+)."""

    def __str__(self) -> str:
        return str.__str__(self)

    __format__ = str.__format__

    @classmethod
    def parse(cls, text: str, what: str) -> "Word":
        """The member spelt ``text``; ``ValueError`` naming ``what`` and the choices."""
        try:
            return cls(text)
        except ValueError:
            raise ValueError(f"unknown {what} {text!r}; expected one of: "
                             f"{', '.join(m.value for m in cls)}") from None


class Backend(Word):
    AUTO = "auto"  # CUDA when a GPU is present, else the simulator
    SIM = "sim"    # the deterministic CPU stream simulator
    CUDA = "cuda"  # real CUDA streams


class TargetName(Word):
    """The code under test (``targets``: the registry that loads one by name)."""
    IMPL = "impl"      # specrace's own mirror of the server code
    SGLANG = "sglang"  # the installed sglang
    VLLM = "vllm"      # the installed vLLM


class Platform(Word):
    """The hardware the code under test reads itself as running on."""
    CUDA = "cuda"
    ROCM = "rocm"


class Fence(Word):
    """The scheduler's WAR barrier before a forward."""
    FINE = "fine"      # wait on the read-done event the forward published
    COARSE = "coarse"  # wait for the whole previous forward


# The targets whose scheduler has the WAR barrier a ``Fence`` names: specrace's mirror and
# sglang. vLLM's loop has none -- its runs carry the default word, which changes nothing
# there -- so no name, heading, command or row of a vLLM run shows a fence.
FENCED_TARGETS = (TargetName.IMPL.value, TargetName.SGLANG.value)


class Relay(Word):
    """How accept state travels from one step's verify to the next step's draft."""
    FUTURE_MAP = "future_map"  # stashed and resolved through the FutureMap (the fix)
    SPEC_INFO = "spec_info"    # carried on the batch's spec info (before the fix)


class Verdict(Word):
    RACE = "race"
    CLEAN = "clean"


def dtype_name(dtype) -> str:
    """``torch.int32`` -> ``int32``: how traces and reports name a tensor's dtype."""
    return str(dtype).removeprefix("torch.")


def shaped_name(dtype, shape) -> str:
    """``torch.int32``, ``(3, 4)`` -> ``int32[3, 4]``: how traces and reports name a tensor."""
    return f"{dtype_name(dtype)}{list(shape)}"
