"""The fault-point hook: the only piece of the harness that ``impl/`` imports.

``impl/`` calls ``fault_point("name", **context)`` at named places in the engine loop, and
``observe("name", **values)`` where the host sees a value the oracles judge.
With no plan installed this is a dictionary-free no-op, so the server code pays nothing
for being testable. A scenario installs a *plan* (any object with ``hit(name, ctx)``) that
may stall the current stream there or answer a question the engine asks (``ask``).
The plan is part of the current run (``seams.context``, which like this module sits
below every other harness layer and imports nothing from them).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

from seams.context import current, field_set

# Every named place where a plan may stall the current stream, the one list of them: a
# stall asked for elsewhere is an error when the plan is made (``StallAt``), and a point
# the code marks that is not listed is an error when it is hit under a plan -- a
# misspelling never makes a stall silently not fire.
FAULT_POINTS = {
    "forward.before_attn_metadata": "the forward, before its attention gathers req_to_token",
    "forward.after_read_done": "the forward, right after it records shared-read-done",
    "forward.after_draft": "the forward, after the device drafter built the tree",
    "forward.before_verify": "the forward, before the verify's accept",
    "future_map.before_stash": "the forward, before the relay payload is stashed",
    "schedule.before_filter": "the schedule stream, before a batch drops finished requests",
    "schedule.before_merge": "the schedule stream, before a prefill joins the running batch",
    "grammar.after_tree_copy": "after the verify tree's host copy is started",
    "grammar.before_mask_upload": "before the grammar mask is uploaded",
    "d2h.before_ring_copy": "the private D2H stream, before the confidence ring copy",
    "copy.before_result_d2h": "the copy stream, before the result readback",
    "vllm.before_draft_copy": "vLLM's draft-token copy stream (V1's draft-ids copy, Model "
                              "Runner V2's DraftTokensHandler), before each step's "
                              "device-to-host copy of the drafts is queued",
    "vllm.before_valid_count_copy": "vLLM V1's valid-count copy stream, before each "
                                    "step's device-to-host copy of the drafter's valid "
                                    "sampled-token counts is queued",
    "vllm.before_execute": "vLLM's main stream, as a step's execute_model starts (its "
                           "input uploads and forward queue behind it) -- an amplifier, "
                           "not a window upstream has: up to 0.18.x the step's host has "
                           "already synchronised the previous step's work up to its "
                           "drafter (vllm.previous_drafter_running models what is left)",
    "vllm.previous_drafter_running": "vLLM V1's main stream, as a step's drafter (EAGLE / "
                                     "draft-model propose) starts, after the step's "
                                     "valid-count copy event is recorded: the drafter's "
                                     "kernels and the next step's uploads and forward "
                                     "queue behind it -- the next step's real window, "
                                     "the previous step's drafter still running (0.13.0 - "
                                     "0.18.x sync only that event first)",
    "vllm.before_propose": "vLLM Model Runner V2's main stream, after the step's output "
                           "copy event, as the speculator's propose starts (the drafter "
                           "queues behind it)",
}


# The engine's host-order questions a plan may answer (``ask``), likewise one list.
ASK_POINTS = {
    "schedule.disable_overlap": "process the previous result before this launch (a "
                                "synchronous step), as is_disable_overlap_for_batch does",
}


def check_point(name: str, known=FAULT_POINTS, what: str = "fault point") -> str:
    if name not in known:
        raise ValueError(f"unknown {what} {str(name)[:80]!r}; known: "
                         f"{', '.join(sorted(known))}")
    return name


def check_question(name: str) -> str:
    return check_point(name, ASK_POINTS, "host-order question")


def fault_point(name: str, **ctx: Any) -> None:
    """Mark a named place in the engine; a plan may stall the current stream here."""
    plan = current().plan
    if plan is not None:
        check_point(name)
        plan.hit(name, ctx)


def observe(name: str, **values: Any) -> None:
    """Report a value the host has just seen (e.g. the relayed accept state at draft prep)
    to the plan's observer -- the oracles' window into the engine. Never changes what the
    engine does: a plan may stall at a ``fault_point``, never at an ``observe``."""
    plan = current().plan
    if plan is not None:
        plan.observe(name, values)


def ask(name: str, default: Any, **ctx: Any) -> Any:
    """A decision point the plan may answer (e.g. host-step order); ``default`` otherwise.

    The engine's behaviour with no plan is always ``default`` -- the production order.
    """
    plan = current().plan
    if plan is None:
        return default
    check_question(name)
    return plan.ask(name, default, ctx)


@contextlib.contextmanager
def installed(plan: Any) -> Iterator[Any]:
    """Install ``plan`` for the duration of the block; an outer plan (a trial around a
    nested reference run) is restored afterwards."""
    with field_set("plan", plan):
        yield plan
