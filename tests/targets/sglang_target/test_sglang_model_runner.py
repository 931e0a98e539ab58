"""Upstream's own ``ModelRunner`` under the NGRAM toy worker (``targets/sglang/runner``):
built from ``__new__`` and upstream's init steps, its forward runs in the trials (the
trace's frames are upstream's runner, attention backend and KV pool), the stand-in
attention backend's verify computes what upstream's extend does over the same layout,
and the seed race still reproduces with the released code clean."""
import os

import pytest
import torch

import targets
from harness.policies import parse_policy
from harness.runtime import open_runtime
from harness.runtime.trace import OpRecord, ReplayedOp
from scenarios.resolve import run_scenario_result
from seams.faults.plan import FaultPlan


@pytest.fixture(scope="module", autouse=True)
def sglang():
    targets.get("sglang")


def _upstream_sites(result) -> set:
    """``(file under sglang/srt, function)`` of every device op in the trace."""
    return {(_srt(rec.frame), rec.frame[2]) for rec in result.trace.records
            if isinstance(rec, OpRecord) and _srt(rec.frame)}


def _srt(frame):
    sep = "sglang" + os.sep + "srt" + os.sep
    return frame[0].split(sep, 1)[1] if frame and sep in frame[0] else None


# the eager runner's input buffers (the prefill), the decode graph runner's capture, the
# KV pool's write: each a site only upstream's ModelRunner reaches
RUNNER_SITES = {("model_executor/cuda_graph_buffer_registry.py", "_foreach_copy"),
                ("model_executor/runner/decode_cuda_graph_runner.py", "capture_prepare"),
                ("mem_cache/memory_pool.py", "_set_kv_buffer_impl")}
GRAPH_REPLAY = "model_executor/runner_backend/full_cuda_graph_backend.py"


def _seed_run():
    return run_scenario_result("ngram-filter-race", target="sglang", backend="sim",
                               trials=1, policy=parse_policy("eager"))


def test_the_trace_shows_upstreams_model_runner_and_graph_runner():
    r = _seed_run()
    sites = _upstream_sites(r)
    assert RUNNER_SITES <= sites, RUNNER_SITES - sites
    # every verify fits the captured buckets: its forward is upstream's graph replay
    replayed = [rec for rec in r.trace.records if isinstance(rec, ReplayedOp)]
    assert replayed and all(_srt(rec.replay.frame) == GRAPH_REPLAY for rec in replayed)
    assert any(_srt(rec.frame) == "mem_cache/memory_pool.py" for rec in replayed)


def test_without_the_runner_the_trace_has_none_of_its_frames(monkeypatch):
    """The check above fails on the toy forward: with the runner switched off none of
    those sites issues a device op."""
    from targets.sglang.runner import build
    monkeypatch.setattr(build, "fits", lambda: False)
    r = _seed_run()
    assert not RUNNER_SITES & _upstream_sites(r)
    assert not any(isinstance(rec, ReplayedOp) and _srt(rec.replay.frame) == GRAPH_REPLAY
                   for rec in r.trace.records)


@pytest.mark.parametrize("scenario,variant,outcome", [
    ("ngram-filter-race", "pre-fix", "race"), ("ngram-filter-race", "fixed", "clean"),
    # the verify's hidden states read back from upstream's graph's static output while
    # the next replay rewrites it (the readback finding), and its fix
    ("ngram-hidden-readback", "as-installed", "race"),
    ("ngram-hidden-readback", "fixed", "clean")])
def test_the_findings_still_reproduce_and_their_fixes_stay_clean(scenario, variant, outcome):
    r = run_scenario_result(scenario, target="sglang", variant=variant,
                            war_barrier="fine", backend="sim", trials=2)
    assert r.outcome == outcome


