"""sglang's own xgrammar backend on specrace's toy vocabulary.

``XGrammarGrammarBackend`` builds its ``TokenizerInfo`` through a tokenizer's
``init_xgrammar()`` hook when the tokenizer has one (sglang's path for tokenizers that are
not Hugging Face's): ``VocabTokenizer`` offers it for the toy vocabulary, so every grammar
object, matcher, bitmask allocation and fill below is upstream's.
"""
from __future__ import annotations

import warnings

import xgrammar

from toys.vocab import EOS_ID, VOCAB, VOCAB_SIZE

from targets.sglang.boundary import upstream


class VocabTokenizer:
    """The one method sglang's xgrammar backend asks of a custom tokenizer."""

    def init_xgrammar(self):
        info = xgrammar.TokenizerInfo(list(VOCAB), xgrammar.VocabType.RAW,
                                      stop_token_ids=[EOS_ID])
        return info, None  # no stop-token override


class UpstreamGrammarBackend:
    """``grammar_for_json_schema(schema)`` -> upstream's ``XGrammarGrammar``."""

    def __init__(self) -> None:
        self.vocab_size = VOCAB_SIZE
        self.backend = upstream.xgrammar_backend.XGrammarGrammarBackend(
            VocabTokenizer(), vocab_size=VOCAB_SIZE, model_eos_token_ids=[EOS_ID],
            any_whitespace=False)

    def grammar_for_json_schema(self, schema: str):
        with warnings.catch_warnings():
            # sglang passes xgrammar's deprecated max_rollback_tokens (rollback is unlimited)
            warnings.simplefilter("ignore", DeprecationWarning)
            grammar = self.backend.dispatch_json(schema)
        if type(grammar).__name__ == "InvalidGrammarObject":
            raise ValueError(f"sglang's xgrammar backend rejected the schema: "
                             f"{grammar.error_message}")
        return grammar
