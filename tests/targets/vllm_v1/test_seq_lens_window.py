"""The seq-lens race's window and vLLM's releases from 0.13.0 (issue 58, items 1 and 4).

In the core environment: the scenario stalls the previous step's drafter (the window
upstream has, ``vllm.previous_drafter_running``), the start-of-``execute_model`` stall is
kept only as the declared amplifier, async scheduling is an axis of the scenario, and
the pieces that carry 0.13.0 (its kernel's five-argument launch, the numba placeholder)
do what they say. In a release's own environment (a child ``specrace repro --json``, as
``specrace releases`` runs one; skipped where the release is not set up): the race as
shipped where the release ships it, clean with the fix, and what a sync-mode user of
0.13.0 has. One trial each, seed 0: the simulator gives the same verdict every time.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from scenarios.registry import get
from seams import children
from seams.faults import FAULT_POINTS
from seams.paths import REPO_ROOT

SCENARIO = "vllm-seq-lens-shadow"
PAIR = ("vllm/v1/utils.py", "copy_to_gpu")  # the upload's side of the pair, every release


# --- the scenario, in the core environment --------------------------------------------

def test_the_scenario_stalls_the_previous_drafter_and_keeps_the_old_stall_as_an_amplifier():
    sc, amp = get(SCENARIO), get(f"{SCENARIO}-amplified")
    assert [s.point for s in sc.stalls(None)] == ["vllm.previous_drafter_running"]
    # held until upstream's own next sync forces it (a timed simulator stall is counted
    # from when it is queued, and the host's wait for the step before would use it up)
    assert [s.ms for s in sc.stalls(None)] == [None]
    assert [s.point for s in amp.stalls(None)] == ["vllm.before_execute"]
    assert "amplifier" in FAULT_POINTS["vllm.before_execute"]
    assert "previous step's drafter" in FAULT_POINTS["vllm.previous_drafter_running"]
    assert "amplifier" in amp.summary


def test_async_scheduling_is_an_axis_of_the_scenario():
    variants = get(SCENARIO).variants
    shipped = {n for n, v in variants.items() if v.args.get("vllm_async_default")}
    on = {n for n, v in variants.items()
          if v.args.get("overlap", True) and not v.args.get("vllm_async_default")}
    off = {n for n, v in variants.items() if v.args.get("overlap") is False}
    assert shipped == {"as-installed", "hybrid", "fixed", "hybrid-fixed", "fixed-0.13",
                       "hybrid-fixed-0.13", "dense", "dense-fixed"}  # (two aliases)
    assert variants["dense"].args == variants["as-installed"].args
    assert on == {"async", "async-hybrid", "async-fixed", "async-fixed-0.13"}
    assert off == {n for n in variants if n.startswith("sync")}
    # the model: dense (attention that reads seq_lens on the device), "hybrid" the other
    assert not variants["as-installed"].args["hybrid"] and variants["hybrid"].args["hybrid"]
    # each fix is the same increment made out of place, in the class each release has it
    assert variants["async-fixed"].fix == variants["fixed"].fix == \
        "drafter-increments-out-of-place"
    assert variants["async-fixed-0.13"].fix == "drafter-increments-out-of-place-0.13"
    from mutations.vllm import FIXES
    early, late = FIXES["drafter-increments-out-of-place-0.13"], \
        FIXES["drafter-increments-out-of-place"]
    assert early.edits == late.edits and early.target.endswith(":EagleProposer.propose")


def test_the_amplified_scenario_is_sessions_16_to_20s():
    """The committed reports of those sessions replay under it: the short workload, the
    hybrid model by default, no step budget."""
    from scenarios.vllm import _workload
    amp = get(f"{SCENARIO}-amplified")
    assert all(amp.workload(seed).to_json() == _workload(3)(seed).to_json()
               for seed in range(4))
    assert all("chunked_prefill_size" not in v.args for v in amp.variants.values())
    assert "hybrid" not in amp.variants["as-installed"].args
    assert amp.variants["sync"].args == {"overlap": False}


@pytest.mark.parametrize("seed", range(8))
def test_the_workload_prefills_a_long_prompt_alone_in_chunks(seed):
    """The steps where the drafter increments the shadow (no request with drafts to
    verify, from 0.14.0) each right after a step whose drafter ran: request 0's prompt
    takes several chunks before anything else arrives."""
    from scenarios.vllm import SEQ_LENS_CHUNK
    wl = get(SCENARIO).workload(seed)
    first, rest = wl.requests[0], wl.requests[1:]
    assert first.rid == 0 and first.arrive == 0 and len(first.prompt) >= 40
    assert all(r.arrive >= 2 for r in rest)
    assert wl.draft_token_num == 3  # two proposed tokens: the drafter's loop runs
    assert all(v.args.get("chunked_prefill_size") == SEQ_LENS_CHUNK
               for v in get(SCENARIO).variants.values())


def test_0_13_0s_kernel_launch_of_five_arguments_samples_as_the_later_one():
    """0.13.0's ``eagle_prepare_inputs_padded_kernel`` has no rejected-count output: its
    launch passes ``num_reqs`` fifth; the stand-in writes the same sample indices."""
    from targets.vllm.engine.kernels import eagle_prepare_inputs_padded
    cu = torch.tensor([2, 2, 4], dtype=torch.int32)  # drafts 2, 0, 2
    valid = torch.tensor([1, 1, 3], dtype=torch.int32)
    qsl = torch.tensor([0, 3, 4, 7], dtype=torch.int32)
    later, rejected = torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)
    eagle_prepare_inputs_padded((3,), cu, valid, qsl, later, rejected, 3)
    early = torch.zeros(3, dtype=torch.int32)
    eagle_prepare_inputs_padded((3,), cu, valid, qsl, early, 3)
    assert early.tolist() == later.tolist() == [0, 3, 6]
    assert rejected.tolist() == [2, 0, 0]


def test_the_numba_placeholder_stands_only_for_an_absent_numba_and_refuses_to_run():
    script = (
        "import importlib.util, sys\n"
        "real = importlib.util.find_spec('numba') is not None\n"
        "from targets.vllm.engine import absent\n"
        "absent.install()\n"
        "import numba\n"
        "if real:\n"
        "    assert not getattr(numba, '__specrace_placeholder__', False); print('real')\n"
        "    raise SystemExit(0)\n"
        "@numba.njit(parallel=True)\n"
        "def f(x):\n"
        "    return x\n"
        "try:\n"
        "    f(1)\n"
        "except RuntimeError as e:\n"
        "    assert 'n-gram proposer cannot run' in str(e), e\n"
        "    print('refused')\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": REPO_ROOT},
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() in ("refused", "real")


# --- in the releases' own environments --------------------------------------------------

def _python(version: str):
    from targets.vllm.environments import LINE
    return LINE.env_python(version) if version in LINE.installed() else None


def _repro(version: str, variant: str) -> dict:
    """One trial of the scenario in ``version``'s environment: its JSON result."""
    python = _python(version)
    if python is None:
        pytest.skip(f"vllm {version} is not set up here (make upstream TARGET=vllm "
                    f"VLLM={version})")
    cmd = children.command(python, "-m", "specrace.cli", "repro", SCENARIO, "--target",
                           "vllm", "--variant", variant, "--trials", "1", "--seed", "0",
                           "--json", "--no-report")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                          env=children.env(hop=version, PYTHONUNBUFFERED="1"))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stderr[-2000:]
    return json.loads(lines[-1])


