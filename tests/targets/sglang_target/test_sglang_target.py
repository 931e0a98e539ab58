"""The sglang target on the simulator: the seed race on upstream's real classes, the
released code clean under every policy, variants and mutations applied for one run and
reverted, and the version contract's one-line refusals."""
import inspect
import os
import pathlib
import subprocess
import sys

import pytest

import targets
from harness.policies import parse_policy
from seams.sourcepatch import PatchError, SourcePatch
from scenarios.resolve import run_scenario

POLICIES = ["eager", "lazy", "stall(forward)", "random(1)", "pct(2,3)"]


def test_prefix_reproduces_in_every_trial_with_upstream_frames(sglang):
    res = run_scenario("ngram-filter-race", target="sglang", variant="pre-fix",
                       war_barrier="fine", backend="sim", trials=4, expect="race")
    assert res["reproduced"] == res["trials"] == 4
    assert res["first_divergence"]["kind"] in ("accept_lens", "accept_tokens")
    readers = {r["second"]["file"] for r in res["races"]}
    # the schedule-stream gathers are upstream's own filter/merge, named sglang/...
    assert "sglang/srt/speculative/ngram_info.py" in readers, readers
    assert res["target_info"]["sglang_version"] == sglang.version


@pytest.mark.parametrize("policy", POLICIES)
def test_released_code_and_coarse_fence_are_clean(sglang, policy):
    for variant, fence in (("fixed", "fine"), ("pre-fix", "coarse")):
        res = run_scenario("ngram-filter-race", target="sglang", variant=variant,
                           war_barrier=fence, backend="sim", policy=parse_policy(policy),
                           trials=2)
        assert res["outcome"] == "clean", (variant, fence, res["first_divergence"],
                                           res["races"][:1])
        assert all(t["checked"] > 0 for t in res["trial_results"])  # values were judged


def test_variant_patches_are_reverted_after_the_run(sglang):
    from targets.sglang.boundary import upstream
    before = {n: inspect.getattr_static(upstream.NgramVerifyInput, n)
              for n in ("filter_batch", "merge_batch")}
    stash = inspect.getattr_static(upstream.FutureMap, "stash")
    run_scenario("ngram-filter-race", target="sglang", variant="pre-fix", backend="sim",
                 trials=1, expect="race")
    for n, f in before.items():
        assert inspect.getattr_static(upstream.NgramVerifyInput, n) is f
    assert inspect.getattr_static(upstream.FutureMap, "stash") is stash


def test_every_upstream_mutation_applies_and_reverts(sglang):
    muts = targets.get("sglang").mutations()
    assert len(muts) >= 12
    for m in muts:
        m.check()


def test_a_patch_that_no_longer_fits_is_a_harness_error(sglang):
    bad = SourcePatch("sglang.srt.managers.overlap_utils:FutureMap.stash",
                      (("this line is not in upstream", ""),), "stale patch")
    with pytest.raises(PatchError, match="occurs 0 times"):
        bad.check()


def test_the_simulator_is_sglangs_platform(sglang):
    """Without a GPU the simulator is sglang's platform (pinned staging, as on CUDA); on
    a GPU machine sglang's own CUDA platform stays in charge -- and answers the same."""
    import torch
    from sglang.srt.platforms import current_platform
    from sglang.srt.utils.common import is_pin_memory_available
    expected = "CudaSRTPlatform" if torch.cuda.is_available() else "SimSRTPlatform"
    assert type(current_platform).__name__ == expected
    assert is_pin_memory_available("sim") and not is_pin_memory_available("cpu")


def _fake_release(tmp_path):
    """A copy of the installed package's sources the contract reads (a fake release)."""
    import shutil
    from targets import static
    root = static.package_root("sglang")
    fake = tmp_path / "sglang"
    for sub in ("srt/managers", "srt/speculative", "srt/disaggregation", "srt/observability",
                "srt/multiplex", "srt/dllm"):
        if (pathlib.Path(root) / sub).exists():
            shutil.copytree(pathlib.Path(root) / sub, fake / sub)
    shutil.copy(pathlib.Path(root) / "srt/environ.py", fake / "srt/environ.py")
    from targets.sglang.boundary import contract
    for module in contract.DRIVEN_MODULES:  # every driven module must exist and parse
        src, dst = static.module_path(root, module), static.module_path(str(fake), module)
        if os.path.exists(src) and not os.path.exists(dst):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy(src, dst)
    return fake


