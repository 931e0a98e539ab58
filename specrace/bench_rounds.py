"""How ``bench`` turns repeated timings into figures: rounds that interleave every
measurement, a time as the best of its rounds, a ratio as the median of the rounds'
side-by-side ratios."""
from __future__ import annotations

import statistics
from typing import Callable, Dict, List


def interleaved(runs: Dict[str, Callable[[], float]], rounds: int = 5
                ) -> Dict[str, List[float]]:
    """Every measurement ``rounds`` times, the rounds interleaving all of them: on a
    shared machine load comes and goes, and two figures taken minutes apart would carry
    it into their ratio. Each one's samples, in round order."""
    samples: Dict[str, List[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            samples[name].append(fn())
    return samples


def best_of(samples: Dict[str, List[float]]) -> Dict[str, float]:
    """Each measurement's best (a figure: the least disturbed run of it)."""
    return {name: min(v) for name, v in samples.items()}


def paired_ratio(samples: Dict[str, List[float]], num: str, den: str) -> float:
    """``num`` over ``den`` as a ratio of one run: the median over the rounds of the two
    measured side by side in each. Load that comes and goes between rounds cancels in each
    pair, where the two bests may come from different moments -- a quiet one for one,
    a loaded one for the other -- and carry the difference into the ratio."""
    return statistics.median(a / b for a, b in zip(samples[num], samples[den]))