def test_the_servers_device_is_the_runs_not_torchs_accelerator():
    """The run's server args name its device's type, as a launched server's resolve to.
    Without it upstream asks torch for the current accelerator (the runtime context's
    named streams: the graph capture stream), and torch answers with a registered
    PrivateUse1 backend before CUDA: after a simulator run in the process a CUDA run
    captured on the simulator's stream (measured on an H100)."""
    from sglang.srt import runtime_context as rc
    from sglang.srt.arg_groups.overrides import resolution_result
    from targets.sglang.boundary import upstream
    for device in ("cuda:0", "sim"):
        with upstream.server_config("NGRAM", device):
            assert resolution_result(rc.get_server_args(), "device") == \
                torch.device(device).type


def test_a_cuda_run_after_a_simulator_run_captures_on_cuda(specrace_backend):
    """On a GPU: a simulator run first (it registers the simulator's PrivateUse1 backend
    in the process), then upstream's runner capturing its decode graphs on CUDA. The
    whole CUDA suite at cf4aa01 failed here, the capture stream the simulator's ("the
    sim device is not set up"), wherever a worker had run a simulator test before."""
    if specrace_backend != "cuda":
        pytest.skip("a CUDA run after a simulator run: on a GPU (--specrace-backend cuda)")
    assert _seed_run().outcome == "clean"  # the release's own relay, as installed
    # (before the mend this raised: the capture failed, so the release "did not fit")
    r = run_scenario_result("ngram-filter-race", target="sglang", variant="as-installed",
                            backend="cuda", trials=1)
    assert r.outcome == "clean", (r.first_divergence, r.races[:2])


def test_the_graph_replays_compute_what_the_eager_forward_does():
    """The same outputs and accept lengths with upstream's graphs on and off: the
    replay's static inputs carry the batch, its outputs are read for its rows."""
    from harness.runtime import open_runtime
    from harness.trials.drive import drive, server_args
    from scenarios.ngram_filter_race import SCENARIO as S
    target = targets.get("sglang")
    wl = S.workload(0)
    outs = []
    for graphs in (True, False):
        accepts = []
        plan = FaultPlan(observer=lambda name, v: accepts.append(v["accept_len"])
                         if name == "result" else None)
        args = server_args(wl, {"cuda_graph": graphs}, target)
        with open_runtime("sim", parse_policy("eager")) as rt:
            outs.append((drive(rt, wl, args, plan, target=target), accepts))
    assert outs[0] == outs[1] and any(n > 1 for n in outs[0][1])


