"""Seeded bugs in the installed sglang's DSpark code: run-time source patches of
upstream's ``ConfidenceRelay`` (the confidence ring), the DSPARK ``FutureMap`` (bonus
relay, publish), ``DFlashDraftInputV2`` (filter / merge) and the budget planner, as in
``sglang.py`` (whose helper they use). Probed on the ``dspark-confidence-ring`` and
``dspark-result-readback`` scenarios (``targets/sglang/slices/dspark.py``).
"""
from __future__ import annotations

from typing import List

from mutations import Mutation
from mutations.sglang import _FM, DSPARK_RELAY, DSPARK_RING, M

_RING = "sglang.srt.managers.overlap_utils:ConfidenceRelay"
_DFLASH = "sglang.srt.speculative.dflash_info_v2:DFlashDraftInputV2"
_PLANNER = "sglang.srt.speculative.dspark_components.dspark_planner:HostConfidenceBudgetPlanner"

MUTATIONS: List[Mutation] = [
    # --- DSpark: the confidence relay's ring, the bonus relay, filter/merge ----
    M("ring-copy-skips-publish-wait",
      "ConfidenceRelay.issue_ring_copy copies confidence_buf without waiting for "
      "publish_ready (the copy can read the buffer before the forward's scatter)",
      "DSpark (ring)", f"{_RING}.issue_ring_copy",
      [("        stream.wait_event(publish_ready)\n", "")],
      DSPARK_RING),
    M("ring-copy-done-not-recorded",
      "ConfidenceRelay.issue_ring_copy never records copy_done[slot] (an unrecorded event "
      "queries as done: the host reads the pinned slot before the copy lands)",
      "DSpark (ring)", f"{_RING}.issue_ring_copy",
      [("            self.copy_done[slot].record()\n", "")],
      DSPARK_RING),
    M("ring-resolve-skips-query",
      "ConfidenceRelay.resolve hands out the lagged slot without polling copy_done[slot]",
      "DSpark (ring)", f"{_RING}.resolve",
      [("        if not self.copy_done[slot].query():\n            return None\n", "")],
      DSPARK_RING),
    M("ring-lag-off-by-one",
      "ConfidenceRelay.resolve reads the slot one step newer than the lag says (the budget "
      "planner takes that step's confidence as the lagged one's)",
      "DSpark (ring lag)", f"{_RING}.resolve",
      [("        slot = (self.ring_pos - CONFIDENCE_RELAY_RING_LAG) % "
        "CONFIDENCE_RELAY_RING_DEPTH\n",
        "        slot = (self.ring_pos - CONFIDENCE_RELAY_RING_LAG + 1) % "
        "CONFIDENCE_RELAY_RING_DEPTH\n")],
      DSPARK_RING),
    M("publish-ready-before-confidence-scatter",
      "FutureMap.publish records publish_ready before the confidence scatter (the ring "
      "copy's wait then admits a read of the buffer before it is written)",
      "DSpark (ring) / M5", f"{_FM}.publish",
      [("        if publish_confidence:\n"
        "            self.confidence_relay.scatter(indices, confidence)\n", ""),
       ("            self._publish_fresh = True\n",
        "            self._publish_fresh = True\n"
        "        if publish_confidence:\n"
        "            self.confidence_relay.scatter(indices, confidence)\n")],
      DSPARK_RING),
    M("budget-freshness-skips-generation",
      "the budget planner's freshness test without the slot generation: a pool slot reused "
      "within the ring's lag hands the new request the previous occupant's confidence, "
      "and its verify budget is planned from it",
      "DSpark (budget planner)", f"{_PLANNER}._two_steps_prior_survival",
      [("        fresh = (\n"
        "            (current_gen >= 1) & (lagged_generation.to(torch.int64) == current_gen)\n"
        "        ).view(-1, 1)\n",
        "        fresh = (current_gen >= 1).view(-1, 1)\n")],
      DSPARK_RING),
    M("stash-drops-bonus-tokens",
      "FutureMap.stash does not write the relayed bonus token for a non-NGRAM algorithm "
      "(the next verify starts from a stale bonus)",
      "DSpark (bonus relay) / M1", f"{_FM}.stash",
      [("        else:\n"
        "            self.output_tokens_buf[indices] = payload.bonus_tokens.to(\n"
        "                self.output_tokens_buf.dtype\n"
        "            )\n",
        "        else:\n"
        "            pass\n")],
      DSPARK_RELAY),
    M("dflash-filter-keeps-all-indices",
      "DFlashDraftInputV2.filter_batch keeps every future index when requests leave the "
      "batch (the survivors resolve the wrong rows)",
      "DSpark (filter) / PR #35198", f"{_DFLASH}.filter_batch",
      [("            self.future_indices = self.future_indices[new_indices]\n", "")],
      DSPARK_RELAY),
    M("dflash-merge-drops-new-indices",
      "DFlashDraftInputV2.merge_batch keeps only the running batch's future indices when "
      "a prefill joins",
      "DSpark (merge) / PR #35198", f"{_DFLASH}.merge_batch",
      [("            self.future_indices = torch.cat(\n"
        "                [self.future_indices, spec_info.future_indices]\n"
        "            )\n", "")],
      DSPARK_RELAY),
]
