"""The stale-value oracle: every accept value that reaches the host, and every output
token, must equal the synchronous reference's for the same request and step.

The engine reports host-visible values through ``seams.faults.observe``:

* ``draft_prep`` -- the relayed accept state read on the host (blocking copy on
  the forward stream) at the start of a verify step: the seed race's victim;
* ``result``     -- a result committed by the host after ``copy_done``;
* ``confidence_published`` / ``confidence_resolved`` -- DSpark's draft confidence: what a
  forward published for each (request, step) (the reference reads it; a trial never
  does), and what the host later got from the relay's pinned ring for the budget
  planner, each row labelled with the (request, step) its ring slot stands for;
* ``confidence_used`` -- which of those rows the budget planner used (not the all-ones of
  a row its generation check found stale): a request's budget from another request's
  confidence (a pool slot reused within the ring's lag) is a divergence;
* ``draft_rows_zeroed`` -- vLLM's pinned draft-id rows as the host reads them back for a
  step whose drafts it zeroed on the host (V1's near-max-length path): judged on their own
  terms -- each must read zeros -- since a trial reads them at other steps than the
  reference does;
* ``hidden_states`` -- the hidden-state rows a request with ``return_hidden_states`` got
  back with a committed result (row sums);
* ``kv_context`` -- what a forward's attention read of its request's KV (``toys.attention``):
  how many positions and their checksum, for every launch -- the step a request ran past
  its finish included. Judged against the request's own history, not the reference: the
  prompt and every accepted token the host has seen for it (``result`` values, in step
  order), all but the last of which have KV by then. A forward that read a row the
  scheduler rewrote under it, or slots another request's KV went into, fails here.
"""
from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from toys.attention import checksum

from harness.oracle.divergence import Divergence

Key = Tuple[int, int]  # (rid, step)


class StaleValue(Exception):
    """Raised at the first divergence when a run stops early (keeps garbage ids away
    from the device, where a real GPU would take a sticky device-side assert)."""

    def __init__(self, divergence: Divergence) -> None:
        super().__init__(divergence.message)
        self.divergence = divergence


@dataclass
class Reference:
    results: Dict[Key, Tuple[int, List[int]]]
    outputs: Dict[int, List[int]]
    confidence: Dict[Key, List[float]] = field(default_factory=dict)
    hidden: Dict[Key, List[float]] = field(default_factory=dict)
    seq_lens: Dict[Key, List[float]] = field(default_factory=dict)
    # rid -> the steps from which its retractions numbered its steps anew
    retractions: Dict[int, List[int]] = field(default_factory=dict)


def note_retraction(retractions: Dict[int, List[int]], ctx: dict) -> None:
    retractions.setdefault(ctx["req"].rid, []).append(ctx["from_step"])


class Recorder:
    """Collects the reference run's per-step results, published confidence and returned
    hidden states."""

    def __init__(self) -> None:
        self.results: Dict[Key, Tuple[int, List[int]]] = {}
        self.confidence: Dict[Key, List[float]] = {}
        self.hidden: Dict[Key, List[float]] = {}
        self.seq_lens: Dict[Key, List[float]] = {}
        self.retractions: Dict[int, List[int]] = {}

    def __call__(self, name: str, ctx: dict) -> None:
        if name == "retracted":
            note_retraction(self.retractions, ctx)
        elif name == "result":
            self.results[(ctx["req"].rid, ctx["step"])] = (ctx["accept_len"], list(ctx["tokens"]))
        elif name == "seq_lens":
            for req, step, n in zip(ctx["reqs"], ctx["steps"], ctx["lens"]):
                self.seq_lens[(req.rid, step)] = [n]
        elif name == "hidden_states":
            self.hidden[(ctx["req"].rid, ctx["step"])] = list(ctx["rows"])
        elif name == "confidence_published":  # a host read: the reference run only
            rows = ctx["confidence"].tolist()
            for req, step, row in zip(ctx["reqs"], ctx["steps"], rows):
                self.confidence[(req.rid, step)] = row


def first_difference(expected: List[int], observed: List[int]) -> int:
    """The index of the first token where two outputs differ (or where the shorter ends)."""
    return next((i for i, (a, b) in enumerate(zip(expected, observed)) if a != b),
                min(len(expected), len(observed)))


