"""Upstream's ``ModelRunner`` and ``DecodeCudaGraphRunner`` under the NGRAM worker on the
other releases set up here (``.releases/sglang/<V>``), each run in its own environment:
where ``runner.build.fits`` reads the release's source as drivable, the trace has the
runner's sites and its graph replays and the verdicts are the findings'; where not,
``contract.undriven`` names what the release lacks (the run keeps the toy forward).
The installed release's own checks: test_sglang_model_runner.py."""
from __future__ import annotations

import json
import subprocess

import pytest

from seams import children
from targets.sglang.boundary import contract
from targets.sglang.environments import LINE
from targets.sglang.runner import build
from tests.targets.sglang_target.test_contract_edits import shadow
from tests.targets.sglang_target.test_sglang_model_runner import GRAPH_REPLAY, RUNNER_SITES

RC = "sglang.srt.runtime_context"
# What each release lacks of what the runner room needs, as measured (None: driven).
# 0.5.19 and 0.5.20 make their config current as 0.5.21 does (snapshot_context); their
# parallel context reads the ranks and groups through parallel_state's getters, so the
# one-rank groups go where initialize_model_parallel puts them (contract.RANK_WAYS)
# 0.5.15 - 0.5.18 publish it by the scheduler's shim and keep the ranks in
# parallel_state's globals (0.5.15's ParallelState without its trivial factory), and
# 0.5.15's runner lacks the init steps the runner room calls
UNDRIVEN = {
    **{v: "sglang.srt.model_executor.model_runner:ModelRunner.init_spec_aux_hidden_state"
       for v in ("0.5.14", "0.5.15")},
    **{f"0.5.{n}": None for n in range(16, 23)},
}
# How each driven release keeps a one-rank server's ranks and groups, and what it lacks
# of the other way (0.5.19: the context's override_permanently too)
RANK_WAY = {**{f"0.5.{n}": ("parallel_state_globals",
                             f"{RC}:ParallelContext.override_permanently")
               for n in (16, 17, 18, 19)},
            "0.5.20": ("parallel_state_globals", f"{RC}:ParallelContext.clear_stamp"),
            "0.5.21": ("context_stamp", None), "0.5.22": ("context_stamp", None)}


def _others():
    mine = contract.installed_version()
    return [v for v in LINE.installed() if v != mine]


@pytest.mark.parametrize("version", sorted(UNDRIVEN))
def test_each_release_is_driven_or_names_what_it_lacks(version):
    if version not in LINE.installed():
        pytest.skip(f"sglang {version} is not set up here")
    root = LINE.release_root(version)
    assert contract.undriven(root, "model_runner") == UNDRIVEN[version]
    assert build.fits(root) == (UNDRIVEN[version] is None)
    if version in RANK_WAY:
        way, lacks = RANK_WAY[version]
        assert contract.server_config_way(root, contract.RANK_WAYS) == way
        stamp = dict(contract.RANK_WAYS)["context_stamp"]
        assert contract._first_absent(root, stamp) == lacks


def test_a_release_with_neither_way_of_keeping_ranks_names_what_it_lacks(tmp_path):
    """The installed release without the context's stamp has neither way (its source has
    no ``ParallelState`` either): not driven, the first way's missing piece named."""
    from targets import static
    neither = shadow(tmp_path, "srt/runtime_context.py", lambda t: t.replace(
        "def clear_stamp(", "def clear_stamp_v0("))
    assert contract.server_config_way(neither, contract.RANK_WAYS) is None
    assert contract.undriven(neither, "model_runner") == f"{RC}:ParallelContext.clear_stamp"
    assert static.package_root("sglang") != neither


