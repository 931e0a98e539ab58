"""A source patch edits whole pieces of code: a snippet that is also a piece of a longer
line (``x = 1`` inside ``xx = 10``) is refused, so an edit cannot land in the wrong place
when upstream adds a line that contains the old one."""
import pytest

from seams.sourcepatch import FirstFitting, PatchError, SourcePatch, snippet_problem

SRC = "def f():\n    xx = 10\n    x = 1\n    return foo(a) + barfoo(a)\n"


@pytest.mark.parametrize("snippet, problem", [
    ("    x = 1\n", ""),                         # a whole line
    ("x = 1", "a piece of a longer line"),      # also inside "xx = 10"
    ("foo(a)", "a piece of a longer line"),     # also inside "barfoo(a)"
    (" + barfoo(a)", ""),                        # mid-line, but whole at both ends
    ("return", ""),
    ("    y = 2\n", "occurs 0 times"),
    ("(a)", "occurs 2 times"),
])
def test_a_snippet_must_be_whole_and_unique(snippet, problem):
    got = snippet_problem(SRC, snippet)
    assert (problem in got) if problem else got == "", got


def _victim():
    xx = 10
    x = 1
    return x + xx


def test_a_patch_with_a_piece_of_another_line_is_refused():
    target = f"{__name__}:_victim"
    SourcePatch(target, (("    x = 1\n", "    x = 2\n"),), "whole").check()
    with pytest.raises(PatchError, match="piece of a longer line"):
        SourcePatch(target, (("x = 1", "x = 2"),), "piece").check()


def test_a_change_for_several_releases_applies_the_first_alternative_that_fits():
    """``FirstFitting``: one release's code has one snippet, another's the other; the
    alternative that fits the installed function is applied (the first, where both do),
    and none fitting is a ``PatchError`` naming each alternative's problem."""
    target = f"{__name__}:_victim"
    older = SourcePatch(target, (("    xx = 10\n", "    xx = 20\n"),), "older")
    newer = SourcePatch(target, (("    y = 5\n", "    y = 6\n"),), "newer")  # not here
    with FirstFitting((newer, older), "fix").applied():
        assert _victim() == 21  # the older code's alternative ran
    assert _victim() == 11  # put back
    with FirstFitting((older, older), "fix").applied():
        assert _victim() == 21
    with pytest.raises(PatchError, match="no alternative fits.*newer.*occurs 0 times"):
        FirstFitting((newer,), "fix").check()


def test_a_change_for_several_releases_reads_as_fitting_where_one_alternative_does():
    """The static check a target runs before a variant (``problem``): "" where one
    alternative fits the code, else every alternative's problem."""
    def problem_of(target, edits):
        return "" if edits[0][0] == "fits" else f"{edits[0][0]} is absent"
    fits, absent = (SourcePatch("m:f", ((old, "x"),)) for old in ("fits", "gone"))
    assert FirstFitting((absent, fits)).problem(problem_of) == ""
    assert FirstFitting((absent, absent)).problem(problem_of) == \
        "gone is absent; gone is absent"
    assert absent.problem(problem_of) == "gone is absent"
