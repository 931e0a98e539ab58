"""Ours, named as such: structured outputs for the toy model, under vLLM's own machinery.

Model Runner V2 copies each step's drafts to the host only for a batch with structured-
output requests (``DraftTokensHandler.set_draft_tokens``: the scheduler validates them
against the grammar), so the draft-token copy runs only when requests carry a grammar.
vLLM's grammar backends (xgrammar, guidance, outlines, lm-format-enforcer) compile
against a tokenizer; the toy model has none (``skip_tokenizer_init``). So the grammar is
ours, behind vLLM's own ``StructuredOutputBackend`` / ``StructuredOutputGrammar``
interfaces, and everything around it is upstream's: the ``StructuredOutputManager``
(grammar init, bitmask filling with the drafts advanced and rolled back), the
scheduler's deferred sampling (``pending_structured_output_tokens``), draft validation
(``update_draft_token_ids_in_output``), and MRv2's bitmask upload and application.

The grammar is the language of the toy model's greedy continuations: each token the
successor (``toys.model.successor``) of the one before, from the prompt's last token,
to EOS. A correct run's grammar therefore never changes a token (the oracles judge the
outputs as unconstrained ones). Nor does a corrupted draft copy: the grammar admits one
token a step, so a wrong host-side draft fails validation and is padded to -1, which
leaves the later bitmask rows unconstrained -- that race shows in the happens-before
detector, not in the tokens (a grammar admitting several tokens a step could let a
wrong draft through to mask the target's token out, as a real grammar can).

Only the manager's compile executor is replaced as well: it exists only where a
tokenizer was loaded, and a thread would make the schedule nondeterministic; ours
compiles at submission (the grammar is ready when the scheduler first asks).
"""
from __future__ import annotations

from concurrent.futures import Future
from typing import List

import torch

from toys.model import successor
from toys.vocab import EOS_ID

SPEC_PREFIX = "specrace-successor-of "
BACKEND_NAME = "specrace-successor"


def params_for(prompt: List[int]):
    """A request's structured-output parameters: the toy grammar from its last prompt
    token (carried in the grammar spec the manager hands the backend)."""
    from vllm.sampling_params import StructuredOutputsParams
    params = StructuredOutputsParams(grammar=f"{SPEC_PREFIX}{prompt[-1]}")
    # the backend the request resolves to, as vLLM's input processor records it (the
    # engine is driven below that processor); 0.34.0's manager asserts one is named
    params._backend = BACKEND_NAME
    return params


def _classes():
    from vllm.v1.structured_output.backend_types import (StructuredOutputBackend,
                                                         StructuredOutputGrammar)

    class SuccessorGrammar(StructuredOutputGrammar):
        def __init__(self, start: int) -> None:
            self.tokens = [start]  # the prompt's last token, then every accepted one

        def _next(self) -> int:
            return successor(self.tokens[-1])

        def accept_tokens(self, request_id: str, tokens: List[int]) -> bool:
            for tok in tokens:
                if self.is_terminated() or tok != self._next():
                    return False
                self.tokens.append(tok)
            return True

        def validate_tokens(self, tokens: List[int]) -> List[int]:
            ok, last, done = [], self.tokens[-1], self.is_terminated()
            for tok in tokens:  # the longest valid prefix, the state left as it is
                if done or tok != successor(last):
                    break
                ok.append(tok)
                last, done = tok, tok == EOS_ID
            return ok

        def rollback(self, num_tokens: int) -> None:
            del self.tokens[max(1, len(self.tokens) - num_tokens):]

        def fill_bitmask(self, bitmask: torch.Tensor, batch_index: int) -> None:
            row = bitmask[batch_index]
            row.zero_()
            tok = self._next()
            word, bit = divmod(tok, 32)
            # int32 words: bit 31 is the sign bit
            row[word] = (1 << bit) if bit < 31 else -(1 << 31)

        def is_terminated(self) -> bool:
            return len(self.tokens) > 1 and self.tokens[-1] == EOS_ID

        def reset(self) -> None:
            del self.tokens[1:]

    class SuccessorBackend(StructuredOutputBackend):
        def compile_grammar(self, request_type, grammar_spec: str, stop_token_ids=None):
            # (0.34.0 passes the request's stop tokens too: the toy grammar ends at
            # EOS, the one stop token the target's requests have)
            if not grammar_spec.startswith(SPEC_PREFIX):
                raise ValueError(f"the toy grammar backend compiles its own specs only, "
                                 f"not {grammar_spec[:60]!r}")
            return SuccessorGrammar(int(grammar_spec[len(SPEC_PREFIX):]))

        def allocate_token_bitmask(self, max_num_seqs: int) -> torch.Tensor:
            words = -(-self.vocab_size // 32)
            return torch.full((max_num_seqs, words), -1, dtype=torch.int32)

        def destroy(self) -> None:
            pass

    return SuccessorBackend


class _AtSubmission:
    """An executor that runs the work when it is submitted (a done future)."""

    def submit(self, fn, *args, **kwargs) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # delivered to whoever asks, as a pool thread does
            fut.set_exception(exc)
        return fut

    def shutdown(self, *args, **kwargs) -> None:
        pass


def install(manager, vllm_config) -> None:
    """The toy backend and the at-submission executor into upstream's
    ``StructuredOutputManager`` (its first grammar init then finds a backend set)."""
    backend = _classes()
    manager.backend = backend(vllm_config, tokenizer=None,
                              vocab_size=vllm_config.model_config.get_vocab_size())
    if hasattr(manager, "backend_name"):  # 0.34.0: one backend per engine, by name
        manager.backend_name = BACKEND_NAME
    manager.executor = _AtSubmission()
