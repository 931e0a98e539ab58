"""The scenario catalogue: ``specrace list`` shows it, ``specrace repro NAME`` runs one."""
from __future__ import annotations

from typing import Dict

from .base import Scenario
from .ngram_filter_race import SCENARIO as _NGRAM_FILTER_RACE

SCENARIOS: Dict[str, Scenario] = {s.name: s for s in (_NGRAM_FILTER_RACE,)}


def get(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(sorted(SCENARIOS))}") from None
