"""Every host-visible value judged: each place where the host reads memory a device copy
may write (a pinned buffer; the trace's ``HostAccess`` reads) is either compared by an
oracle against the synchronous reference, or listed as exempt with the reason. A new host
read -- a release that reads one more device value on the host, or a scenario that
reaches one -- fails here until it is judged or its exemption is argued."""
from __future__ import annotations

import os

import pytest

from harness.runtime.trace import HostAccess

# (file, function) -> the oracle kind that compares the value the host read there
JUDGED = {
    ("batch_result_processor.py", "_resolve_spec_v2_tokens"): "result (accept lengths, tokens)",
    ("batch_result_processor.py", "process_batch_result_prefill"): "result (the prefill token)",
    ("batch_result_processor.py", "_append_decode_hidden_states"): "hidden_states",
    ("batch_result_processor.py", "_append_prefill_hidden_states"): "hidden_states",
    ("allocation.py", "write_cache_indices"): "kv_context (the slots the attention read)",
    ("allocation.py", "alloc_for_spec_decode"): "kv_context (the slots the attention read)",
    ("overlap_utils.py", "resolve_seq_lens_cpu"): "seq_lens (the mirror and its sum)",
    ("overlap_utils.py", "resolve"): "confidence_resolved (the ring slot, by publish)",
    ("spec_utils.py", "dfs"): "grammar (every bitmask row against a brute-force walk)",
    ("batch_result_processor.py", "advance_grammar_fsm"): "grammar + result (schema-valid "
                                                          "outputs, committed tokens)",
}
# (file, function) -> why the value read there needs no comparison of its own
EXEMPT = {
    ("schedule_batch.py", "merge_batch"): "host-made pool indices (req_pool_indices_cpu): "
                                          "no device copy writes them",
    ("schedule_batch.py", "filter_batch"): "host-made pool indices, as merge_batch",
    ("worker.py", "launch_rows"): "the toy worker's own bookkeeping of host-made rows",
    ("loop.py", "observe_kv_reads"): "the oracle's own probe reading what the attention "
                                     "read, to judge it (kv_context)",
}
RUNS = [("ngram-filter-race", "as-installed"), ("dspark-result-readback", "as-installed"),
        ("dspark-confidence-ring", "cpu-seq-lens"), ("dspark-confidence-ring", "as-installed"),
        ("ngram-hidden-readback", "as-installed"), ("eagle-v2", "as-installed"),
        ("kv-row-reuse", "retract"), ("grammar-ngram", "as-installed")]


@pytest.fixture(scope="module")
def sites():
    import targets
    from scenarios.resolve import run_scenario_result
    try:
        targets.get("sglang")
    except targets.TargetError:
        pytest.skip("sglang is not installed (make upstream)")
    seen = {}
    for scenario, variant in RUNS:
        res = run_scenario_result(scenario, target="sglang", variant=variant, backend="sim",
                                  trials=1)
        for rec in res.trace.records:
            if isinstance(rec, HostAccess) and not rec.write and rec.frame:
                seen.setdefault((os.path.basename(rec.frame[0]), rec.frame[2]), scenario)
    return seen


def test_every_host_read_is_judged_or_exempt_with_a_reason(sites):
    unjudged = {site: sc for site, sc in sites.items()
                if site not in JUDGED and site not in EXEMPT}
    assert not unjudged, f"host reads neither judged nor exempt: {unjudged}"


def test_the_lists_name_only_reads_that_happen(sites):
    """A stale entry would hide a removed read: every listed site is seen in the runs."""
    assert set(JUDGED) | set(EXEMPT) <= set(sites), set(JUDGED) | set(EXEMPT) - set(sites)
    assert all(reason for reason in EXEMPT.values())


def test_the_mirror_is_judged_a_mirror_of_the_batch_rows_only_is_caught():
    import targets
    from matrix.run import PROBES, run_probe
    m = targets.get("sglang").mutation("seq-lens-mirror-batch-rows-only")
    killed, oracle, detail = run_probe(PROBES["dspark-readback"], "sim", m, "sglang")
    assert killed and oracle == "stale-value" and "seq lens" in detail, detail