def test_the_server_config_is_made_current_by_whichever_way_the_source_has(tmp_path):
    """``use_context`` where the release has it; else the process context snapshotted,
    reset and restored; else reset and published by the scheduler's shim; a release
    with none of them is not driven, the first way named."""
    from targets import static
    root = static.package_root("sglang")
    assert contract.server_config_way(root) == "use_context"
    rel = "srt/runtime_context.py"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    older = shadow(tmp_path / "a", rel,
                   lambda t: t.replace("def use_context(", "def use_context_v0("))
    assert contract.server_config_way(older) == "snapshot_context"
    assert contract.undriven(older, "model_runner") is None
    neither = shadow(tmp_path / "b", rel, lambda t: t.replace(
        "def use_context(", "def use_context_v0(").replace(
        "def snapshot_context(", "def snapshot_context_v0("))
    assert contract.server_config_way(neither) == "publish"  # the scheduler's shim
    assert contract.undriven(neither, "model_runner") is None
    (tmp_path / "c").mkdir()
    none = shadow(tmp_path / "c", rel, lambda t: t.replace(
        "def use_context(", "def use_context_v0(").replace(
        "def snapshot_context(", "def snapshot_context_v0(").replace(
        "def reset_context(", "def reset_context_v0("))
    assert contract.server_config_way(none) is None
    assert contract.undriven(none, "model_runner") == f"{RC}:use_context"


_CHILD = r"""
import json, os
import targets
targets.get("sglang")
from harness.policies import parse_policy
from harness.runtime.trace import OpRecord, ReplayedOp
from scenarios.resolve import run_scenario_result
SEP = "sglang" + os.sep + "srt" + os.sep
def srt(frame):
    return frame[0].split(SEP, 1)[1] if frame and SEP in frame[0] else None
def run(scenario, variant, **kw):
    return run_scenario_result(scenario, target="sglang", variant=variant, backend="sim",
                               trials=1, policy=parse_policy("eager"), **kw)
def seed_race():
    # the pre-#35198 relay: patched in where the release has the fix, as shipped (under
    # the fine fence, which their forward never engages) where the release has it
    from scenarios.registry import get
    pre_fix = get("ngram-filter-race").variants["pre-fix"]
    if targets.get("sglang").variant_problem(pre_fix):
        return run("ngram-filter-race", "as-installed", war_barrier="fine").outcome
    return run("ngram-filter-race", "pre-fix").outcome
a, b = run("ngram-filter-race", "as-installed"), run("ngram-filter-race", "as-installed")
print(json.dumps({
    "clean": a.outcome,
    "identical": [repr(r) for r in a.trace.records] == [repr(r) for r in b.trace.records],
    "sites": sorted({f"{srt(r.frame)}:{r.frame[2]}" for r in a.trace.records
                     if isinstance(r, OpRecord) and srt(r.frame)}),
    "replays": sorted({str(srt(r.replay.frame)) for r in a.trace.records
                       if isinstance(r, ReplayedOp)}),
    "pre_fix": seed_race(),
    "readback": run("ngram-hidden-readback", "as-installed").outcome}))
"""


@pytest.mark.parametrize("version", [v for v, why in sorted(UNDRIVEN.items()) if why is None])
def test_a_driven_release_runs_upstreams_runner_and_keeps_its_verdicts(version):
    """In the release's own environment: the seed scenario's trace has the runner's sites
    (the eager runner's input copy, the graph runner's capture, the KV pool's write) and
    every verify replayed by upstream's full-graph backend; two runs in one process give
    the same trace; the verdicts are the findings' (the released code clean, the pre-#35198
    relay -- patched in, or as 0.5.16-0.5.17 ship it under the fine fence -- and the
    hidden-states readback racing)."""
    if version not in _others():
        pytest.skip(f"sglang {version} is not set up here, or is the installed one")
    proc = subprocess.run(children.command(LINE.env_python(version), "-c", _CHILD),
                          env=children.env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    sites = {tuple(s.rsplit(":", 1)) for s in got["sites"]}
    assert RUNNER_SITES <= sites, RUNNER_SITES - sites
    assert got["replays"] == [GRAPH_REPLAY]
    assert got["identical"]
    assert (got["clean"], got["pre_fix"], got["readback"]) == ("clean", "race", "race")