def _pairs(res: dict):
    return [json.dumps(r) for r in res.get("races", [])]


def _wrong_tokens(res: dict) -> bool:
    first = res.get("first_divergence") or {}
    return "diverges" in (first.get("message") or "")


def _the_seq_lens_pair(res: dict) -> bool:
    """The pair: the upload of the pinned seq_lens buffer vs the drafter's in-place
    increment (eagle.py up to 0.18.x)."""
    return any(PAIR[0] in p and "spec_decode/eagle.py" in p and "propose" in p
               for p in _pairs(res))


@pytest.mark.parametrize("version", ["0.17.0", "0.14.0", "0.18.1"])
def test_the_previous_drafter_window_shows_the_race_as_shipped_with_wrong_tokens(version):
    """Async scheduling is on by default with EAGLE-family drafting from 0.14.0: as
    shipped the drafter's increment meets the upload the previous drafter holds back,
    and the target's first token after the chunked prompt is wrong."""
    res = _repro(version, "as-installed")
    assert res["outcome"] == "race" and _the_seq_lens_pair(res), res.get("races")
    assert _wrong_tokens(res), res.get("first_divergence")


@pytest.mark.parametrize("version, variant", [("0.17.0", "fixed"),
                                              ("0.13.0", "async-fixed-0.13")])
def test_the_fix_is_clean_under_the_same_window(version, variant):
    res = _repro(version, variant)
    assert res["outcome"] == "clean", res.get("races")


def test_0_13_0_races_with_async_scheduling_on_and_not_visibly_as_shipped():
    """0.13.0 made the increment in place (eagle.py:456; 0.12.0's was out of place) with
    async scheduling an opt-in: on, the race with wrong tokens; as shipped (sync), the
    same unordered pair -- upstream drains the main stream at each step's end
    (_bookkeeping_sync), so the upload has run before the drafter writes: no token
    changes."""
    on = _repro("0.13.0", "async")
    assert on["outcome"] == "race" and _the_seq_lens_pair(on) and _wrong_tokens(on), on
    shipped = _repro("0.13.0", "as-installed")
    assert shipped["outcome"] == "race" and _the_seq_lens_pair(shipped), shipped
    assert not _wrong_tokens(shipped), shipped.get("first_divergence")


def test_0_19_0_has_no_seq_lens_pair_as_shipped():
    """0.19.0 computes seq_lens on the device and hands the drafter no CPU shadow under
    async spec decode (#32951): the pair is gone."""
    res = _repro("0.19.0", "as-installed")
    assert not _the_seq_lens_pair(res), res.get("races")
    assert not _wrong_tokens(res), res.get("first_divergence")
