"""Every seeded bug still applies to today's impl/ (a mutation whose snippet moved would
test nothing -- or, on CUDA, die and be miscounted as a kill), changes the code it names,
and is undone afterwards."""
import inspect

import pytest

from matrix.run import PROBES
from mutations import MUTATIONS, resolve


def test_at_least_twenty_mutations_each_with_known_probes():
    assert len(MUTATIONS) >= 20
    assert len({m.name for m in MUTATIONS}) == len(MUTATIONS)
    for m in MUTATIONS:
        assert m.probes and all(p in PROBES for p in m.probes), m.name


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.name)
def test_mutation_applies_and_reverts(mutation):
    owner, attr = resolve(mutation.target)
    raw = inspect.getattr_static(owner, attr)
    with mutation.applied():
        assert inspect.getattr_static(owner, attr) is not raw
    assert inspect.getattr_static(owner, attr) is raw