def _evaluate(version, root):
    from targets.sglang.boundary import contract
    return contract.evaluate(version, str(root), contract.SCHEDULER_ATTRIBUTES,
                             contract.WORKER_KEYWORDS)


def test_a_main_checkout_with_unchanged_code_is_compatible(sglang, tmp_path):
    fake = _fake_release(tmp_path)
    v = _evaluate("0.5.24.dev3+gabc", fake)
    assert v.tier == "compatible" and v.problems == [], v.problems
    assert _evaluate("0.5.23.post1", fake).tier == "compatible"
    assert _evaluate("0.6.0", fake).tier == "unsupported"
    assert _evaluate("0.5.13", fake).tier == "unsupported"
    assert _evaluate("not-a-version", fake).tier == "unsupported"


def test_a_changed_signature_or_a_new_attribute_is_named(sglang, tmp_path):
    fake = _fake_release(tmp_path)
    sched = fake / "srt/managers/scheduler.py"
    text = sched.read_text()
    # the loop reads one more attribute of self
    assert text.count("        self.enable_skip_finishing_decode = True\n") == 1
    text = text.replace("        self.enable_skip_finishing_decode = True\n",
                        "        self.enable_skip_finishing_decode = self.brand_new_flag\n")
    # a method the target calls takes other parameters
    text = text.replace("    def is_disable_overlap_for_batch(\n        self, batch",
                        "    def is_disable_overlap_for_batch(\n        self, the_batch", 1)
    sched.write_text(text)
    utils = fake / "srt/managers/utils.py"
    utils.write_text(utils.read_text().replace("@dataclasses.dataclass\nclass GenerationBatchResult",
                                               "class GenerationBatchResult", 1))
    ou = fake / "srt/managers/overlap_utils.py"
    ou.write_text(ou.read_text().replace("_is_cuda = ", "_is_cuda_renamed = ", 1))
    v = _evaluate("0.5.23", fake)
    text = "\n".join(v.problems)
    assert v.tier == "unsupported"
    assert "self.brand_new_flag" in text
    assert "is_disable_overlap_for_batch" in text
    assert "GenerationBatchResult is not a dataclass" in text
    assert "_is_cuda is missing" in text


def test_a_function_turned_into_a_value_is_a_problem_not_a_crash(sglang, tmp_path):
    fake = _fake_release(tmp_path)
    ou = fake / "srt/managers/overlap_utils.py"
    ou.write_text(ou.read_text() + "\nresolve_forward_inputs = 3\n")
    sb = fake / "srt/managers/schedule_batch.py"
    sb.write_text(sb.read_text() + "\nScheduleBatch = None\n")
    v = _evaluate("0.5.23", fake)
    assert v.tier == "unsupported" and any("ScheduleBatch" in p for p in v.problems)


