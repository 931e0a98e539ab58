"""The configurations the vLLM target adds beyond each scenario as shipped (issue 58, item
3): Model Runner V2 with async scheduling off, structured outputs, chunked prefill and 1,
3 or 4 proposed tokens; V1 with structured-output requests. Each names the server flags
it stands for -- its own ``num_speculative_tokens``, not the workload's -- and what
``specrace coverage`` runs by default is every scenario plus the configurations that
reach census sites none of them does."""
from __future__ import annotations

import pytest

from scenarios.configurations import shipped
from scenarios.registry import get


@pytest.mark.parametrize("variant, tokens", [("spec1", 1), ("spec3", 3), ("spec4", 4),
                                             ("as-installed", 2), ("sync", 2)])
def test_an_mrv2_configuration_names_its_own_speculative_width(variant, tokens):
    confs = {c.variant: c.flags for c in shipped("vllm", get("vllm-mrv2"))}
    spec = [f for f in confs[variant] if f.startswith("--speculative-config")]
    assert spec == [f"--speculative-config num_speculative_tokens={tokens} "
                    f"(EAGLE: Model Runner V2's speculator)"], confs[variant]
    assert ("(async scheduling off: --no-async-scheduling)" in confs[variant]) == \
        (variant == "sync")


def test_the_v1_structured_configuration_is_shipped_code_with_structured_requests():
    confs = {c.variant: c.flags for c in shipped("vllm", get("vllm-v1-draft-copy"))}
    assert "(structured-output requests)" in confs["structured"]
    assert not any("presence_penalty" in f for f in confs["structured"])


def test_the_logprobs_configuration_asks_for_logprobs_and_prompt_logprobs():
    confs = {c.variant: c.flags for c in shipped("vllm", get("vllm-input-prep"))}
    assert "(requests with logprobs=1, prompt_logprobs=1)" in confs["logprobs"]
    assert not any("logprobs" in f for f in confs["as-installed"])


def test_coverage_runs_every_scenario_and_the_configurations_that_reach_more():
    from targets.vllm import COVERAGE_SET, SCENARIOS, VllmTarget
    assert VllmTarget().coverage_set == COVERAGE_SET
    assert COVERAGE_SET[:len(SCENARIOS)] == SCENARIOS
    for spec in COVERAGE_SET[len(SCENARIOS):]:
        name, _, variant = spec.partition(":")
        assert variant in get(name).variants, spec
