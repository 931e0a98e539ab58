"""Upstream's EAGLE v2 worker on the other releases set up here (``.releases/sglang/<V>``),
each run in its own environment: the slice binds its kernel stand-ins where that
release launches each kernel (``boundary/eagle_seams``: the launcher functions of 0.5.23,
the Triton kernel objects and the tree-build wrapper's platform kernel of 0.5.14-0.5.22,
the verify window's launcher of 0.5.15-0.5.20), the toy runners carry a KV index
translator only where the release's runner builds one (0.5.19 on), and the release's
worker drafts, verifies and extends clean, its own frames in the trace. The installed
release's checks: test_sglang_eagle.py; the static driven / not-driven table:
test_sglang_dspark_releases.py.
"""
from __future__ import annotations

import json
import subprocess

import pytest

from seams import children
from targets import static
from targets.sglang.boundary import contract, eagle_seams
from targets.sglang.environments import LINE
from targets.sglang.slices import eagle_runners

_EWC = "sglang.srt.speculative.eagle_worker_common"
_EU = "sglang.srt.speculative.eagle_utils"
_SU = "sglang.srt.speculative.spec_utils"
_CL = "sglang.kernels.ops.speculative.cache_locs"
# the seams each release's source gives the three kernels whose launch changed, as read
# (the rest are the same names on every release)
OLDER = (f"{_EWC}:assign_draft_cache_locs_contiguous", f"{_EU}:sgl_build_tree_kernel_efficient",
         f"{_SU}:assign_extend_cache_locs")
_TCL = "sglang.srt.speculative.triton_ops.cache_locs"
SEAMS = {
    "0.5.22": OLDER,
    "0.5.21": OLDER,
    **{f"0.5.{n}": (*OLDER, f"{_CL}:assign_extend_cache_locs_func") for n in range(16, 21)},
    # the kernels in their old module, two launched as kernel objects (eagle_launch)
    **{v: (f"{_TCL}:assign_draft_cache_locs_contiguous",
           f"{_EU}:sgl_build_tree_kernel_efficient",
           f"{_SU}:assign_extend_cache_locs", f"{_TCL}:assign_extend_cache_locs_func",
           "sglang.srt.speculative.eagle_worker_v2:fill_bonus_tokens",
           f"{_SU}:fill_accept_out_cache_loc") for v in ("0.5.14", "0.5.15")},
}
# does the release's ModelRunner build a KV index translator (init_kv_index_translator)?
TRANSLATOR = {f"0.5.{n}": n >= 19 for n in range(14, 24)}


@pytest.mark.parametrize("version", sorted(SEAMS))
def test_each_release_binds_the_seams_its_source_has(version):
    if version not in LINE.installed():
        pytest.skip(f"sglang {version} is not set up here")
    root = LINE.release_root(version)
    assert contract.undriven(root, "eagle_v2") is None
    chosen = eagle_seams.seams_in(root)
    assert set(SEAMS[version]) <= set(chosen), chosen
    # one seam per kernel, never a second way beside the first
    assert not {f"{_EWC}:assign_draft_cache_locs_contiguous_func",
                f"{_EU}:build_tree_kernel_efficient_func",
                f"{_SU}:fill_front_out_cache_loc_func"} & set(chosen)


@pytest.mark.parametrize("version", sorted(TRANSLATOR))
def test_the_toy_runner_builds_a_translator_where_the_releases_runner_does(version):
    """Read from the release's source, never its version: 0.5.16-0.5.18's runner builds
    no KV index translator (and their forward batch and EAGLE code read none), 0.5.19
    on builds one."""
    if version not in LINE.installed() and version != contract.installed_version():
        pytest.skip(f"sglang {version} is not set up here")
    root = LINE.release_root(version) or static.package_root("sglang")
    assert eagle_runners.builds_translator(root) is TRANSLATOR[version]


