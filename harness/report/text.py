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


def printable_tree(obj: Any) -> Any:
    """``obj`` (JSON-like: dicts, lists, strings, numbers) with every string sanitised."""
    if isinstance(obj, str):
        return printable(obj)
    if isinstance(obj, dict):
        return {printable_tree(k): printable_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [printable_tree(v) for v in obj]
    return obj
