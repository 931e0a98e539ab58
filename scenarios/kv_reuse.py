"""Rows and KV slots reused under overlap: the WAR barrier guards real buffers.

The slot-reuse workload (many short requests through three request-pool rows, beside one
long request) with a KV pool small enough that requests also wait for slots: every row
and the slots a finished request releases go to a waiting request in the next
iteration, whose prefill preparation rewrites ``req_to_token`` on the schedule stream --
while the finished request's last forward (the step it ran past its finish) may not yet
have gathered that row. The forward stream is stalled before its attention gathers
``req_to_token``; only the WAR barrier orders the schedule stream's rewrite after the
gather. It is stalled again after it records shared-read-done: a read of the pools
after that point (read-done recorded too early, a later re-read of a row) is then late
too. The KV oracle judges what every forward's attention read. Variant ``swa`` pairs the
slots with SWA slots through a device mapping (a hybrid sliding-window model's pool),
which the free of a finished request clears during result processing. Variant
``retract`` retracts three running requests at fixed points (``ServerArgs.retract_at``):
their rows and slots go back while a step of theirs may be in flight, and they are
prefilled again from their prompt and tokens. Variants ``chunked*`` prefill in chunks of
``CHUNK`` tokens (``ServerArgs.chunked_prefill_size``): the request being chunked holds
its row across iterations, outside the running batch, and each next chunk's columns are
written on the schedule stream while the last chunk's forward may not have gathered the
row yet; its middle chunks' results are dropped.
"""
import dataclasses

from scenarios.axes import engage
from scenarios.base import Scenario, stall_at, with_bug
from scenarios.workloads import slot_reuse_workload

KV_POOL_SLOTS = 96  # the long request and two short ones at a time
# (rid, output tokens held): the long request mid-way, two short ones after one verify
RETRACT_AT = ((0, 8), (3, 2), (6, 2))
# retraction under pressure (kv-pressure): eight requests, budgets up to 10 tokens beside
# a 24-token one, in a pool that holds two whole lifetimes but not three
PRESSURE_SLOTS = 64
CHUNK = 4  # prompt tokens a prefill takes (chunked variants): most prompts need two or more


def kv_reuse_workload(seed: int):
    return dataclasses.replace(slot_reuse_workload(seed), kv_pool_size=KV_POOL_SLOTS)


KV_ROW_REUSE = Scenario(
    name="kv-row-reuse",
    summary="rows and KV slots of finished requests rewritten for waiting ones while the "
            "finished request's last forward may not have gathered its row yet; forward "
            "stalled before its attention metadata and after read-done",
    workload=kv_reuse_workload,
    stalls=stall_at("forward.before_attn_metadata", "forward.after_read_done"),
    variants={"fixed": {}, "no-war-barrier": with_bug("war-barrier-removed"),
              # a hybrid sliding-window pool: freeing a finished request's slots clears
              # their SWA mapping during result processing, which the barrier right after
              # each launch (#31687) orders after the in-flight forward's translate
              "swa": engage("swa"),
              # a device drafter before the target's verify (EAGLE-style): two runners
              # publish read-done; the barrier must take the target's
              "eagle": {"spec_algorithm": "eagle"},
              "swa-barrier-at-loop-top": with_bug("war-barrier-at-loop-top", kv_layout="swa"),
              # retraction: the long request and two short ones give their rows and
              # slots back mid-run (a step of theirs in flight) and are prefilled again
              "retract": engage("retraction", RETRACT_AT),
              # --disable-overlap-schedule: every batch's results processed before the
              # next launch (the rows still change hands between steps)
              "overlap-off": engage("overlap-off"),
              "retract-no-war-barrier": with_bug("war-barrier-removed", retract_at=RETRACT_AT),
              # chunked prefill: prompts (and the retracted requests' histories) go in
              # chunks of CHUNK tokens, the request being chunked kept out of the
              # running batch, its next chunk's columns written while its last chunk's
              # forward may still gather the row
              "chunked": engage("chunked-prefill", CHUNK),
              "chunked-retract": {**engage("chunked-prefill", CHUNK),
                                  **engage("retraction", RETRACT_AT)},
              "chunked-no-war-barrier": with_bug("war-barrier-removed",
                                                 chunked_prefill_size=CHUNK,
                                                 retract_at=RETRACT_AT)},
    default_variant="fixed",
    expect={("fixed", None): "clean", ("no-war-barrier", None): "race", ("swa", None): "clean", ("eagle", None): "clean",
            ("swa-barrier-at-loop-top", None): "race", ("retract", None): "clean",
            ("retract-no-war-barrier", None): "race", ("chunked", None): "clean",
            ("chunked-retract", None): "clean", ("chunked-no-war-barrier", None): "race",
            ("overlap-off", None): "clean"},
)


def kv_pressure_workload(seed: int):
    return dataclasses.replace(slot_reuse_workload(seed, n_requests=8, max_tokens=10,
                                                   long_tokens=24),
                               kv_pool_size=PRESSURE_SLOTS)


KV_PRESSURE = Scenario(
    name="kv-pressure",
    summary="retraction under real memory pressure: requests admitted on their prefill "
            "alone run the KV pool short in decode, and the scheduler (on 0.5.23 "
            "upstream's check_decode_mem / retract_decode) retracts whom it chooses, a "
            "step of theirs in flight; forward stalled as in kv-row-reuse",
    workload=kv_pressure_workload,
    stalls=KV_ROW_REUSE.stalls,
    variants={"fixed": engage("pressure"),
              "no-war-barrier": with_bug("war-barrier-removed", **engage("pressure")),
              # the same workload admitted on whole lifetimes: never short, no retraction
              "lifetime": {}},
    default_variant="fixed",
    expect={("fixed", None): "clean", ("no-war-barrier", None): "race",
            ("lifetime", None): "clean"},
)
