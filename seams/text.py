"""The one sanitiser every renderer uses (Markdown, the console, the Chrome trace, the PNG).

Report fields carry text from outside the harness: exception messages, file paths (a path
that is not UTF-8 decodes to lone surrogates), stream names, a crafted report's values. A
lone surrogate cannot be encoded at all, and C0/C1 controls and bidi overrides can rewrite
what a terminal or a Markdown viewer shows. Everything that is not printable is therefore
shown as a visible escape (``\\x85``, ``\\u202e``, ``\\udc80``): nothing is lost, nothing
is hidden, and the result encodes in any UTF-8 stream.
"""
from __future__ import annotations

from typing import Any


def printable(text: Any, keep_newlines: bool = False) -> str:
    """``str(text)`` with every non-printable character escaped (newlines kept if asked)."""
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() or (keep_newlines and c == "\n") else _escape(c)
                   for c in s)


def _escape(c: str) -> str:
    o = ord(c)
    if o < 0x100:
        return f"\\x{o:02x}"
    if o < 0x10000:
        return f"\\u{o:04x}"
    return f"\\U{o:08x}"


MAX_TREE_DEPTH = 64  # deeper than any report or trace (~6): below it, a marker


def printable_tree(obj: Any, _depth: int = 0) -> Any:
    """``obj`` (JSON-like: dicts, lists, strings, numbers) with every string sanitised;
    depth-bounded (a value nested past ``MAX_TREE_DEPTH`` becomes a marker string), so no
    input drives the recursion."""
    if isinstance(obj, str):
        return printable(obj)
    if isinstance(obj, (dict, list, tuple)) and _depth >= MAX_TREE_DEPTH:
        return f"<nested deeper than {MAX_TREE_DEPTH}>"
    if isinstance(obj, dict):
        return {printable_tree(k, _depth + 1): printable_tree(v, _depth + 1)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [printable_tree(v, _depth + 1) for v in obj]
    return obj


ECHO_CHARS = 200  # the most of one piece of outside text an error line repeats
LINE_CHARS = 600  # the longest error line


def echo(text: Any, limit: int = ECHO_CHARS) -> str:
    """A value from outside, as an error line quotes it: ``repr``, printable, cut to
    ``limit`` characters with an ellipsis (a 100 kB argument is not a 100 kB line)."""
    s = text if isinstance(text, str) else str(text)
    cut = len(s) > limit
    shown = printable(repr(s[:limit]))
    return shown[:-1] + "...'" if cut and shown.endswith("'") else shown + ("..." if cut else "")


def bounded(line: str, limit: int = LINE_CHARS) -> str:
    """One line of at most ``limit`` characters: over it, every whitespace-free run longer
    than ``ECHO_CHARS`` is cut, then the middle (the head says what, the tail usually what
    was expected)."""
    if len(line) <= limit:
        return line
    import re
    line = re.sub(r"\S{%d,}" % (ECHO_CHARS + 1), lambda m: m.group(0)[:ECHO_CHARS] + "...", line)
    if len(line) <= limit:
        return line
    head = limit * 2 // 3
    return line[:head] + " ... " + line[-(limit - head - 5):]
