"""Grammar-constrained speculative verify: the xgrammar backend, the tree traversal that
builds one bitmask row per draft-tree node, and the staging of the tree (device -> host)
and of the mask (host -> device) around the target-verify forward.

Data flow of one verify step (EAGLE-style):

    drafter kernels (device) --> GrammarTree.from_device  [async D2H + event]
    target verify launch     --> build_grammar_vocab_mask [host: barrier, resolve,
                                                           traverse, async H2D]
    sampler                  --> GrammarMask.apply(logits)

The bitmask (xgrammar's format) and the kernel that applies it: ``toys.bitmask``.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
import xgrammar

from seams.faults import fault_point

from toys.bitmask import BITS, allocate_vocab_mask, apply_vocab_mask
from toys.memory import host_empty

logger = logging.getLogger(__name__)

# A traversal slower than this is worth a warning: it runs on the host while the target
# forward runs, and must finish before the sampler needs the mask.
TREE_TRAVERSE_TIME_THRESHOLD = 1.0  # seconds

# ---------------------------------------------------------------------------------------
# The xgrammar backend

class Grammar:
    """One request's grammar state: a wrapper around one ``xgrammar.GrammarMatcher``."""

    def __init__(self, compiled: "xgrammar.CompiledGrammar") -> None:
        # Rollback depth is unlimited in xgrammar 0.2.9 (max_rollback_tokens is deprecated).
        self._matcher = xgrammar.GrammarMatcher(compiled)

    def accept_token(self, token: int) -> None:
        # A terminated matcher (stop token accepted) ignores further tokens: the request
        # is finishing, and the scheduler may still hand it the tail of a verify step.
        if self._matcher.is_terminated():
            return
        if not self._matcher.accept_token(token):
            raise ValueError(f"grammar rejected token {token}")

    def rollback(self, k: int) -> None:
        self._matcher.rollback(k)

    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(vocab_mask, row)

    @staticmethod
    def allocate_vocab_mask(vocab_size: int, rows: int, device: Any) -> torch.Tensor:
        return allocate_vocab_mask(vocab_size, rows, device)

    @staticmethod
    def apply_vocab_mask(logits: torch.Tensor, vocab_mask: torch.Tensor) -> None:
        apply_vocab_mask(logits, vocab_mask)


class GrammarBackend:
    """Compiles grammars against one tokenizer and hands out per-request ``Grammar``s."""

    def __init__(self, vocab: List[str], eos_id: int, max_threads: int = 2) -> None:
        self.vocab_size = len(vocab)
        # RAW: the vocabulary strings are the token texts verbatim. Stop ids are explicit,
        # since there is no tokenizer config to infer them from.
        self._info = xgrammar.TokenizerInfo(list(vocab), xgrammar.VocabType.RAW,
                                            stop_token_ids=[eos_id])
        self._compiler = xgrammar.GrammarCompiler(self._info, max_threads=max_threads)
        self._cache: Dict[Tuple[str, str], "xgrammar.CompiledGrammar"] = {}

    def _compiled(self, kind: str, key: str,
                  compile_fn: Callable[[], "xgrammar.CompiledGrammar"]):
        # Compilation costs milliseconds; matchers are cheap. Compile once per spec.
        compiled = self._cache.get((kind, key))
        if compiled is None:
            compiled = self._cache[(kind, key)] = compile_fn()
        return compiled

    def grammar_for_json_schema(self, schema: str) -> Grammar:
        # Compact JSON: no optional whitespace and no spaces after ',' / ':' (without
        # ``separators`` xgrammar's compact mode still emits spaces).
        return Grammar(self._compiled("json", schema, lambda: self._compiler.compile_json_schema(
            schema, any_whitespace=False, separators=(",", ":"))))

    def grammar_for_ebnf(self, ebnf: str) -> Grammar:
        return Grammar(self._compiled("ebnf", ebnf,
                                      lambda: self._compiler.compile_grammar(ebnf)))


# ---------------------------------------------------------------------------------------
# Bitmask over the verify tree

def _as_list(x: Any) -> List[int]:
    return x.tolist() if isinstance(x, torch.Tensor) else list(x)


