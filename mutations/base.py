"""What a seeded bug is: a named source patch of one function, and the probes that should
kill it (``Mutation``, ``M``). The catalogues of both targets are made of these."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from seams.sourcepatch import PatchError, SourcePatch

# A mutation's patch that does not apply to this tree (its target or snippet moved or
# changed): a harness error, never a kill.
MutationError = PatchError


@dataclass(frozen=True)
class Mutation:
    name: str
    summary: str
    source: str  # where the bug class comes from (seed / digest M-number)
    target: str  # "module:qualname", e.g. "impl.spec_info:NgramVerifyInput.filter_batch"
    edits: Tuple[Tuple[str, str], ...]  # (snippet, replacement), each snippet unique
    probes: Tuple[str, ...]  # probe names (matrix.probes.PROBES), tried in order
    # Why this seeded bug cannot change what the code does (an equivalent mutant), where
    # that is so; "" for an ordinary one. Its probes still run: a kill means the reason is
    # wrong, and the matrix says so -- a declaration is shown, never taken on trust.
    equivalent: str = ""

    @property
    def patch(self) -> SourcePatch:
        return SourcePatch(self.target, self.edits, f"mutation {self.name}")

    def check(self) -> None:
        """``MutationError`` if the patch no longer applies (its target moved or changed)."""
        self.patch.check()

    def applied(self):
        return self.patch.applied()


def M(name, summary, source, target, edits, probes, equivalent: str = "") -> Mutation:
    return Mutation(name, summary, source, target, tuple(edits), tuple(probes), equivalent)
