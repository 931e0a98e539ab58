"""The stand-ins for Model Runner V2's logprobs kernels (``targets/vllm/mrv2/
logprob_kernels.py``) against loop-by-loop references written from each Triton kernel's
per-program code (vLLM 0.17.0 / 0.34.0 ``sample/logprob.py``, ``sample/prompt_logprob.py``),
on random batches, in the core environment."""
from __future__ import annotations

import math

import pytest
import torch

from targets.vllm.mrv2 import logprob_kernels as LP
from targets.vllm.mrv2.table import KERNELS, stand_in_params


def _batch(seed, rows=5, vocab=37, topk=3):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows + 2, vocab, generator=g)  # rows beyond the grid: untouched
    ids = torch.randint(0, vocab, (rows + 2, topk), generator=g)
    return g, logits, ids


def _ref_log_softmax(logits, ids, rows, vocab, topk):
    out = torch.full((rows, topk), float("nan"))
    for r in range(rows):  # one program per row
        row = [float(x) for x in logits[r, :vocab]]
        top = max(row)
        lse = math.log(sum(math.exp(x - top) for x in row))
        for k in range(topk):
            out[r, k] = row[int(ids[r, k])] - top - lse
    return out


@pytest.mark.parametrize("seed", range(6))
def test_topk_log_softmax_every_spelling(seed):
    rows, vocab, topk = 5, 37, 3
    _, logits, ids = _batch(seed, rows, vocab, topk)
    want = _ref_log_softmax(logits, ids, rows, vocab, topk)
    early = torch.full((rows + 2, topk), -7.0)
    LP.topk_log_softmax((rows,), early, logits, vocab, ids[:rows].contiguous(), topk, vocab)
    blocked = torch.full((rows + 2, topk), -7.0)
    LP.topk_log_softmax_blocked((rows,), blocked, logits, vocab, ids[:rows].contiguous(), topk,
                                vocab, TOPK_BLOCK_SIZE=2)
    late = torch.full((rows + 2, topk), -7.0)
    LP.topk_log_softmax_strided((rows,), late, logits, vocab, ids, ids.stride(0), topk, vocab)
    for got in (early, blocked, late):
        assert torch.allclose(got[:rows], want, atol=1e-5)
        assert (got[rows:] == -7.0).all()  # beyond the grid: not written


@pytest.mark.parametrize("seed", range(6))
def test_ranks(seed):
    rows, vocab = 5, 37
    g, logits, _ = _batch(seed, rows, vocab)
    logits[0, 3] = logits[0, 4]  # a tie counts: logits >= x
    tokens = torch.randint(0, vocab, (rows,), generator=g)
    tokens[0] = 3
    out = torch.full((rows + 1,), -1, dtype=torch.int64)
    LP.ranks((rows,), out, logits, vocab, tokens, vocab)
    want = [sum(1 for v in range(vocab) if logits[r, v] >= logits[r, int(tokens[r])])
            for r in range(rows)]
    assert out[:rows].tolist() == want and out[rows] == -1


@pytest.mark.parametrize("seed", range(6))
def test_prompt_logprobs_token_ids(seed):
    g = torch.Generator().manual_seed(seed)
    reqs, width, max_q = 4, 40, 6
    all_ids = torch.randint(0, 100, (reqs + 2, width), generator=g)
    qlen = torch.randint(0, max_q, (reqs,), generator=g)
    qsl = torch.cat([torch.zeros(1, dtype=torch.int64), qlen.cumsum(0)]).to(torch.int32)
    idx = torch.randperm(reqs + 2, generator=g)[:reqs].to(torch.int32)
    nct = torch.randint(0, width - max_q - 1, (reqs + 2,), generator=g).to(torch.int32)
    n = int(qsl[-1]) + 3  # a padded tail: not a token of any request
    out = torch.full((n,), -1, dtype=torch.int64)
    LP.prompt_logprobs_token_ids((reqs,), out, qsl, idx, nct, all_ids, all_ids.stride(0))
    want = [-1] * n
    for b in range(reqs):  # one program per batch row
        r = int(idx[b])
        for i in range(int(qsl[b + 1]) - int(qsl[b])):
            want[int(qsl[b]) + i] = int(all_ids[r, int(nct[r]) + 1 + i])
    assert out.tolist() == want
    early = torch.full((n,), -1, dtype=torch.int64)
    LP.prompt_logprobs_prefill_token_ids((reqs,), early, qsl, idx, nct, all_ids,
                                         all_ids.stride(0))
    assert early.tolist() == want


def test_each_stand_in_takes_its_kernels_parameters_as_the_releases_spell_them():
    """Read from 0.17.0 / 0.27.1 / 0.34.0's sources (0.16.0: ``prefill_token_ids``)."""
    table = {name: [stand_in_params(f) for f in fns] for _, name, fns in KERNELS}
    assert table["_topk_log_softmax_kernel"] == [
        ("output_ptr", "logits_ptr", "logits_stride", "topk_ids_ptr", "topk", "vocab_size",
         "BLOCK_SIZE", "PADDED_TOPK"),
        ("output_ptr", "logits_ptr", "logits_stride", "topk_ids_ptr", "topk", "vocab_size",
         "BLOCK_SIZE", "TOPK_BLOCK_SIZE"),
        ("output_ptr", "logits_ptr", "logits_stride", "topk_ids_ptr", "topk_ids_stride",
         "topk", "vocab_size", "BLOCK_SIZE", "TOPK_BLOCK_SIZE")]
    assert table["_ranks_kernel"] == [("output_ptr", "logits_ptr", "logits_stride",
                                       "token_ids_ptr", "vocab_size", "BLOCK_SIZE")]
    assert [p[4] for p in table["_prompt_logprobs_token_ids_kernel"]] == [
        "all_token_ids_ptr", "prefill_token_ids_ptr"]
