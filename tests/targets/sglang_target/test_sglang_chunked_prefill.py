"""Chunked prefill on the sglang target: under upstream's loop, the request
being chunked kept out of upstream's ``merge_batch``, resumed through upstream's
``checkpoint_kv_cache`` (0.5.23's lifecycle), its middle chunks' results dropped; under
the NGRAM worker and upstream's EAGLE v2 worker. The same checks as impl's
(``tests/impl/test_chunked_prefill.py``)."""
from __future__ import annotations

import pytest

from tests.impl import test_chunked_prefill as impl_tests


pytestmark = pytest.mark.usefixtures("sglang")


def test_chunks_resume_through_upstreams_checkpoint(monkeypatch):
    from sglang.srt.mem_cache import common
    checkpoints = []
    real = common.checkpoint_kv_cache

    def spy(req, tree_cache):
        checkpoints.append((req.rid, req.extend_end))
        return real(req, tree_cache)
    monkeypatch.setattr(common, "checkpoint_kv_cache", spy)
    formed, res = impl_tests.watch_chunks(monkeypatch, "sglang")
    impl_tests.check_chunks(formed, res)
    # every chunk after the first resumed where upstream's checkpoint put it
    resumed = {(rid, prefix) for batch in formed for rid, prefix, _, _ in batch if prefix}
    assert resumed and resumed <= set(checkpoints)


@pytest.mark.parametrize("policy", ["eager", "lazy", "random(1)"])
def test_upstreams_eagle_worker_is_clean_with_chunked_prefill(monkeypatch, policy):
    """EAGLE v2 (upstream's EAGLEWorkerV2, which has no chunk-specific path: each chunk
    is an extend of its own) with chunked prefill and retractions."""
    formed, res = impl_tests.watch_chunks(monkeypatch, "sglang", policy, scenario="eagle-v2")
    impl_tests.check_chunks(formed, res, scenario="eagle-v2")


def test_chunked_outputs_are_the_models_continuation():
    impl_tests.test_chunked_outputs_are_the_models_continuation("sglang")


@pytest.mark.parametrize("name", impl_tests.MUTATIONS)
def test_chunking_bugs_are_killed_on_every_seed(name):
    impl_tests.test_chunking_bugs_are_killed_on_every_seed(name, "sglang")


def test_a_patch_of_a_toy_reaches_the_targets_that_bound_it_by_name():
    """The sglang target's loop binds the toy world's formation helpers by name (``from
    toys.requests import middle_chunk``): a patch of that function rebinds its name there
    too, for the patch's duration only."""
    import targets.sglang.engine.loop as loop
    from toys import requests
    from mutations import BY_NAME
    raw = requests.middle_chunk
    assert loop.middle_chunk is raw
    with BY_NAME["middle-chunk-committed"].applied():
        assert loop.middle_chunk is requests.middle_chunk is not raw
    assert loop.middle_chunk is raw
