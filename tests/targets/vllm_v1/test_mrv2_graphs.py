"""Model Runner V2's CUDA graphs (``targets/vllm/engine/graphs.py``), in a vLLM release's
environment (skipped elsewhere): upstream's ``CudaGraphManager`` captures at start-up and
its replays issue the decode steps' forwards (the trace's replayed ops come from
``run_fullgraph``), none do with ``cuda_graph`` off, and the replays compute what the
eager forward does (the same tokens)."""
from __future__ import annotations

import importlib.util
import os

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed in this environment")

GPU = os.path.join("vllm", "v1", "worker", "gpu", "")
RUN_FULLGRAPH = os.path.join(GPU, "cudagraph_utils.py")


@pytest.fixture(scope="module")
def target():
    import targets
    from packaging.version import Version
    t = targets.get("vllm")
    if Version(t.version) < Version("0.17.0"):
        pytest.skip("Model Runner V2 is not driven on 0.16.0")
    return t


def _mrv2_run(target, graphs: bool):
    """vllm-mrv2's workload on MRv2 as shipped, eager schedule, no stall: (the tokens,
    the trace's records)."""
    from harness.policies import parse_policy
    from harness.runtime import open_runtime
    from harness.trials.drive import drive, server_args
    from scenarios.vllm import VLLM_MRV2
    from seams.faults.plan import FaultPlan
    wl = VLLM_MRV2.workload(0)
    args = server_args(wl, {**VLLM_MRV2.variants["as-installed"].args, "cuda_graph": graphs},
                       target)
    with open_runtime("sim", parse_policy("eager")) as rt:
        out = drive(rt, wl, args, FaultPlan(), target=target)
        return out, list(rt.trace.records)


def _replays(records):
    from harness.runtime.trace import ReplayedOp
    return [r for r in records if isinstance(r, ReplayedOp)]


def test_the_decode_steps_run_as_upstreams_graph_replays(target):
    out, records = _mrv2_run(target, graphs=True)
    replayed = _replays(records)
    assert replayed, "no op came from a graph replay"
    sites = {r.replay.frame[0] for r in replayed}
    # the target model's graphs (run_fullgraph) and, where the release has its own
    # manager (0.17.0: spec_decode/eagle/cudagraph.py), the speculator's: upstream's
    # graph managers, nothing else
    assert any(s.endswith(RUN_FULLGRAPH) for s in sites), sites
    assert all(GPU in s and "cudagraph" in os.path.basename(s) for s in sites), sites


def test_with_graphs_off_nothing_replays_and_the_tokens_are_the_same(target):
    on, _ = _mrv2_run(target, graphs=True)
    off, records = _mrv2_run(target, graphs=False)
    assert not _replays(records)
    assert on == off and any(len(toks) > 1 for toks in on.values())
