"""A toy worker's target forward through upstream's ``ModelRunner.forward``.

The batch is upstream's ``ScheduleBatch``; ``ForwardBatch.init_new`` builds the forward
batch from it, as ``TpModelWorker.forward_batch_generation`` does, and
``ModelRunner.forward`` runs it: the eager runner (or a decode graph runner's replay),
the attention backend's metadata, the stand-in model's attention over upstream's KV pool.
A verify is laid out as upstream's ``NGRAMWorker._prepare_for_speculative_decoding``
lays it: ``TARGET_VERIFY``, the drafts as input ids, the verify window's slots as
``out_cache_loc``, an ``NgramVerifyInput`` carrying the positions -- for the length of
the call only: the batch keeps its relayed accept state (``spec_info``) and its mode
for the scheduler, which reads them after the launch.
"""
from __future__ import annotations

import contextlib

import torch


def _fb():
    from targets.sglang.boundary import upstream
    return upstream.import_named({"fb": "sglang.srt.model_executor.forward_batch_info"})["fb"]


@contextlib.contextmanager
def _laid_out(batch, **fields):
    """``batch`` with ``fields`` set for the call, then as it was."""
    saved = {k: getattr(batch, k) for k in fields}
    for k, v in fields.items():
        setattr(batch, k, v)
    try:
        yield batch
    finally:
        for k, v in saved.items():
            setattr(batch, k, v)


def _run(runner, batch):
    fb = _fb().ForwardBatch.init_new(batch, runner, return_hidden_states_before_norm=False)
    out = runner.forward(fb).logits_output
    return out.hidden_states, out.next_token_logits


def extend(runner, batch):
    """``(hidden, logits)`` of a prefill -- the toy forwards each request's last token --
    or None without a runner (the toy model's forward runs). The slot it writes is the
    one ``prepare_for_extend`` lays out: each row's column ``seq_len - 1``."""
    if runner is None:
        return None
    rows = batch.req_pool_indices.to(torch.int64)
    slots = runner.req_to_token_pool.req_to_token[rows, batch.seq_lens - 1].to(torch.int64)
    with _laid_out(batch, out_cache_loc=slots):
        return _run(runner, batch)


def verify(runner, batch, drafts, window):
    """``(hidden, logits)`` of every draft node -- ``drafts`` ``(bs*D,)``, ``window``
    ``(bs, D)`` the slots the verify writes (the KV the toy attention writes too) -- or
    None without a runner. Called before the worker publishes read-done: upstream's
    attention backend reads ``req_to_token`` inside the forward."""
    if runner is None:
        return None
    from targets.sglang.boundary import upstream
    bs, D = window.shape
    depth = torch.arange(D, dtype=torch.int64, device=drafts.device)
    positions = (batch.seq_lens.view(bs, 1).to(torch.int64) + depth).view(-1)
    # the tree mask as a chain's (each node sees the ones before it): the stand-in
    # attention's backend reads none of it
    mask = torch.ones((D, D), dtype=torch.bool, device=drafts.device).tril().repeat(bs, 1)
    spec = upstream.NgramVerifyInput(draft_token=drafts, custom_mask=mask.view(-1),
                                     positions=positions, draft_token_num=D)
    with _laid_out(batch, forward_mode=upstream.ForwardMode.TARGET_VERIFY,
                   input_ids=drafts, out_cache_loc=window.reshape(-1), spec_info=spec):
        return _run(runner, batch)
