"""The renderers' sanitiser: ``harness.text`` (a module of its own, outside this package,
so that the CLI can print an error line without importing the report machinery)."""
from harness.text import (ECHO_CHARS, LINE_CHARS, bounded, echo, printable,  # noqa: F401
                          printable_tree)