def test_an_unsupported_release_is_exit_2_naming_every_problem(sglang, monkeypatch, capsys):
    from specrace import cli
    from targets.sglang.boundary import contract
    monkeypatch.setattr(contract, "installed_version", lambda: "0.4.0")
    monkeypatch.delitem(targets._TARGETS, "sglang", raising=False)
    assert cli.main(["list", "--target", "sglang"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("specrace: error:") and "0.4.0" in "\n".join(err)


def test_unsupported_or_missing_sglang_is_a_target_error(monkeypatch):
    from targets.sglang import SglangTarget
    from targets.sglang.boundary import contract
    monkeypatch.setattr(contract, "installed_version", lambda: "0.4.0")
    with pytest.raises(targets.TargetError, match="0.4.0 is unsupported"):
        SglangTarget().load()

    def missing():
        raise LookupError("sglang is not installed")
    monkeypatch.setattr(contract, "installed_version", missing)
    with pytest.raises(targets.TargetError, match="make upstream"):
        SglangTarget().load()


@pytest.mark.parametrize("argv, needle", [
    (["repro", "ngram-filter-race", "--target", "sglang", "--variant", "nope"],
     "unknown variant"),
    (["repro", "ngram-filter-race", "--target", "vllm"], "vllm is not installed"),
    (["repro", "ngram-filter-race", "--target", "trtllm"], "invalid choice"),
    (["matrix", "--target", "nope"], "invalid choice"),
])
def test_cli_bad_target_is_one_line_exit_2(argv, needle):
    p = subprocess.run([sys.executable, "-m", "specrace.cli", *argv], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], p.stderr


def test_a_mutation_whose_patch_does_not_fit_the_release_is_disabled_named(sglang):
    """On sglang a release that moved the code disables the mutation (named, not
    counted), where on impl/ a patch that does not fit is a harness error."""
    from matrix.run import mutation_row
    from matrix.table import assemble
    from mutations import Mutation
    m = Mutation("moved", "a snippet this release does not have", "test",
                 "sglang.srt.managers.overlap_utils:FutureMap.stash",
                 (("this line is not in upstream\n", ""),), ("seed-eager",))
    row = mutation_row(m, "sim", "sglang")
    assert row["status"] == "disabled" and "occurs 0 times" in row["detail"]
    res = assemble("sim", "sglang", [("mutation", "moved")], [row], 0.0)
    assert res["total"] == 0 and res["disabled"][0]["name"] == "moved"
    assert mutation_row(m, "sim", "impl")["status"] == "harness-error"


def test_a_variant_whose_patch_does_not_fit_is_exit_2_naming_it(sglang, monkeypatch, capsys):
    from specrace import cli
    monkeypatch.setattr(type(sglang), "patch_problem",
                        lambda self, target, edits: "a snippet occurs 0 times")
    assert cli.main(["repro", "ngram-filter-race", "--target", "sglang", "--variant",
                     "pre-fix", "--no-report", "--trials", "1"]) == 2
    assert "variant 'pre-fix' is disabled here" in capsys.readouterr().err


def test_a_measured_release_is_verified_only_with_its_measured_digest(sglang, tmp_path):
    from targets.sglang.boundary import contract
    fake = _fake_release(tmp_path)
    v = _evaluate("0.5.23", fake)
    assert (v.tier == "verified") == (contract.VERIFIED.get("0.5.23") == v.digest)
    sched = fake / "srt/managers/scheduler.py"
    sched.write_text(sched.read_text() + "\n# edited\n")
    assert _evaluate("0.5.23", fake).tier == "compatible"  # same version, other code


def test_the_loop_is_upstreams_a_mutation_inside_event_loop_overlap_is_killed(sglang):
    """The target's sequencing is upstream's: a seeded bug inside the installed
    ``Scheduler.event_loop_overlap`` (the just-launched batch's result processed instead
    of the previous one) changes what the harness sees, and the oracle catches it."""
    from matrix.run import PROBES, run_probe
    m = targets.get("sglang").mutation("loop-processes-current-result")
    assert m.target.endswith("Scheduler.event_loop_overlap")
    killed, oracle, _ = run_probe(PROBES["seed-eager"], "sim", m, "sglang")
    assert killed and oracle == "stale-value"
    killed, _, _ = run_probe(PROBES["seed-eager"], "sim", None, "sglang")
    assert not killed


@pytest.mark.parametrize("scenario, variant", [
    ("ngram-filter-race", "fixed"), ("mixed-overlap", "fixed"), ("dp-idle", "fixed"),
    ("dspark-result-readback", "fixed"), ("eagle-v2", "fixed"), ("kv-row-reuse", "retract")])
def test_the_methods_the_contract_does_not_read_read_nothing_missing(sglang, monkeypatch,
                                                                     scenario, variant):
    """``loop_contract.NOT_READ`` stops the transitive reading at methods that read what the
    target lacks only past a guard it fails: where one runs, it never reads a missing
    attribute (an AttributeError inside it fails loudly here), and runs stay clean."""
    from sglang.srt.managers.scheduler import Scheduler
    from scenarios.resolve import run_scenario_result
    from targets.sglang.boundary import loop_contract

    def guarded(name, original):
        def run(*a, **kw):
            try:
                return original(*a, **kw)
            except AttributeError as exc:
                raise AssertionError(f"Scheduler.{name} read a missing attribute ({exc}): "
                                     f"loop_contract.NOT_READ is wrong") from exc
        return run
    for name in loop_contract.NOT_READ:
        if name in vars(Scheduler):
            monkeypatch.setattr(Scheduler, name, guarded(name, vars(Scheduler)[name]))
    res = run_scenario_result(scenario, target="sglang", variant=variant, backend="sim",
                              trials=1, war_barrier="coarse")
    assert res.reproduced == 0, (res.first_divergence, res.races[:1])


def test_forwards_publish_read_done_only_where_the_release_replays_a_graph(sglang,
                                                                             monkeypatch):
    """A run of the installed release has forwards with a read-done event (replayed
    verifies) and without (extends; every step with graphs off), as upstream's graph
    runner publishes -- so the barrier's coarse fallback runs in every run."""
    from scenarios.resolve import run_scenario_result
    from targets.sglang.engine import worker
    seen = []
    record = worker.SharedReadRunner._record_shared_read_done

    def spy(self, replayed):
        record(self, replayed)
        seen.append(bool(self.publish_read_done and replayed))
    monkeypatch.setattr(worker.SharedReadRunner, "_record_shared_read_done", spy)
    run_scenario_result("ngram-graph-eligibility", target="sglang", variant="fixed",
                        backend="sim", trials=1, war_barrier="fine")
    assert True in seen and False in seen, seen
    seen.clear()
    run_scenario_result("ngram-graph-eligibility", target="sglang",
                        variant="fixed-graphs-off", backend="sim", trials=1,
                        war_barrier="fine")
    assert seen and not any(seen)


def test_a_barrier_that_keeps_a_stale_event_is_caught(sglang):
    from matrix.run import PROBES, run_probe
    m = targets.get("sglang").mutation("war-barrier-keeps-stale-event")
    for probe in ("graph-eligibility", "seed-eager"):
        killed, oracle, detail = run_probe(PROBES[probe], "sim", m, "sglang")
        assert killed and oracle == "happens-before", (probe, detail)
        assert not run_probe(PROBES[probe], "sim", None, "sglang")[0]


def test_read_as_rocm_every_platform_branch_is_rocms(sglang):
    """--platform rocm: upstream's is_cuda()/_is_hip branches answer as on ROCm -- the WAR
    barrier is off (is_cuda() or SGLANG_ENABLE_WAR_BARRIER), and the result copy runs on
    the forward stream, not the copy stream -- and CUDA's reading is back after the run."""
    from harness.runtime.trace import OpKind
    from scenarios.resolve import run_scenario_result
    import sglang.srt.managers.scheduler as sched_mod
    rocm = run_scenario_result("ngram-hidden-readback", target="sglang", backend="sim",
                               trials=1, platform="rocm")
    cuda = run_scenario_result("ngram-hidden-readback", target="sglang", backend="sim",
                               trials=1)

    def copy_streams(res):
        t = res.trace
        return {t.stream_name(op.stream) for op in t.executed
                if getattr(op, "kind", None) == OpKind.COPY and op.frame
                and op.frame[2] == "async_d2h"}
    assert copy_streams(rocm) == {"forward"} and "copy" in copy_streams(cuda)
    assert rocm.platform == "rocm" and "platform" in rocm.identity()
    assert sched_mod._is_hip is False  # restored


def test_impl_has_one_platform(capsys):
    from specrace import cli
    assert cli.main(["repro", "ngram-filter-race", "--platform", "rocm", "--no-report"]) == 2
    assert "reads its code as cuda" in capsys.readouterr().err
