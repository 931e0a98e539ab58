"""Why a vLLM census site did not run, in words a reader can act on (issue 58, item 3):
each reason rule of ``targets/vllm/environments/census.py`` names the configuration or
hardware its sites need, and ``specrace coverage`` lists it beside the category. A
configuration rule leaves its sites in the headline's denominator (a single-node server
with that configuration runs them); the words never move a site out of it."""
from __future__ import annotations

import pytest

from targets.census import Census, Site
from targets.census_rules import CONFIG, NOT_REACHED, OFF_NODE
from targets.coverage import CoverageResult, ScenarioRun, classify, rule_words as why
from targets.vllm.environments.census import RULES


def _site(file, function, text="x.to('cpu', non_blocking=True)", guards=(), line=10):
    return Site(file=file, line=line, col=4, function=function, kind="non-blocking-copy",
                span=(line, line), guards=tuple(guards), text=text)


def test_every_rule_says_in_words_what_its_sites_need():
    assert all(len(rule) == 4 and rule[3] for rule in RULES), \
        [rule[:3] for rule in RULES if len(rule) != 4 or not rule[3]]


@pytest.mark.parametrize("site, category, words", [
    # 0.17.0 gpu_model_runner.py:292, the pooling models' output copy
    (_site("v1/worker/gpu_model_runner.py", "_copy_pooler_output_to_cpu"), CONFIG, "pooling"),
    # :1826, decode context parallel's local seq_lens
    (_site("v1/worker/gpu_model_runner.py", "GPUModelRunner._build_attention_metadata",
           guards=("self.dcp_world_size > 1",)), CONFIG, "several GPUs: context parallel"),
    # 0.34.0 pp_utils.py
    (_site("v1/worker/gpu/pp_utils.py", "pp_receive"), CONFIG, "pipeline parallel"),
    # 0.17.0 outputs.py:72, a logprobs request's copy
    (_site("v1/outputs.py", "LogprobsTensors.to_cpu_nonblocking"), CONFIG, "logprobs"),
    # 0.17.0 structured_output/utils.py:100: V1's own grammar bitmask -- no rule may claim
    # it: a configuration the target can run, so "not reached" is the honest word
    (_site("v1/structured_output/utils.py", "apply_grammar_bitmask"), NOT_REACHED, ""),
])
def test_a_site_gets_the_words_of_the_rule_that_names_it(site, category, words):
    assert classify(site, RULES) == category
    assert words in why(site, RULES) and (words or why(site, RULES) == "")


def test_configuration_sites_stay_in_the_denominator_and_coverage_lists_their_words():
    sites = [_site("v1/worker/gpu_model_runner.py", "_copy_pooler_output_to_cpu", line=1),
             _site("v1/worker/gpu_model_runner.py", "GPUModelRunner._prepare_inputs", line=2),
             _site("v1/worker/gpu/pp_utils.py", "pp_receive", line=3)]
    census = Census(target="vllm", package="vllm", version="0.17.0", root="/nowhere",
                    areas=("v1/worker",), missing_areas=(), files=1,
                    sites=tuple(sites), unreadable=())
    ran = ScenarioRun("s", "ran", ran=frozenset({sites[1].key}))
    res = CoverageResult(census, [ran], {s.key: classify(s, RULES) for s in sites},
                         {s.key: why(s, RULES) for s in sites})
    summary = res.summary()
    assert summary["single_node_sites"] == 3 and summary["single_node_ran"] == 1
    assert all(classify(s, RULES) not in OFF_NODE for s in sites)
    assert summary["not_run_by_rule"] == {
        f"{CONFIG}: pooling models, encoders and multimodal inputs": 1,
        f"{CONFIG}: several GPUs: pipeline parallel": 1}
    rows = {s["line"]: s for s in res.to_json()["sites"]}
    assert rows[2]["why"] is None and "pipeline parallel" in rows[3]["why"]
