"""The stale-value oracle's ``draft_rows_zeroed`` judge (vLLM V1's near-max-length path:
rows the host zeroed must read back as zeros), and the patch set a two-function fix
is made of."""
import pytest

from harness.oracle.stale import Reference, StaleValue, StaleValueOracle
from seams.sourcepatch import PatchSet, SourcePatch


def _oracle(stop_early=True):
    return StaleValueOracle(Reference(results={}, outputs={}), stop_early=stop_early)


def test_zeroed_rows_that_read_zeros_pass_and_are_counted():
    oracle = _oracle()
    oracle("draft_rows_zeroed", {"rows": [("0", [0, 0]), ("3", [0, 0])]})
    assert oracle.first is None and oracle.checked == 2


def test_a_zeroed_row_that_reads_an_earlier_copy_is_a_stale_value():
    oracle = _oracle(stop_early=False)
    oracle("draft_rows_zeroed", {"rows": [("0", [0, 0]), ("2", [11, 12])]})
    d = oracle.first
    assert d is not None and d.kind == "draft_rows" and d.rid == 2
    assert d.expected == [0, 0] and d.observed == [11, 12]


def test_it_stops_the_run_at_the_first_stale_row():
    with pytest.raises(StaleValue):
        _oracle()("draft_rows_zeroed", {"rows": [("1", [4294967297, 39])]})


def _twice(x):
    return x * 2


def _plus_one(x):
    return x + 1


def test_a_patch_set_applies_every_part_and_puts_them_all_back():
    double = SourcePatch(f"{__name__}:_twice", (("    return x * 2\n", "    return x * 3\n"),))
    inc = SourcePatch(f"{__name__}:_plus_one", (("    return x + 1\n", "    return x + 5\n"),))
    both = PatchSet((double, inc), "both")
    assert both.parts() == (double, inc) and double.parts() == (double,)
    with both.applied():
        import sys
        mod = sys.modules[__name__]
        assert mod._twice(2) == 6 and mod._plus_one(2) == 7
    assert _twice(2) == 4 and _plus_one(2) == 3