def test_the_stand_in_kernel_is_upstreams_torch_native_extend():
    """The stand-in backend's extend kernel (``runner/attention.py``) against what it
    replaces: upstream's ``torch_native`` extend, over a verify's layout (prefix = each
    context, extend = the ``D`` nodes) and a prefill's -- the same output, the same KV
    written at the same slots."""
    from types import SimpleNamespace
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from targets.sglang.boundary import upstream
    from targets.sglang.runner import attention, build
    from targets.sglang.boundary.platform import as_without_gpu
    torch.manual_seed(0)
    H, D, rows, ctx = 8, 3, 4, 16
    # CPU tensors stand for the device, as in a simulator run: on a GPU machine upstream
    # must take the paths it takes without one (its KV write's JIT kernel is CUDA's)
    with as_without_gpu("sim"), \
            upstream.server_config("NGRAM", "sim", speculative_num_draft_tokens=D):
        layer = RadixAttention(num_heads=1, head_dim=H, scaling=H ** -0.5, num_kv_heads=1,
                               layer_id=0)
        toy = SimpleNamespace(embed=torch.zeros(1, H))
        req_to_token = torch.arange(rows * ctx, dtype=torch.int32).view(rows, ctx)
        seq_lens = torch.tensor([5, 2], dtype=torch.int64)
        pools = [build.kv_pool(toy, rows * ctx, "cpu") for _ in range(2)]
        context = torch.randn_like(pools[0].k_buffer[0])  # the contexts' KV, in both
        for kv in pools:
            kv.k_buffer[0].copy_(context)
            kv.v_buffer[0].copy_(context * 2)
        runner = lambda kv: SimpleNamespace(  # noqa: E731
            device="cpu", req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
            token_to_kv_pool=kv)
        rows_ = torch.tensor([1, 3])
        loc = torch.stack([req_to_token[r, s:s + D] for r, s in zip(rows_, seq_lens)])
        q = torch.randn(2 * D, H)
        k, v = torch.randn(2 * D, 1, H), torch.randn(2 * D, 1, H)  # RadixAttention's view
        base = dict(req_pool_indices=rows_, out_cache_loc=loc.reshape(-1).to(torch.int64),
                    encoder_lens=None, encoder_out_cache_loc=None)
        verify = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, seq_lens=seq_lens,
                                 spec_info=SimpleNamespace(draft_token_num=D), **base)
        extend = SimpleNamespace(forward_mode=ForwardMode.EXTEND, seq_lens=seq_lens + D,
                                 extend_prefix_lens=seq_lens,
                                 extend_seq_lens=torch.full_like(seq_lens, D), **base)
        stand_in = attention.stand_in_class()(runner(pools[0]))
        out = stand_in.forward_extend(q, k, v, layer, verify)
        want = TorchNativeAttnBackend(runner(pools[1])).forward_extend(q, k, v, layer, extend)
        assert torch.allclose(out, want, atol=1e-5)
        assert torch.equal(pools[0].k_buffer[0], pools[1].k_buffer[0])
        assert torch.equal(pools[0].k_buffer[0][loc.reshape(-1)], k)
        # a prefill: extends of 2 and 3 tokens after prefixes of 3 and 1
        ext, pre = torch.tensor([2, 3]), torch.tensor([3, 1])
        loc = torch.cat([req_to_token[r, p:p + e] for r, p, e in zip(rows_, pre, ext)])
        q, k, v = torch.randn(5, H), torch.randn(5, 1, H), torch.randn(5, 1, H)
        prefill = SimpleNamespace(forward_mode=ForwardMode.EXTEND, seq_lens=pre + ext,
                                  extend_prefix_lens=pre, extend_seq_lens=ext,
                                  extend_start_loc=torch.tensor([0, 2]),
                                  **dict(base, out_cache_loc=loc.to(torch.int64)))
        out = stand_in.forward_extend(q, k, v, layer, prefill)
        want = TorchNativeAttnBackend(runner(pools[1])).forward_extend(q, k, v, layer, prefill)
        assert torch.allclose(out, want, atol=1e-5)
        assert torch.equal(pools[0].k_buffer[0], pools[1].k_buffer[0])


def test_a_release_without_what_the_runner_calls_keeps_the_toy_forward(tmp_path):
    """Read from the source: the installed release fits; one whose torch_native backend
    lost ``forward_extend`` (a seam the stand-in needs) or whose ``ModelRunner`` lost an
    init step the room calls does not -- the run keeps the toy forward, not a crash."""
    from targets import static
    from targets.sglang.runner import build
    from tests.targets.sglang_target.test_contract_edits import shadow
    root = static.package_root("sglang")
    assert build.fits(root)
    edits = {"srt/layers/attention/torch_native_backend.py":
             lambda t: t.replace("def forward_extend(", "def forward_extend_v2("),
             "srt/model_executor/model_runner.py":
             lambda t: t.replace("def init_token_oracle(", "def init_token_oracles(")}
    for i, (rel, edit) in enumerate(edits.items()):
        (tmp_path / str(i)).mkdir()
        tampered = shadow(tmp_path / str(i), rel, edit)
        assert not build.fits(tampered), rel


def test_the_seeded_bug_in_the_captured_kv_write_is_killed():
    """``kv-write-side-stream-unordered`` (the KV pool's captured V write forked onto its
    side stream without the fork's wait): the capture is refused as CUDA refuses it (a
    dependency across the capture boundary), so the mutant never serves; the unmutated
    code captures and replays clean (the findings test above)."""
    from matrix.run import by_name, mutation_row
    row = mutation_row(by_name("sglang")["kv-write-side-stream-unordered"], "sim",
                       target="sglang")
    assert row["status"] == "killed", row
    assert "capture" in row["detail"]
