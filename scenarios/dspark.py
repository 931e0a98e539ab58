"""DSpark's overlap path on the sglang target (``spec_algorithm="dspark"``,
``targets/sglang/slices/dspark.py``): the two suspected races of the release, each with the
configuration that reaches it, the configurations that do not, and the candidate fix.

* ``dspark-confidence-ring``: a ragged verify mode (the relay carries the draft's
  confidence) on an attention backend with ``needs_cpu_seq_lens=False`` (FA3, Triton,
  TRT-LLM, DSV4): ``ConfidenceRelay.issue_ring_copy`` reads ``confidence_buf`` on the
  private D2H stream, unordered with the next forward's ``scatter`` into it. The D2H
  stream is stalled before the ring copy (a copy engine busy with an earlier transfer), so
  the slot can take the next step's confidence -- which the budget planner then reads as
  this one's. ``reports/upstream/findings/confidence-ring-war.md``.
* ``dspark-result-readback``: the folded accept (static mode, the accept in the verify
  graph): the result's ``next_token_ids`` / ``accept_lens`` are views of the graph's
  static buffers, read by ``_copy_result_to_cpu`` on the copy stream, which the next
  forward -- whose replay rewrites them -- never waits for. The copy stream is stalled
  before the readback. ``reports/upstream/findings/graph-result-readback.md``.
"""

from scenarios.base import AS_INSTALLED, Scenario, stall_at, with_fix
from scenarios.workloads import random_workload

_DSPARK = {"spec_algorithm": "dspark"}
# Default stalls (``--stall-ms`` overrides), long enough to make the race value-visible on
# both backends: on an H200 one host iteration of this toy loop is ~5 ms, so a late copy
# must outlast it (reports/measurements.md, DSpark on the H200: ring 1-4 ms 0 stale,
# 8 ms 25/50, 12 ms 19/50; readback 1 ms 0/200, 10 ms 200/200). The ring copy must also
# land before the resolve two publishes later, or copy_done.query() withholds the slot: a
# window, not a floor.
RING_STALL_MS = 8.0
READBACK_STALL_MS = 10.0
_RING = {**_DSPARK, "ragged_verify_mode": "compact", "needs_cpu_seq_lens": False,
         "folded_accept": False}
_FOLDED = {**_DSPARK, "ragged_verify_mode": "static", "folded_accept": True}


def _workload(seed: int):
    return random_workload(seed, n_requests=6, draft_token_num=4)


DSPARK_CONFIDENCE_RING = Scenario(
    name="dspark-confidence-ring",
    summary="DSpark, ragged verify (confidence relay), backend without CPU seq lens: the "
            "ring copy vs the next forward's scatter; D2H stream stalled before the copy",
    workload=_workload,
    # a finite stall by default: the ring copy is late, not lost -- it must land (after
    # the next scatter) for the host's copy_done.query() to hand the slot to the planner
    stalls=stall_at("d2h.before_ring_copy", default_ms=RING_STALL_MS),
    variants={AS_INSTALLED: dict(_RING),
              "fixed": with_fix("ring-copy-fenced", **_RING),
              # the other ragged mode builds the same ring
              "cap-accept": {**_RING, "ragged_verify_mode": "cap-accept"},
              "cpu-seq-lens": {**_RING, "needs_cpu_seq_lens": True},
              "static": {**_RING, "ragged_verify_mode": "static"}},
    default_variant=AS_INSTALLED,
    expect={(AS_INSTALLED, None): "race", ("cap-accept", None): "race"},
    sim_trials=10,
)

DSPARK_RESULT_READBACK = Scenario(
    name="dspark-result-readback",
    summary="DSpark, folded accept: the result readback of the verify graph's static "
            "buffers vs the next replay; copy stream stalled before the readback",
    workload=_workload,
    stalls=stall_at("copy.before_result_d2h", default_ms=READBACK_STALL_MS),
    variants={AS_INSTALLED: dict(_FOLDED),
              "fixed": with_fix("forward-waits-result-copy", **_FOLDED),
              # the cheaper fixes (reports/upstream/findings/graph-result-readback.md)
              "fixed-clone": with_fix("clone-graph-outputs", **_FOLDED),
              "fixed-conditional-wait": with_fix("forward-waits-graph-result-copy",
                                                 **_FOLDED),
              "eager-accept": {**_FOLDED, "folded_accept": False},
              # DSV4's attention backend asks for no CPU seq lens under DSpark (its
              # default: deepseek_v4_backend.py), so no step syncs a D2H of its own
              # before the next replay: behind bulk D2H traffic (--load bulk-d2h) the
              # readback lands late with no stall. With CPU seq lens each step's blocking
              # D2H drains the copy engine's queue -- the readback with it -- in time.
              "no-cpu-seq-lens": {**_FOLDED, "needs_cpu_seq_lens": False}},
    default_variant=AS_INSTALLED,
    expect={(AS_INSTALLED, None): "race", ("no-cpu-seq-lens", None): "race"},
    sim_trials=10,
)
