"""No verdict about code upstream does not ship: the vLLM draft-token slice stands in for
upstream's speculator with one that hands ``DraftTokensHandler.set_draft_tokens`` a fresh
temporary, so it reports on a release only where upstream's does too -- 0.16.0-0.19.1
(one speculative token: ``gumbel_sample``'s output) and 0.24.0 on (a gather at the call
site) -- and is *not driven*, the reason named, where upstream hands over a persistent
buffer (0.20.0-0.23.0: ``self.draft_tokens[:num_reqs, :1]``).

Read from source (``targets/vllm/boundary/handover.py``): synthetic runners and
speculators of each shape (no vLLM needed), then every release set up here."""
from __future__ import annotations

import os
import textwrap

import pytest

from targets.vllm.boundary import contract, handover

CALL_SITE = """
class GPUModelRunner:
    def sample_tokens(self, input_batch):
        if self.speculator is not None:
            draft_tokens = self.speculator.propose(input_batch, self.hidden)
            self.req_states.draft_tokens[input_batch.idx_mapping] = draft_tokens
            self.draft_tokens_handler.set_draft_tokens(input_batch, draft_tokens)
"""
GATHER_SITE = """
class GPUModelRunner:
    def sample_tokens(self, input_batch, num_spec_tokens):
        draft_tokens = self.speculator.propose(input_batch)
        draft_tokens = self.req_states.draft_tokens[input_batch.idx_mapping]
        self.draft_tokens_handler.set_draft_tokens(
            input_batch, draft_tokens[:, :num_spec_tokens])
"""
# 0.17.0-0.19.1: the one-token early exit hands over gumbel_sample's fresh output
TEMPORARY_K1 = """
class EagleSpeculator:
    def propose(self, input_batch, hidden):
        draft_tokens = gumbel_sample(hidden, self.temperature)
        if self.num_speculative_steps == 1:
            return draft_tokens.view(-1, 1)
        self.draft_tokens[:, 0] = draft_tokens
        return self.draft_tokens[:input_batch.num_reqs]
"""
# 0.20.0-0.23.0: every path hands over the speculator's own buffer
PERSISTENT = """
class AutoRegressiveSpeculator:
    def propose(self, input_batch, hidden):
        num_reqs = input_batch.num_reqs
        self._prefill(num_reqs)
        if self.num_speculative_steps == 1:
            return self.draft_tokens[:num_reqs, :1]
        self._multi_step_decode(num_reqs)
        return self.draft_tokens[:num_reqs]
"""
ABSTRACT = """
class Speculator:
    def propose(self, input_batch, hidden):
        raise NotImplementedError
"""
UNREADABLE = """
class Speculator:
    def propose(self, input_batch, hidden):
        return input_batch
"""


def _tree(tmp_path, runner, speculators):
    root = tmp_path / "vllm"
    gpu = root / "v1" / "worker" / "gpu"
    (gpu / "spec_decode" / "eagle").mkdir(parents=True)
    (gpu / "model_runner.py").write_text(textwrap.dedent(runner))
    for i, text in enumerate(speculators):
        (gpu / "spec_decode" / "eagle" / f"speculator{i}.py").write_text(text)
    return str(root)


@pytest.mark.parametrize("runner, speculators, kind", [
    (CALL_SITE, [ABSTRACT, TEMPORARY_K1], handover.TEMPORARY),
    (CALL_SITE, [ABSTRACT, PERSISTENT], handover.PERSISTENT),
    (GATHER_SITE, [ABSTRACT, PERSISTENT], handover.TEMPORARY),
    (CALL_SITE, [UNREADABLE], handover.UNKNOWN),
    ("class GPUModelRunner:\n    pass\n", [TEMPORARY_K1], handover.UNKNOWN),
])
def test_the_hand_over_is_read_from_source(tmp_path, runner, speculators, kind):
    root = _tree(tmp_path, runner, speculators)
    assert handover.hand_over(root)[0] == kind
    assert (handover.problem(root) == "") == (kind == handover.TEMPORARY)


def test_a_persistent_hand_over_is_named_where_it_is(tmp_path):
    root = _tree(tmp_path, CALL_SITE, [PERSISTENT])
    says = handover.problem(root)
    assert "persistent buffer" in says and "speculator0.py:7" in says
    assert "self.draft_tokens[:num_reqs, :1]" in says


def _releases():
    from targets.vllm.environments import LINE
    return [(v, LINE.release_root(v)) for v in LINE.installed()]


@pytest.mark.parametrize("version, root", _releases() or [pytest.param(
    None, None, marks=pytest.mark.skip(reason="no vLLM release is set up here "
                                              "(make upstream TARGET=vllm VLLM=0.17.0)"))])
def test_the_slice_runs_only_where_upstream_hands_over_a_temporary(version, root):
    """Each release set up here: 0.16.0-0.19.x and 0.24.0 on are driven, 0.20.0-0.23.x
    not driven (the reason named), a release without the handler not applicable."""
    from packaging.version import Version

    from targets.vllm.environments import VllmEnvironments
    envs = VllmEnvironments()
    if envs.not_applicable(version, "vllm-draft-tokens"):
        pytest.skip(f"vllm {version} has no draft-token handler")
    why = envs.not_driven(version, "vllm-draft-tokens")
    persistent = Version("0.20.0") <= Version(version) < Version("0.24.0")
    assert ("persistent buffer" in why) == persistent, why
    assert bool(contract.check_slices(root)) == persistent


def test_the_release_table_never_runs_the_slice_where_it_is_not_driven(tmp_path):
    """``specrace releases``: such a release is a ``not driven`` row, no child run."""
    from targets import releases
    from targets.vllm.environments import VllmEnvironments
    versions = [v for v, _ in _releases()
                if VllmEnvironments().not_driven(v, "vllm-draft-tokens")]
    if not versions:
        pytest.skip("no vLLM release of 0.20.0-0.23.x is set up here")
    row = releases.run_release(VllmEnvironments(), "vllm", versions[0], "vllm-draft-tokens",
                               [], str(tmp_path))
    assert row["outcome"] == "not driven" and "persistent buffer" in row["note"], row
    assert not os.path.exists(tmp_path / versions[0])  # no report: nothing ran