def traverse_tree(next_token: Sequence[int], next_sibling: Sequence[int],
                  draft_tokens: Sequence[int], grammar: Grammar,
                  bitmask: torch.Tensor, vocab_size: int) -> None:
    """Fill ``bitmask[i]`` (this request's ``D`` rows) for every node the grammar reaches.

    Node 0 is the root: the token committed last step, which the matcher already
    reflects. A child is reached iff its token is allowed by its *parent's* row; its row
    is then the set of tokens allowed after the path root -> child. Rejected nodes, their
    subtrees and nodes below a terminated grammar keep the all-ones row. Every accept is
    rolled back, so the matcher leaves in the state it came in.
    """
    next_token, next_sibling = _as_list(next_token), _as_list(next_sibling)
    draft_tokens = _as_list(draft_tokens)
    assert len(next_token) == len(next_sibling) == len(draft_tokens)

    def dfs(curr: int, parent: int) -> None:
        if curr == 0:
            accepted = True
        else:
            tok = draft_tokens[curr]
            # Read the parent's row: the tokens the grammar allows right after the parent.
            accepted = 0 <= tok < vocab_size and (
                (int(bitmask[parent, tok // BITS]) >> (tok % BITS)) & 1) == 1
        if accepted:
            if curr != 0:
                grammar.accept_token(tok)
            if not grammar.is_terminated():
                grammar.fill_vocab_mask(bitmask, curr)
                if next_token[curr] != -1:
                    dfs(next_token[curr], curr)
            if curr != 0:
                grammar.rollback(1)
        # Siblings share the parent, hence the parent's row, accepted or not.
        if next_sibling[curr] != -1:
            dfs(next_sibling[curr], parent)

    dfs(0, -1)


def generate_token_bitmask(reqs: Sequence[Any], next_token_cpu: torch.Tensor,
                           next_sibling_cpu: torch.Tensor, draft_tokens_cpu: torch.Tensor,
                           vocab_size: int, device: Any) -> Optional[torch.Tensor]:
    """One ``(bs*D, W)`` host bitmask over the batch's verify trees; None if no request
    has a grammar. Row ``b*D + i`` is node ``i`` of request ``b`` -- the same row as its
    logits. Requests without a grammar keep all-ones rows."""
    bs, num_draft = next_token_cpu.shape
    assert len(reqs) == bs, (len(reqs), bs)
    draft_tokens_cpu = draft_tokens_cpu.reshape(bs, num_draft)
    bitmask: Optional[torch.Tensor] = None
    for i, req in enumerate(reqs):
        grammar = getattr(req, "grammar", None)
        if grammar is None:
            continue
        if bitmask is None:  # lazily: a batch without grammars never allocates
            bitmask = grammar.allocate_vocab_mask(vocab_size, bs * num_draft, device)
        start = time.perf_counter()
        # One .tolist() per tensor per request: per-element indexing of a tensor costs
        # microseconds each, and the traversal touches every link.
        traverse_tree(next_token_cpu[i].tolist(), next_sibling_cpu[i].tolist(),
                      draft_tokens_cpu[i].tolist(), grammar,
                      bitmask[i * num_draft:(i + 1) * num_draft], vocab_size)
        elapsed = time.perf_counter() - start
        if elapsed > TREE_TRAVERSE_TIME_THRESHOLD:
            logger.warning("grammar tree traversal took %.2f s (request %d)", elapsed, i)
    return bitmask


# ---------------------------------------------------------------------------------------
# Staging: the verify tree to the host, the mask back to the device

def _async_d2h(t: torch.Tensor) -> torch.Tensor:
    """Start copying a device tensor into fresh pinned host memory on the current stream.

    Host tensors are taken as they are: an algorithm may synthesize part of the tree on
    the host. The result must not be read before the event recorded after it completes.
    """
    if t.device.type == "cpu":
        return t
    host = host_empty(t.shape, t.dtype, t.device)
    host.copy_(t, non_blocking=True)
    # The copy is queued, not done: keep the source's memory from being reused by the
    # caching allocator until the current stream has passed the copy.
    t.record_stream(torch.get_device_module(t.device).current_stream())
    return host


class GrammarTree:
    """The verify tree the grammar bitmask is built over, on the host.

    ``from_device`` starts an async copy, so build it before the target-verify launch
    (after the draft kernels that write the tree, on the same stream): the copies then
    run ahead of the forward and the host traversal overlaps it. ``from_host`` is for
    algorithms that build the tree on the host (NGRAM).
    """

    def __init__(self, host: Tuple[torch.Tensor, ...], done_event: Any) -> None:
        self._host = host
        self._done = done_event

    @classmethod
    def from_device(cls, retrieve_next_token: torch.Tensor,
                    retrieve_next_sibling: torch.Tensor,
                    draft_token: torch.Tensor) -> "GrammarTree":
        tensors = (retrieve_next_token, retrieve_next_sibling, draft_token)
        host = tuple(_async_d2h(t) for t in tensors)
        # Sources may be mixed, so the event keys off whichever tensor is on a device.
        device = next((t.device for t in tensors if t.device.type != "cpu"), None)
        if device is None:
            return cls(host, None)
        # One event on the current stream after all three copies: completing it means
        # every copy landed (a stream is a FIFO).
        done = torch.get_device_module(device).Event()
        done.record()
        fault_point("grammar.after_tree_copy")
        return cls(host, done)

    @classmethod
    def from_host(cls, retrieve_next_token: torch.Tensor,
                  retrieve_next_sibling: torch.Tensor,
                  draft_token: torch.Tensor) -> "GrammarTree":
        return cls((retrieve_next_token, retrieve_next_sibling, draft_token), None)

    def resolve(self) -> Tuple[torch.Tensor, ...]:
        """The host tensors, once readable: waits for the copies (only them), if any."""
        if self._done is not None:
            self._done.synchronize()
        return self._host


class GrammarMask(NamedTuple):
    """The verify-step bitmask, on the device; the sampler applies it to the logits."""

    vocab_mask: torch.Tensor

    def apply(self, logits: torch.Tensor) -> None:
        apply_vocab_mask(logits, self.vocab_mask)


def build_grammar_vocab_mask(*, reqs: Sequence[Any], tree: GrammarTree, sampling_info: Any,
                             device: Any,
                             barrier: Optional[Callable[[], None]] = None
                             ) -> Optional[GrammarMask]:
    """Build the constrained-decoding bitmask over the verify tree and stage it on device.

    Call it after the target-verify launch: everything here is host work (bar the final
    copy), so it overlaps that forward.
    """
    if barrier is not None:
        # The scheduler advances each matcher over the previous step's committed tokens;
        # the traversal starts from that state, so this must come first.
        barrier()
    vocab_mask = generate_token_bitmask(reqs, *tree.resolve(), sampling_info.vocab_size,
                                        device)
    if vocab_mask is None:
        return None
    fault_point("grammar.before_mask_upload")
    # non_blocking is safe: the source is pinned (allocate_vocab_mask) and freshly
    # allocated per step, and stream order keeps this copy ahead of the sampler's apply.
    vocab_mask = vocab_mask.to(device, non_blocking=True)
    # A batch fresh from extend still carries its (bs, W) extend-stage mask: drop it, or
    # the sampler would apply it instead of / on top of the verify mask.
    sampling_info.vocab_mask = None
    return GrammarMask(vocab_mask)
