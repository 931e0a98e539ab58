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



def test_a_mutation_none_of_whose_probes_runs_here_is_disabled_and_named():
    """A catalogue entry whose probes are all of scenarios the target cannot run here (a
    vLLM release whose V1 engine is not driven: only its slices' probes run) is a
    ``disabled`` row that says so -- never a run of an unsupported scenario."""
    from matrix.run import mutation_row
    from mutations.base import M
    real = MUTATIONS[0]
    m = M("only-elsewhere", "x", "test", real.target, real.edits, ("vllm-draft",))
    row = mutation_row(m, "sim", target="impl")
    assert row["status"] == "disabled" and "none of its probes (vllm-draft)" in row["detail"]
