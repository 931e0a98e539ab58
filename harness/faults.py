"""The fault-point hook: the only piece of the harness that ``impl/`` imports.

``impl/`` calls ``fault_point("name", **context)`` at named places in the engine loop, and
``observe("name", **values)`` where the host sees a value the oracles judge.
With no plan installed this is a dictionary-free no-op, so the server code pays nothing
for being testable. A scenario installs a *plan* (any object with ``hit(name, ctx)``) that
may stall the current stream there or answer a question the engine asks (``ask``).
The plan is part of the current run (``harness.context``, which like this module sits
below every other harness layer and imports nothing from them).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

from .context import current, field_set


def fault_point(name: str, **ctx: Any) -> None:
    """Mark a named place in the engine; a plan may stall the current stream here."""
    plan = current().plan
    if plan is not None:
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
    return plan.ask(name, default, ctx)


@contextlib.contextmanager
def installed(plan: Any) -> Iterator[Any]:
    """Install ``plan`` for the duration of the block; an outer plan (a trial around a
    nested reference run) is restored afterwards."""
    with field_set("plan", plan):
        yield plan