_CHILD = r"""
import importlib, json
import targets
targets.get("sglang")  # the stand-ins in place before sglang is imported
from harness.policies import parse_policy
from harness.runtime.trace import OpRecord
from scenarios.resolve import run_scenario_result
def run(variant):
    r = run_scenario_result("eagle-v2", target="sglang", variant=variant, backend="sim",
                            trials=1, policy=parse_policy("eager"))
    files = [r.frame[0] for r in r.trace.records if isinstance(r, OpRecord) and r.frame]
    j = r.to_json()
    return {"outcome": j["outcome"], "divergence": j["first_divergence"],
            "races": len(j["races"]),
            "upstream": sorted({"srt/" + f.rsplit("/sglang/srt/", 1)[1] for f in files
                                if "/sglang/srt/speculative/" in f}),
            "ours": sorted({(r.name, r.frame[2]) for r in r.trace.records
                            if isinstance(r, OpRecord) and r.frame
                            and "eagle_launch" in r.frame[0]})}
from sglang.srt import server_args as sa
before = getattr(sa, "_global_server_args", None)  # 0.5.14-0.5.18's scheduler global
out = {v: run(v) for v in ("as-installed", "topk2")}
# the run's config set for it and put back after it (0.5.14: the module global itself)
out["global_args_restored"] = getattr(sa, "_global_server_args", None) is before
from targets.sglang.slices import eagle_launch
bound = {}
for seam in SEAMS:
    module, _, name = seam.partition(":")
    bound[seam] = getattr(importlib.import_module(module), name, None) is eagle_launch.stand_in(name)
out["bound"] = bound
from targets.sglang.slices import eagle_runners
out["translator"] = eagle_runners.builds_translator()
print(json.dumps(out))
"""


@pytest.mark.long
@pytest.mark.parametrize("version", sorted(SEAMS))
def test_upstreams_eagle_worker_runs_clean_on_each_release(version):
    """In the release's own environment: a chain draft and a tree draft (topk 2, the
    accepted path's KV move) clean, with no stale value; the trace holds upstream's
    worker, verify and utility frames; the kernel-object stand-ins launched their ops
    (the draft's slots on both; the accepted path's target slots on the tree); each
    seam the release has bound to its stand-in."""
    if version not in LINE.installed() or version == contract.installed_version():
        pytest.skip(f"sglang {version} is not set up here, or is the installed one")
    code = f"SEAMS = {list(SEAMS[version])!r}\n" + _CHILD
    proc = subprocess.run(children.command(LINE.env_python(version), "-c", code),
                          env=children.env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # the worker's own modules (0.5.15's verify and draft helpers are its methods and
    # base_spec_worker's; eagle_worker_common starts in 0.5.16)
    common = not static.module_problem(LINE.release_root(version), _EWC)
    modules = {"srt/speculative/eagle_worker_v2.py", "srt/speculative/eagle_utils.py",
               "srt/speculative/eagle_worker_common.py" if common
               else "srt/speculative/base_spec_worker.py"}
    for variant in ("as-installed", "topk2"):
        run = got[variant]
        assert run["outcome"] == "clean" and run["divergence"] is None, run
        assert modules <= set(run["upstream"]), run["upstream"]
    assert ["assign_draft_cache_locs.default", "_draft_locs"] in got["as-installed"]["ours"]
    assert ["extend_cache_locs.default", "_extend_locs"] in got["topk2"]["ours"]
    if version in ("0.5.14", "0.5.15"):  # the bonus and the accepted path's slots, as kernels
        assert ["fill_bonus_tokens.default", "_bonus"] in got["as-installed"]["ours"]
        assert ["fill_accept_out_cache_loc.default", "_accept_locs"] in got["topk2"]["ours"]
    assert all(got["bound"].values()), got["bound"]
    assert got["global_args_restored"]
    # the runs went through the release's forward batch and EAGLE code with a translator
    # exactly where its runner has one (none on 0.5.16-0.5.18)
    assert got["translator"] is TRANSLATOR[version]
