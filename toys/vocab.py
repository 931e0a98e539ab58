"""The toy model's vocabulary: small, but able to spell JSON (for the grammar path).

Token 0 is EOS. Padding nodes of a draft tree carry token 0 too (as in the server,
where a padding node is token 0 hanging off the root).
"""
from __future__ import annotations

from typing import Dict, List

EOS_ID = 0

_SINGLE = list('{}[]:,"') + [" ", "-", ".", "_"] + list("0123456789") + \
    list("abcdefghijklmnopqrstuvwxyz") + list("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_MULTI = ['"name"', '"age"', '"id"', '"tags"', '"ok"', "true", "false", "null",
          '":', '",', '":"', "the", "and", "ing", " the", "42", "10", "ab", "er", "on"]

VOCAB: List[str] = ["<eos>"] + _SINGLE + _MULTI
VOCAB_SIZE = len(VOCAB)
TOKEN_ID: Dict[str, int] = {t: i for i, t in enumerate(VOCAB)}


def decode(ids: List[int]) -> str:
    """Text of a token sequence (EOS and out-of-range ids are dropped)."""
    return "".join(VOCAB[i] for i in ids if 0 < i < VOCAB_SIZE)