class StaleValueOracle:
    def __init__(self, reference: Reference, stop_early: bool = True) -> None:
        self.ref = reference
        self.stop_early = stop_early
        self.divergences: List[Divergence] = []
        self.checked = 0
        self.history: Dict[int, List[int]] = {}  # rid -> prompt + accepted tokens
        self.retractions: Dict[int, List[int]] = {}  # as Reference.retractions, this run's

    @property
    def first(self) -> Optional[Divergence]:
        return self.divergences[0] if self.divergences else None

    def lined_up(self, rid: int, step: int) -> bool:
        """Is ``step`` of ``rid`` the same step in this run and in the reference? Yes
        while both retracted it at the same points: a retraction numbers its steps anew
        (the re-prefill takes the dropped step's number), so from the first point where
        one run retracted and the other did not (memory pressure differs between an
        overlapped trial and its synchronous reference), its per-step values are not
        comparable; its outputs and the KV it read still are. Lazily sound: a trial that
        will retract at a step observes nothing of that step or later before it does."""
        ref, mine = self.ref.retractions.get(rid, ()), self.retractions.get(rid, ())
        if not ref and not mine:
            return True
        apart = set(ref) ^ set(mine)
        return not apart or step < min(apart)

    def __call__(self, name: str, ctx: dict) -> None:
        if name == "retracted":
            note_retraction(self.retractions, ctx)
        elif name == "result":
            self._check(ctx["req"].rid, ctx["step"], ctx["accept_len"], ctx["tokens"],
                        "result processing (host, after copy_done)", "copy")
            self._history(ctx["req"]).extend(ctx["tokens"])
        elif name == "kv_context":
            self._check_kv(ctx["req"], ctx["step"], ctx["n"], ctx["checksum"],
                           ctx.get("past_finish", False), ctx.get("prefill", ctx["step"] == 0),
                           ctx.get("extend_end"))
        elif name == "draft_prep":
            D = ctx["stride"]
            lens, toks = ctx["accept_lens"], ctx["accept_tokens"]
            for i, (req, step) in enumerate(zip(ctx["reqs"], ctx["steps"])):
                n = lens[i] if i < len(lens) else None
                row = toks[i * D:(i + 1) * D]
                got = row[:n] if isinstance(n, int) and 0 <= n <= D else row
                self._check(req.rid, step, n, got,
                            "draft prep (host, blocking .cpu on the forward stream)", "forward")
        elif name == "hidden_states":
            self._check_rows("hidden_states", self.ref.hidden, ctx["req"].rid, ctx["step"],
                             ctx["rows"], "result processing (host, after copy_done)", "copy")
        elif name == "seq_lens":
            where = "the launch (host mirror of the published seq lens)"
            for req, step, n in zip(ctx["reqs"], ctx["steps"], ctx["lens"]):
                self._check_rows("seq_lens", self.ref.seq_lens, req.rid, step, [n],
                                 where, "d2h")
            if ctx.get("total") is not None:
                self._check_total(ctx, where)
        elif name == "confidence_resolved":
            for label, row in zip(ctx["labels"], ctx["confidence"]):
                if label is not None:
                    self._check_rows("confidence", self.ref.confidence, label[0].rid,
                                     label[1], row, "the budget planner (host, pinned ring "
                                     "after copy_done.query())", "d2h")
        elif name == "confidence_used":
            for req, label, used in ctx["rows"]:
                self._check_used(req, label, used)
        elif name == "draft_rows_zeroed":
            for req_id, row in ctx["rows"]:
                self._check_zeroed(req_id, row)

    def _check_zeroed(self, req_id, row) -> None:
        """A draft row the host zeroed must read back as zeros: anything else is an
        earlier device-to-host copy that landed after the host's write."""
        self.checked += 1
        if not any(row):
            return
        where = "the host's read of the pinned draft ids (after the copy event)"
        self._diverge(Divergence(
            "draft_rows", f"stale draft ids for request {req_id} at {where}: the host "
                          f"zeroed the row, observed {list(row)}",
            int(req_id) if str(req_id).isdigit() else None, None, where, "d2h",
            [0] * len(row), list(row)))

    def _check_used(self, req, label, used: bool) -> None:
        """The budget planner may use only the request's own lagged confidence: a row
        another request published (its pool slot since reused) must read as stale --
        the generation check's job. Judged on its own terms, not against the reference:
        the ring is lagged and polled, so the budget is not the reference's."""
        if label is None:
            return
        self.checked += 1
        owner, step = label[0].rid, label[1]
        if owner == req.rid or not used:
            return
        where = "the budget planner (survival, after the generation check)"
        self._diverge(Divergence(
            "confidence", f"request {req.rid}'s verify budget used request {owner}'s "
                          f"confidence (its step {step}) at {where}: the pool slot was "
                          f"reused within the ring's lag and the row was not found stale",
            req.rid, None, where, "host", f"request {req.rid}'s own or none",
            f"request {owner}'s"))

    def _history(self, req) -> List[int]:
        h = self.history.get(req.rid)
        if h is None:
            h = self.history[req.rid] = list(req.prompt)
        return h

    def _check_kv(self, req, step: int, n: int, got: int, past_finish: bool,
                  prefill: bool, extend_end=None) -> None:
        """A prefill attends to its prompt (a retracted request's: the whole history; a
        chunk of it: up to the chunk's end, ``extend_end``, as the host formed it); a
        verify to every position before its draft window: the history but its last token
        (whose KV this step writes)."""
        history = self._history(req)
        context = (history[:extend_end] if extend_end is not None else history) if prefill \
            else history[:-1]
        self.checked += 1
        if n == len(context) and got == checksum(context):
            return
        where = "the forward's attention (read back after copy_done)"
        if past_finish:
            where += ", in the step it ran past its finish"
        if n != len(context):
            what = f"{n} positions, expected {len(context)}"
        else:
            what = f"checksum {got} over {n} positions, expected {checksum(context)}"
        self._diverge(Divergence(
            "kv_context", f"stale KV context for request {req.rid} step {step} at {where}: "
                          f"{what} (another request's slots, or a row rewritten under it)",
            req.rid, step, where, "forward", [len(context), checksum(context)], [n, got]))

    def _check_total(self, ctx: dict, where: str) -> None:
        """The host's ``seq_lens_sum`` against the sum of the reference's lengths for the
        batch's (request, step) rows (when the reference has them all)."""
        keys = [(req.rid, step) for req, step in zip(ctx["reqs"], ctx["steps"])]
        if not keys or any(k not in self.ref.seq_lens or not self.lined_up(*k) for k in keys):
            return
        self.checked += 1
        expected = sum(self.ref.seq_lens[k][0] for k in keys)
        if ctx["total"] != expected:
            rid, step = keys[0]
            self._diverge(Divergence(
                "seq_lens", f"stale seq_lens_sum for the batch of request {rid} step {step} "
                            f"at {where}: expected {expected}, observed {ctx['total']}",
                rid, step, where, "d2h", expected, ctx["total"]))

    def _check_rows(self, kind: str, ref: Dict[Key, List[float]], rid: int, step: int,
                    row: List[float], where: str, stream: str) -> None:
        expected = ref.get((rid, step))
        if expected is None or not self.lined_up(rid, step):
            return
        self.checked += 1
        if list(row) == expected:
            return
        self._diverge(Divergence(
            kind, f"stale {kind.replace('_', ' ')} for request {rid} step {step} at "
                  f"{where}: expected {expected}, observed {list(row)}",
            rid, step, where, stream, expected, list(row)))

    def _check(self, rid: int, step: int, n, tokens, where: str, stream: str) -> None:
        expected = self.ref.results.get((rid, step))
        if expected is None or not self.lined_up(rid, step):
            return  # a step the reference never ran (past the request's finish), or
            # numbered differently there (lined_up)
        self.checked += 1
        exp_len, exp_tokens = expected
        what = None
        if n != exp_len:
            what, exp, got = "accept_lens", exp_len, n
        elif list(tokens) != exp_tokens:
            what, exp, got = "accept_tokens", exp_tokens, list(tokens)
        if what is None:
            return
        self._diverge(Divergence(what, f"stale {what} for request {rid} step {step} at "
                                       f"{where}: expected {exp}, observed {got}",
                                 rid, step, where, stream, exp, got))

    def check_outputs(self, outputs: Dict[int, List[int]]) -> None:
        for rid, exp in sorted(self.ref.outputs.items()):
            got = outputs.get(rid)
            if got != exp:
                k = first_difference(exp, got or [])
                self._diverge(Divergence("output", f"output of request {rid} diverges at "
                                                   f"token {k}: expected {exp}, observed {got}",
                                         rid, None, "final output", "host", exp, got, k),
                              stop=False)
                return

    def diverge_model(self, rid: int, expected: List[int], observed: List[int]) -> None:
        k = first_difference(expected, observed)
        self._diverge(Divergence("model", f"output of request {rid} is not the target "
                                          f"model's greedy continuation from token {k}: "
                                          f"expected {expected}, observed {observed}",
                                 rid, None, "final output", "host", expected, observed, k),
                      stop=False)

    def diverge_grammar(self, rid: int, position, message: str) -> None:
        self._diverge(Divergence("grammar", f"request {rid}: {message}", rid, None,
                                 "final output", "host", "schema-valid", message, position),
                      stop=False)

    def note_crash(self, exc: BaseException, where: str = "trial") -> None:
        """The engine raised ``exc`` in the ``trial`` run or in the synchronous
        ``reference`` run (then the bug is in both). A host sync that can never return is
        kind ``deadlock``, any other exception kind ``crash``."""
        from harness.runtime import DeadlockError
        if os.environ.get("SPECRACE_TRACEBACK"):  # docs/cli.md: where did the engine raise?
            traceback.print_exception(exc, file=sys.stderr)
        kind = "deadlock" if isinstance(exc, DeadlockError) else "crash"
        run = "the synchronous reference run" if where == "reference" else "the trial run"
        what = "deadlocked" if kind == "deadlock" else "crashed"
        observed = f"{type(exc).__name__}: {exc}"
        self._diverge(Divergence(kind, f"engine {what} in {run}: {observed}", where=where,
                                 observed=observed), stop=False)

    def _diverge(self, d: Divergence, stop: bool = True) -> None:
        self.divergences.append(d)
        if stop and self.stop_early:
            raise StaleValue(d)
