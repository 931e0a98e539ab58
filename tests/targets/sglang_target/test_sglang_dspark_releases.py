"""The DSpark and EAGLE v2 slices on the other releases set up here
(``.releases/sglang/<V>``), each run in its own environment: where the release has a way
to make a run's server config current (``contract.SERVER_CONFIG_WAYS``, read from its
source) DSpark's upstream relay, planner and readback are driven and race as the
findings say, and the ring's fix is clean; where a slice is not driven,
``contract.undriven`` names the piece the release lacks. The installed release's own
checks: test_sglang_dspark.py, test_sglang_eagle.py."""
from __future__ import annotations

import json
import subprocess

import pytest

from seams import children
from targets.sglang.boundary import contract
from targets.sglang.environments import LINE, SglangEnvironments

# What each release lacks of what each slice needs, as measured (None: driven). 0.5.15 -
# 0.5.18 make the config current by the scheduler's publish shim, 0.5.19 - 0.5.21 by
# snapshot / reset / restore_context, 0.5.22 by use_context, and 0.5.14 -- with no runtime
# context to reset -- by the publish shim's module global, saved and put back; EAGLE v2's
# kernel stand-ins bind where 0.5.14 - 0.5.22 launch the Triton kernels
# (test_sglang_eagle_releases.py), and its toy runners build a KV index translator only
# where the release's runner does (0.5.19 on): 0.5.15 - 0.5.18's code reads none.
# DSpark ships from 0.5.16.
UNDRIVEN = {"0.5.14": {"eagle_v2": None}, "0.5.15": {"eagle_v2": None},
            **{f"0.5.{n}": {"dspark": None, "eagle_v2": None} for n in range(16, 23)}}
WAY = {"0.5.14": "module_global", **{f"0.5.{n}": "publish" for n in (15, 16, 17, 18)},
       **{f"0.5.{n}": "snapshot_context" for n in (19, 20, 21)}, "0.5.22": "use_context"}
SCENARIOS = {"dspark": ("dspark-confidence-ring", "dspark-result-readback"),
             "eagle_v2": ("eagle-v2", "eagle-v2-grammar")}
# one release of each way of making the config current, and of each fence (0.5.16's
# coarse, 0.5.18's fine), that drives DSpark's upstream code
NEWLY_DRIVEN = ("0.5.19", "0.5.18", "0.5.16")


@pytest.mark.parametrize("version", sorted(UNDRIVEN))
def test_each_release_drives_each_slice_or_names_what_it_lacks(version):
    """Read statically: the slice's needs, the release's server-config way, and the row
    ``specrace releases`` writes for each of the slice's scenarios ("not driven", the
    piece named; never "not applicable": the code is there)."""
    if version not in LINE.installed():
        pytest.skip(f"sglang {version} is not set up here")
    root = LINE.release_root(version)
    assert contract.server_config_way(root) == WAY[version]
    envs = SglangEnvironments()
    for feature, lacks in UNDRIVEN[version].items():
        assert contract.missing_code(root, feature) is None  # the code is there
        assert contract.undriven(root, feature) == lacks, feature
        for scenario in SCENARIOS[feature]:
            assert envs.not_applicable(version, scenario) == ""
            why = envs.not_driven(version, scenario)
            assert (why == "") if lacks is None else (lacks.replace(":", ".") in why), why


_CHILD = r"""
import json
import targets
targets.get("sglang")  # the stand-ins in place before sglang is imported
from harness.policies import parse_policy
from harness.runtime.trace import OpRecord
from scenarios.registry import get
from scenarios.resolve import run_scenario_result
from scenarios.sglang_relay import POLICIES
from sglang.srt import runtime_context as rc
def run(scenario, variant, policy="eager"):
    return run_scenario_result(scenario, target="sglang", variant=variant, backend="sim",
                               trials=1, policy=parse_policy(policy))
def verdict(r):
    j = r.to_json()
    return {"outcome": j["outcome"], "divergence": j["first_divergence"],
            "schedules": j.get("schedules"), "sites": [x["summary"] for x in j["races"]]}
def config_left():  # a server config current in the process's context
    try:
        return rc.get_context().server_args is not None
    except ValueError:  # "Global server args is not set yet!"
        return False
before = config_left()
a, b = run("dspark-confidence-ring", "as-installed"), run("dspark-confidence-ring", "as-installed")
r1, r2 = (verdict(run("dspark-confidence-ring", "as-installed", "random(1)")) for _ in "ab")
fix = get("dspark-result-readback").variants["fixed"]
print(json.dumps({
    "ring": verdict(a),
    "identical": [repr(r) for r in a.trace.records] == [repr(r) for r in b.trace.records],
    "ops": sum(isinstance(r, OpRecord) for r in a.trace.records),
    "same_seed_same_verdict": r1 == r2,
    "ring_fixed": {p: verdict(run("dspark-confidence-ring", "fixed", p))["outcome"]
                   for p in POLICIES},
    "readback": verdict(run("dspark-result-readback", "as-installed")),
    "eager_accept": verdict(run("dspark-result-readback", "eager-accept")),
    "readback_fix_fits": targets.get("sglang").variant_problem(fix),
    "readback_fixed": {p: verdict(run("dspark-result-readback", "fixed", p))["outcome"]
                       for p in POLICIES},
    "config_left": (before, config_left())}))
"""


@pytest.mark.long
@pytest.mark.parametrize("version", NEWLY_DRIVEN)
def test_dspark_races_as_installed_and_the_ring_fix_is_clean(version):
    """In the release's own environment (DSpark's server config made current by the
    release's way): the ring copy races the next scatter (one site, upstream's
    ``issue_ring_copy`` vs ``scatter``) and the fenced ring is clean under every policy;
    the folded result readback races the next graph replay (three graph-owned buffers)
    and the eager accept is clean; two runs in one process give the same trace, the same
    seed the same verdict; no run leaves its server config current behind it. The
    readback's fix (the next forward waits for the result copies) fits these releases'
    ``run_batch`` (by its second alternative, ``FirstFitting``) and is clean under every
    policy."""
    if version not in LINE.installed() or version == contract.installed_version():
        pytest.skip(f"sglang {version} is not set up here, or is the installed one")
    proc = subprocess.run(children.command(LINE.env_python(version), "-c", _CHILD),
                          env=children.env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    ring = got["ring"]
    assert ring["outcome"] == "race" and len(ring["sites"]) == 1, ring
    assert "issue_ring_copy" in ring["sites"][0] and "scatter" in ring["sites"][0]
    assert ring["divergence"]["kind"] == "confidence"
    assert got["identical"] and got["ops"] > 0 and got["same_seed_same_verdict"]
    assert set(got["ring_fixed"].values()) == {"clean"}, got["ring_fixed"]  # every policy
    readback = got["readback"]
    assert readback["outcome"] == "race" and len(readback["sites"]) == 3, readback
    assert all("async_d2h" in s and "replayed at" in s for s in readback["sites"])
    assert got["eager_accept"]["outcome"] == "clean", got["eager_accept"]
    assert got["readback_fix_fits"] == ""
    assert set(got["readback_fixed"].values()) == {"clean"}, got["readback_fixed"]
    assert got["config_left"] == [False, False]  # the runs left none behind
