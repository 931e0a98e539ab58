"""docs/architecture.md drawn from the structure test's own order: the rooms its tree shows
are ``ROOMS`` of tests/test_structure.py, in that order (then the folders that are not
rooms), its order line says the same, and every path the tree names exists.

The tree's lines: a room at the left margin (``seams/``), a path inside it indented two
spaces (``  faults/``), anything indented further continues a description."""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
NOT_ROOMS = ("tests", "reports", "tools", "docs")  # folders no room imports


def rooms_of_the_structure_test() -> Tuple[str, ...]:
    """``ROOMS`` as tests/test_structure.py assigns it (read, not imported)."""
    tree = ast.parse((ROOT / "tests" / "test_structure.py").read_text())
    for node in tree.body:
        if (isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "ROOMS" for t in node.targets)):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("tests/test_structure.py assigns no ROOMS")


def tree_entries(page: str) -> List[Tuple[str, str]]:
    """(room, path inside it or "") for each entry line of the page's tree block."""
    block = re.search(r"^```\n(.*?)^```", page, re.M | re.S)
    assert block, "the page has no tree block"
    entries, room = [], ""
    for line in block.group(1).splitlines():
        if re.match(r"\S", line):
            room = line.split()[0].rstrip("/")
            entries.append((room, ""))
        elif re.match(r"  \S", line):
            entries.append((room, line.split()[0]))
    return entries


def order_line(page: str) -> Tuple[str, ...]:
    line = re.search(r"^The order, as .*?:(.*?)\.$", page, re.M | re.S)
    assert line, "the page states no order"
    return tuple(re.findall(r"`(\w+)`", line.group(1)))


def test_the_tree_shows_the_rooms_in_the_structure_tests_order():
    shown = [room for room, inside in tree_entries(PAGE.read_text()) if not inside]
    assert shown == [*rooms_of_the_structure_test(), *NOT_ROOMS]


def test_the_order_line_is_the_structure_tests():
    assert order_line(PAGE.read_text()) == rooms_of_the_structure_test()


def test_every_path_the_tree_names_exists():
    missing = [f"{room}/{inside}" for room, inside in tree_entries(PAGE.read_text())
               if not (ROOT / room / inside).exists()]
    assert missing == []


def test_a_room_out_of_order_or_a_dead_path_is_caught():
    """The checks on a page that swaps two rooms and names a module that is not there."""
    rooms = rooms_of_the_structure_test()
    swapped = [rooms[1], rooms[0], *rooms[2:]]
    page = ("```\n" + "".join(f"{r}/   what it is\n" for r in swapped)
            + "  no_such_module.py   gone\n```\n\nThe order, as it lists it: "
            + " → ".join(f"`{r}`" for r in swapped) + ".\n")
    assert [r for r, inside in tree_entries(page) if not inside] != list(rooms)
    assert order_line(page) != rooms
    assert (swapped[-1], "no_such_module.py") in tree_entries(page)  # read as the last room's
    assert not (ROOT / swapped[-1] / "no_such_module.py").exists()
