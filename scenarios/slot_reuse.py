"""Slot reuse: many short requests through a request pool of three slots.

Requests always wait for a slot, so every slot a finished request releases goes to the
next one in the following iteration -- while the finished request's last forward (the
step it ran past its finish under overlap) may still be in flight -- and requests finish
in the same iterations others join. The forward stream is stalled after the
shared-read-done record, as in the seed scenario. Bugs in the pool's bookkeeping (its
edge, releases, which requests a batch still holds) are unreachable while every request
gets a fresh slot; here they hand one request another's relayed state.
"""

from scenarios.base import Scenario, stall_at
from scenarios.workloads import slot_reuse_workload

SLOT_REUSE = Scenario(
    name="slot-reuse",
    summary="many short requests through a 3-slot request pool: each released slot goes "
            "to a waiting request while its finished owner's last forward may be in "
            "flight; forward stalled after the shared-read-done record",
    workload=slot_reuse_workload,
    stalls=stall_at("forward.after_read_done"),
    variants={"fixed": {"relay": "future_map"}, "pre-fix": {"relay": "spec_info"}},
    default_variant="fixed",
    expect={("fixed", None): "clean", ("pre-fix", "fine"): "race",
            ("pre-fix", "coarse"): "clean"},
)
