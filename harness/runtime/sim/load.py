"""A background load on the simulated device (``runtime.load``): the copy engines as FIFO
queues, and a busy host.

A bulk copy of a copy load is a timed op on a stream of its own (``load``), lasting its
bytes over the engine's bandwidth on the virtual clock. The load issues them back to back,
as a server that keeps writing KV back does: a new one is queued behind the previous one
whenever a bulk copy's worth of host time has passed since that one was queued (or it has
run). A program's copy of that direction then waits for the bulk copy queued last -- a
wait marker on the copy's stream, as the engine serialises copies of one direction across
streams -- and starts only once it has run: late, behind the traffic, with no stall
injected anywhere. Copies a few host microseconds apart (one step's readbacks) queue
behind the same bulk copy; the next step's, a host sync later, behind a later one. The load stream
touches no program memory, so the only order it adds is "this copy after that bulk
copy". Under ``host-busy`` each copy and each host sync costs the host ``HOST_BUSY_US``.
"""
from __future__ import annotations

from harness.runtime.load import HOST_BUSY_US, NONE, Load
from harness.runtime.trace import OpKind, OpRecord

BULK_OP = "bulk copy"


def set_load(dev, load: Load) -> None:
    dev.load = load
    dev.engines = {}  # direction -> (the last bulk copy's position, its enqueue time)
    dev.load_stream = None


def before_copy(dev, direction: str) -> None:
    """A program copy of ``direction`` is about to be queued on the current stream."""
    load = dev.load
    if load is NONE or dev.capture is not None:  # a captured copy runs at replay
        return
    if load.host_busy:
        dev.host_clock += HOST_BUSY_US
    duration = load.bulk_us(direction)
    if not duration:
        return
    if dev.load_stream is None:
        dev.load_stream = dev.new_stream(name="load")
    stream = dev.load_stream
    last = dev.engines.get(direction)  # (position, when it was queued)
    if last is None or stream.done >= last[0][1] or dev.host_clock - last[1] >= duration:
        bulk = dev.enqueue(OpRecord(stream.sid, f"{BULK_OP} {direction}", [], [], None,
                                    kind=OpKind.STALL, duration=duration))
        last = dev.engines[direction] = ((stream.sid, bulk.seq), bulk.enq)
    dev.enqueue(OpRecord(dev.current.sid, f"copy engine ({direction})", [], [], None,
                         kind=OpKind.WAIT, wait_for=last[0], duration=0.0))


def before_sync(dev) -> None:
    if dev.load.host_busy:
        dev.host_clock += HOST_BUSY_US
