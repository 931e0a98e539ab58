"""The seeded bugs per target: ``impl`` (``mutations``) and ``sglang``
(``mutations.sglang``, patches of the installed package). A scenario variant
names a seeded bug; the same name may exist for both targets (e.g. ``tree-copy-no-event``)
so one scenario serves both."""
from __future__ import annotations

from typing import Dict, List

from mutations import Mutation


def mutations_for(target: str) -> List[Mutation]:
    if target == "impl":
        from mutations import MUTATIONS
        return MUTATIONS
    if target == "sglang":
        from mutations.sglang import MUTATIONS
        from mutations.sglang_eagle import MUTATIONS as EAGLE
        return MUTATIONS + EAGLE
    raise KeyError(f"unknown target {target!r}")


def by_name(target: str) -> Dict[str, Mutation]:
    return {m.name: m for m in mutations_for(target)}


def get(target: str, name: str) -> Mutation:
    try:
        return by_name(target)[name]
    except KeyError:
        raise KeyError(f"no mutation {name!r} for the {target} target") from None
