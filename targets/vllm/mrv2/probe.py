"""Ours, named as such: what the EAGLE drafter read as its sampling inputs, step by step,
against what the host had staged for those requests when it launched the drafter.

Model Runner V2's speculator copies the sampler's ``temperature`` and ``seeds`` -- UVA
views of the current slot of a two-slot pinned pool (``UvaBackedTensor``) -- into buffers
of its own (``_copy_request_inputs``, first thing in ``propose``), after the step's output
copy event. In a synchronous run that copy reads the values the host staged for the
batch's requests (the pool's source of truth, ``.np``, does not change between the
staging and the launch). Under overlap the host may restage the slot before the copy
executes (the audit's S1, ``reports/upstream/vllm-0.34.0-audit.md``); this records the
difference without changing the schedule:

* at launch (host): the batch's request rows of the source of truth, and the requests;
* right after ``propose`` (queued on the main stream, so it reads what the copy wrote,
  before the next step's copy overwrites it): a device clone of the speculator's rows;
* at the engine's close (after its last sync): the clones read back and compared.

``drafter_input_mismatches`` keeps every difference of the process's runs (request id,
the step's index, the row, staged value, read value): the S1 scenario's value-level
evidence, read by ``tests/targets/vllm_v1/test_mrv2_releases.py`` (``test_s1_...``). A
greedy request's tokens do not depend on these rows (greedy drafting reads neither), so
a difference shows here, not in the tokens.
"""
from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import torch

# every mismatch seen in this process: dicts (see DrafterInputProbe.close)
drafter_input_mismatches: List[Dict[str, Any]] = []
# run label -> how many drafter launches were checked in this process
checked: Dict[str, int] = {}


class DrafterInputProbe:
    def __init__(self, runner) -> None:
        self.runner = runner
        self.records: List[tuple] = []
        self.step = 0

    def launch(self, input_batch) -> tuple:
        """Host side, as ``propose`` is called: the staged rows of the batch."""
        states = self.runner.sampler.sampling_states
        idx = np.asarray(input_batch.idx_mapping_np).copy()
        return (self.step, list(input_batch.req_ids), idx,
                np.asarray(states.temperature.np)[idx].copy(),
                np.asarray(states.seeds.np)[idx].copy())

    def after(self, staged: tuple) -> None:
        """Device side, queued right after ``propose``: the speculator's buffers as the
        copy left them (whole: indexing them by the batch would need the indices on the
        device, an upload the schedule would feel)."""
        spec = self.runner.speculator
        self.records.append((*staged, spec.temperature.clone(), spec.seeds.clone()))
        self.step += 1

    def close(self, label: str) -> None:
        """After the engine's last step: read the clones back and compare."""
        for step, req_ids, idx, temp, seeds, got_temp, got_seeds in self.records:
            checked[label] = checked.get(label, 0) + 1
            got_t, got_s = got_temp.cpu().numpy()[idx], got_seeds.cpu().numpy()[idx]
            for i, rid in enumerate(req_ids):
                if got_t[i] != temp[i] or got_s[i] != seeds[i]:
                    drafter_input_mismatches.append(dict(
                        run=label, req=rid, step=step, row=int(idx[i]),
                        staged=(float(temp[i]), int(seeds[i])),
                        read=(float(got_t[i]), int(got_s[i]))))
        self.records.clear()


def wrap_propose(runner, fault_point) -> None:
    """The speculator's ``propose`` with the stall point before it (the main stream held
    after the output copy event, the drafter queued behind) and the probe around it."""
    spec = getattr(runner, "speculator", None)
    if spec is None:
        return
    upstream = spec.propose
    probe = runner._specrace_probe = DrafterInputProbe(runner)

    def propose(input_batch, *args: Any, **kwargs: Any):
        dummy = kwargs.get("dummy_run", False)
        staged = None if dummy else probe.launch(input_batch)
        if not dummy:
            fault_point("vllm.before_propose")
        out = upstream(input_batch, *args, **kwargs)
        if staged is not None:
            probe.after(staged)
        return out

    spec.propose = propose
