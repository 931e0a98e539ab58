"""Programs over the installed sglang's relay code beyond the engine (the upstream audit,
``tools/reports/upstream_audit.py``, and ``tests/targets/sglang_target``): the confidence relay's ring.

``confidence_ring`` drives ``FutureMap``'s confidence relay (DSpark's): each forward
publishes ``new_seq_lens`` and a confidence tensor (``ConfidenceRelay.scatter`` into
``confidence_buf`` on the forward stream, then ``issue_ring_copy``: the private D2H stream
waits on ``publish_ready`` and copies the buffer into a pinned ring slot), and before each
launch the host resolves the slot two steps back (``copy_done[slot].query()``, then a host
read of the pinned ring). It returns what the host resolved against what was published,
and the detector's races.
"""
from __future__ import annotations

POLICIES = ["eager", "lazy", "stall(forward)", "stall(schedule)", "random(1)", "random(2)",
            "pct(1,3)", "pct(2,2)"]
# the request pool's rows, the confidences per request, the batch's requests
_POOL_SIZE, _GAMMA, _BS = 8, 3, 2


def confidence_ring(policy: str, needs_cpu_seq_lens: bool = True, steps: int = 8,
                    trust_slot: bool = False) -> dict:
    """Drive the confidence relay's ring for ``steps`` forwards on the simulator, in
    ``run_batch``'s order: on the schedule stream ``resolve_seq_lens_cpu`` (with
    ``needs_cpu_seq_lens`` it copies on the private D2H stream and synchronizes it), then
    ``resolve_confidence_cpu`` (the DSpark budget prep), then the forward, which publishes
    ``new_seq_lens`` and the confidence (scatter + ring copy on the D2H stream)."""
    from harness.detect import detect
    from harness.policies import parse_policy
    from harness.runtime.sim.runtime import sim_runtime
    # sglang itself, loaded through the target's boundary (stand-ins first), before the
    # control patch looks its code up and before the simulator starts
    from targets.sglang.boundary import upstream  # noqa: F401

    patch = _control_patch(trust_slot)
    with sim_runtime(parse_policy(policy)) as rt, patch:
        ring = _build_ring(rt, needs_cpu_seq_lens)
        resolved, mismatches = _run_steps(rt, ring, steps)
        races = detect(rt.trace)
        rt.synchronize()
    return {"policy": policy, "needs_cpu_seq_lens": needs_cpu_seq_lens, "steps": steps,
            "resolved": resolved,
            "mismatches": mismatches, "races": [r.summary() for r in races]}


def _control_patch(trust_slot: bool):
    """With ``trust_slot``, the control: upstream's resolve without its ``copy_done``
    poll (the host reads the slot however far its copy is); else nothing patched."""
    import contextlib

    from seams.sourcepatch import SourcePatch
    return (SourcePatch("sglang.srt.managers.overlap_utils:ConfidenceRelay.resolve", ((
        "        if not self.copy_done[slot].query():\n            return None\n", ""),),
        "control: resolve without the copy_done poll").applied()
        if trust_slot else contextlib.nullcontext())


def _build_ring(rt, needs_cpu_seq_lens: bool):
    """The forward and schedule streams, a real ``FutureMap`` with the confidence relay
    over a stand-in request pool, and the batch of two requests every step runs."""
    import types

    import torch

    from targets.sglang.boundary import upstream
    m = rt.module
    fwd = m.Stream()
    rt.label(fwd, "forward")
    pool = types.SimpleNamespace(
        req_to_token=torch.zeros((_POOL_SIZE, 1), dtype=torch.int32, device=rt.device),
        req_generation=torch.zeros((_POOL_SIZE,), dtype=torch.int64))
    fm = upstream.overlap_utils.FutureMap(
        rt.device, upstream.SpeculativeAlgorithm.NGRAM, pool,
        needs_cpu_seq_lens=needs_cpu_seq_lens, needs_confidence_relay=True)
    rt.label(fm.fwd_prepare_d2h_stream, "d2h")
    sched = m.Stream()
    rt.label(sched, "schedule")
    indices = torch.tensor([1, 2], dtype=torch.int64, device=rt.device)
    batch = types.SimpleNamespace(
        spec_info=types.SimpleNamespace(future_indices=indices),
        req_pool_indices=indices, req_pool_indices_cpu=torch.tensor([1, 2]))
    return types.SimpleNamespace(fwd=fwd, sched=sched, fm=fm, indices=indices, batch=batch)


def _run_steps(rt, ring, steps: int):
    """The steps: the host resolves (before each launch), then the forward publishes.
    Returns how many resolves came back and where one differed from what was published."""
    from targets.sglang.boundary import upstream
    ou = upstream.overlap_utils
    fm = ring.fm
    mismatches, resolved = [], 0
    published = []
    for step in range(steps):
        with rt.module.stream(ring.sched):
            fm.resolve_seq_lens_cpu(ring.batch)
            got = fm.resolve_confidence_cpu(ring.batch)  # the host, before the next launch
        if got is not None:
            resolved += 1
            want = published[fm.confidence_relay.ring_pos - ou.CONFIDENCE_RELAY_RING_LAG]
            if got.confidence.tolist() != want:
                mismatches.append({"step": step, "expected": want,
                                   "observed": got.confidence.tolist()})
        value = [[float(step * 10 + r * _GAMMA + k) for k in range(_GAMMA)]
                 for r in range(_BS)]
        published.append(value)
        _forward(rt, ring, value)
    return resolved, mismatches


def _forward(rt, ring, value) -> None:
    """One forward on its stream, after the schedule stream: it publishes ``value`` as
    the confidence and a ``new_seq_lens`` of 5 per request."""
    import torch
    with rt.module.stream(ring.fwd):
        ring.fwd.wait_stream(ring.sched)
        rt.stall(None)  # the forward's confidence is late
        conf = torch.tensor(value, device=rt.device)
        ring.fm.publish(ring.indices, torch.full((_BS,), 5, dtype=torch.int64,
                                                 device=rt.device), conf)
