"""The EAGLE v2 slice's three forwards as graph replays (``targets/sglang/slices/eagle_graphs.py``):
upstream's ``draft_forward`` captured and replayed, the draft extend and the verify too;
the replays compute exactly what the eager forwards do; the race detector sees the
reads inside a replay."""
import collections
import dataclasses

import pytest

import targets
from harness.policies import parse_policy
from seams.faults.plan import FaultPlan
from harness.runtime import open_runtime
from harness.trials.drive import drive, server_args
from scenarios.eagle import EAGLE_V2
from scenarios.resolve import run_scenario


pytestmark = pytest.mark.usefixtures("sglang")


def _run(backend, variant, graphs: bool, monkeypatch=None):
    """Output and accept lengths of one eager-policy run; with ``monkeypatch``, also how
    often each graph runner ran."""
    from targets.sglang.slices import eagle_graphs as g
    calls = collections.Counter()
    if monkeypatch is not None:
        for cls, name in ((g.ToyDraftGraphs, "execute"), (g.ToyDraftExtendGraphs, "execute"),
                          (g.ToyVerifyGraphs, "replay")):
            def counted(self, *a, _f=getattr(cls, name), _n=cls.__name__, **kw):
                calls[_n] += 1
                return _f(self, *a, **kw)
            monkeypatch.setattr(cls, name, counted)
    wl = EAGLE_V2.workload(0)
    args = dataclasses.replace(server_args(wl, EAGLE_V2.variants[variant].args, targets.get("sglang")), cuda_graph=graphs)
    accepts, decodes = [], []
    plan = FaultPlan(observer=lambda name, v: (
        accepts.append(v["accept_len"]) if name == "result" else None,
        decodes.append(1) if name == "seq_lens" else None))
    with open_runtime(backend, parse_policy("eager")) as rt:
        out = drive(rt, wl, args, plan, target=targets.get("sglang"))
    return out, accepts, len(decodes), calls


@pytest.mark.parametrize("variant", ["fixed", "topk2", "eagle3", "plan-stream"])
def test_every_decode_step_replays_the_draft_the_verify_and_the_draft_extend(
        variant, specrace_backend, monkeypatch):
    if specrace_backend == "cpu":
        pytest.skip("the plain CPU backend captures no graphs")
    _, _, decodes, calls = _run(specrace_backend, variant, True, monkeypatch)
    assert decodes > 0
    # every decode launch fits the captured buckets: each forward of it is a replay
    assert calls == {"ToyDraftGraphs": decodes, "ToyVerifyGraphs": decodes,
                     "ToyDraftExtendGraphs": decodes}, (calls, decodes)


@pytest.mark.parametrize("variant", ["fixed", "topk2", "eagle3"])
def test_the_replays_compute_what_the_eager_forwards_do(variant, specrace_backend):
    """Same output and the same accept length at every launch: the graphs' static
    inputs are loaded with the batch's draft state, slots, rows and positions, and
    their outputs are read for this batch's rows only."""
    if specrace_backend == "cpu":
        pytest.skip("the plain CPU backend captures no graphs")
    eager_out, eager_accepts, _, _ = _run(specrace_backend, variant, False)
    graph_out, graph_accepts, _, _ = _run(specrace_backend, variant, True)
    assert graph_out == eager_out
    assert graph_accepts == eager_accepts
    D = EAGLE_V2.workload(0).draft_token_num
    assert D in graph_accepts and any(1 < n < D for n in graph_accepts)  # the draft varies


def test_the_detector_sees_the_reads_inside_a_replayed_draft_graph():
    """Without the WAR barrier the schedule stream's row writes race reads that happen
    inside a replay -- reported at the capture site and the replay site."""
    r = run_scenario("eagle-v2", variant="no-war-barrier", war_barrier="fine",
                     backend="sim", policy=parse_policy("eager"), trials=1, target="sglang")
    assert r["outcome"] == "race"
    replayed = [x["summary"] for x in r["races"] if "replayed at" in x["summary"]]
    # (which row write a replayed read pairs with first -- upstream's pool write or the
    # toy's row assignment -- depends on the host's syncs, not on what is checked here)
    assert any("eagle_graphs.py" in s and "is unordered with schedule" in s
               and "memory_pool.py:406" in s for s in replayed), \
        [x["summary"] for x in r["races"]]
