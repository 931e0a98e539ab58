"""Idioms vLLM's GPU model runner uses that the simulator got wrong (found by driving
vLLM 0.17.0's runner on it):

1. ``*_like`` / ``new_*`` factories with a ``device=`` other than their input's
   (``CpuGpuBuffer``: ``torch.zeros_like(cpu, device=device)``);
2. ``torch.inference_mode`` (``execute_model`` / ``sample_tokens`` run inside it);
3. moving device tensors and parameters to the meta device (weight-reload metadata).
"""
from __future__ import annotations

import pytest
import torch

from harness.detect.hb import detect
from harness.policies import parse_policy
from harness.runtime.sim.runtime import sim_runtime
from harness.runtime.sim.tensor import SimTensor
from harness.runtime.trace import SyncRecord

POLICIES = ["eager", "lazy"]


def _layout(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.dtype


def _host_input() -> torch.Tensor:
    """A non-contiguous host tensor: ``preserve_format`` must keep its strides."""
    return torch.arange(12, dtype=torch.int32).reshape(3, 4).t()


def _syncs(rt) -> list:
    return [r for r in rt.trace.log if isinstance(r, SyncRecord)]


# --- 1. ``*_like`` / ``new_*`` with an explicit device -----------------------------------

LIKE_ON_DEVICE = {
    "zeros_like": (lambda x, d: torch.zeros_like(x, device=d), 0),
    "ones_like": (lambda x, d: torch.ones_like(x, device=d), 1),
    "full_like": (lambda x, d: torch.full_like(x, 7, device=d), 7),
    "empty_like_filled": (lambda x, d: torch.empty_like(x, device=d).fill_(3), 3),
    "rand_like": (lambda x, d: torch.rand_like(x, dtype=torch.float32, device=d), None),
    "randn_like": (lambda x, d: torch.randn_like(x, dtype=torch.float32, device=d), None),
    "randint_like": (lambda x, d: torch.randint_like(x, 5, device=d), None),
}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", sorted(LIKE_ON_DEVICE))
def test_like_factory_of_a_host_tensor_on_the_device(name, policy):
    make, value = LIKE_ON_DEVICE[name]
    host = _host_input()
    with sim_runtime(parse_policy(policy)) as rt:
        out = make(host, rt.device)
        assert type(out) is SimTensor
        assert tuple(out.shape) == (4, 3) and out.stride() == host.stride()
        if "rand" not in name:
            assert out.dtype == host.dtype
        got = out.cpu()
        if value is not None:
            assert got.tolist() == [[value] * 3] * 4
        # the host input lent its layout only: what made the output read nothing else
        op = [r for r in rt.trace.ops() if r.writes and r.writes[0][0] == out._sid][0]
        assert all(sid == out._sid for sid, _, _ in op.reads)


@pytest.mark.parametrize("policy", POLICIES)
def test_cpu_gpu_buffer_idiom(policy):
    """vLLM's ``CpuGpuBuffer``: pinned host buffer, device twin by ``zeros_like``."""
    with sim_runtime(parse_policy(policy)) as rt:
        cpu = torch.zeros(2, 3, dtype=torch.int64, pin_memory=True)
        gpu = torch.zeros_like(cpu, device=rt.device)
        pinned_twin = torch.zeros_like(cpu, device=rt.device, pin_memory=True)
        assert type(gpu) is SimTensor and type(pinned_twin) is SimTensor
        cpu[0] = 5
        gpu.copy_(cpu, non_blocking=True)
        assert gpu.cpu().tolist() == [[5, 5, 5], [0, 0, 0]]
        assert pinned_twin.cpu().tolist() == [[0] * 3] * 2
        new = cpu.new_zeros((4,), device=rt.device)
        assert type(new) is SimTensor and new.dtype == torch.int64
        assert new.cpu().tolist() == [0] * 4


def test_like_factory_of_a_device_tensor_on_the_host():
    """The device tensor lends its layout: a plain host tensor, no device op, no sync --
    even behind queued work (lazy)."""
    with sim_runtime(parse_policy("lazy")) as rt:
        x = torch.ones(3, 4, device=rt.device)[:, ::2]  # queued, non-dense
        ops_before, log_before = len(rt.trace.ops()), len(rt.trace.log)
        z = torch.zeros_like(x, device="cpu")
        f = torch.full_like(x, 2, device="cpu", dtype=torch.int32)
        p = torch.ones_like(x, device="cpu", pin_memory=True)
        n = x.new_zeros((5,), device="cpu")
        e = x.new_empty((2,), device="cpu")  # (it recursed forever)
        assert len(rt.trace.ops()) == ops_before and len(rt.trace.log) == log_before
        for t in (z, f, p, n, e):
            assert t.device.type == "cpu" and not isinstance(t, SimTensor)
        assert z.tolist() == [[0.0, 0.0]] * 3 and f.tolist() == [[2, 2]] * 3
        assert f.dtype == torch.int32 and n.tolist() == [0.0] * 5
        assert p.is_pinned() and p.tolist() == [[1.0, 1.0]] * 3
        assert x.cpu().tolist() == [[1.0, 1.0]] * 3


# --- 2. ``torch.inference_mode`` -----------------------------------------------------------

@pytest.mark.parametrize("policy", POLICIES)
def test_views_inside_inference_mode(policy):
    with sim_runtime(parse_policy(policy)) as rt:
        x = torch.zeros(8, device=rt.device)
        with torch.inference_mode():
            y = x[2:4]  # a view of a normal tensor: "Cannot set version_counter"
            z = torch.arange(4, device=rt.device)[1:]
            y.fill_(3.0)
            b = x.view(torch.int32)[:2]  # a dtype view
            parts = x.split(4)
            zz = z.view(3, 1)[1]
            # torch's rule: a view has its base's inference-ness
            assert not y.is_inference() and not b.is_inference()
            assert not parts[0].is_inference()
            assert z.is_inference() and zz.is_inference()
        y.add_(1.0)  # normal views: updatable outside the mode
        b.zero_()
        rt.synchronize()  # (under lazy, the kernels run here, outside the mode)
        assert x.cpu().tolist() == [0, 0, 4, 4, 0, 0, 0, 0]
        assert z.cpu().tolist() == [1, 2, 3] and zz.cpu().tolist() == [2]
        assert parts[1].cpu().tolist() == [0.0] * 4
        with pytest.raises(RuntimeError, match="inference tensor"):
            z.add_(1)  # as torch: an inference tensor, outside the mode


@pytest.mark.parametrize("policy", POLICIES)
def test_other_ops_inside_inference_mode(policy):
    with sim_runtime(parse_policy(policy)) as rt:
        d = rt.device
        x = torch.arange(6.0, device=d)
        src = torch.ones(6).pin_memory()
        with torch.inference_mode():
            x.add_(1).mul_(2)  # in-place on a normal tensor
            y = x * 3
            w = torch.empty(6, device=d)
            w.copy_(x)  # D2D
            first = w[0].item()  # (a sync: what follows is still queued at the exit)
            x.copy_(src, non_blocking=True)  # H2D
            host = w.to("cpu", non_blocking=True)  # D2H into new pinned memory
            into = torch.empty(6).pin_memory()  # (pin_memory of an inference tensor)
            into.copy_(y, non_blocking=True)  # D2H into it
            zl = torch.zeros_like(src, device=d)
            t = x.view(2, 3).t_()
            assert y.is_inference() and zl.is_inference() and not x.is_inference()
            assert host.is_inference() and into.is_inference()
        rt.synchronize()  # (under lazy, the copies land here, after the mode is left)
        assert x.cpu().tolist() == [1.0] * 6
        assert y.cpu().tolist() == [6.0, 12.0, 18.0, 24.0, 30.0, 36.0]
        assert host.tolist() == [2.0, 4.0, 6.0, 8.0, 10.0, 12.0] and first == 2.0
        assert into.tolist() == y.cpu().tolist() and into.is_pinned()
        assert zl.cpu().tolist() == [0.0] * 6 and tuple(t.shape) == (3, 2)


def test_device_memory_made_in_inference_mode_is_written_after_it():
    """Blocks first made inside the mode are reused, and queued kernels issued there run,
    after it: device memory must take in-place writes then."""
    with sim_runtime(parse_policy("lazy")) as rt:
        d = rt.device
        with torch.inference_mode():
            a = torch.zeros(4, device=d)
            a.add_(1)  # queued: runs at the sync below, outside the mode
            kept = a + 1
            del a
        reused = torch.empty(4, device=d)  # a's block, freed
        reused.fill_(5.0)
        rt.synchronize()
        assert reused.cpu().tolist() == [5.0] * 4 and kept.cpu().tolist() == [2.0] * 4


def _view_race(rt, inference: bool) -> list:
    m = rt.module
    S = m.Stream()
    x = torch.zeros(8, device=rt.device)
    rt.synchronize()  # (the zeros: ordered before all that follows)
    with torch.inference_mode(inference):
        x[:4].fill_(1.0)
        with m.stream(S):
            y = x[2:6] * 2  # reads what the fill writes, unordered
    rt.synchronize()
    del y
    return [(r.kind, r.first.op, r.second.op) for r in detect(rt.trace)]


def test_detector_sees_accesses_through_views_inside_inference_mode():
    with sim_runtime(parse_policy("lazy")) as rt:
        outside = _view_race(rt, False)
    with sim_runtime(parse_policy("lazy")) as rt:
        inside = _view_race(rt, True)
    assert outside == [("RAW", "fill_.Scalar", "mul.Tensor")]
    assert inside == outside


def test_detector_sees_accesses_through_split_pieces():
    """``split`` / ``unbind`` return lists of views: the pieces share their base's storage
    (they had fresh storage ids, hiding this race), inside inference_mode or not."""
    for inference in (False, True):
        with sim_runtime(parse_policy("lazy")) as rt:
            m = rt.module
            S = m.Stream()
            x = torch.zeros(8, device=rt.device)
            rt.synchronize()
            with torch.inference_mode(inference):
                first, _ = x.split(4)
                row = x.view(2, 4).unbind()[1]
                assert first._sid == row._sid == x._sid
                first.fill_(1.0)
                with m.stream(S):
                    doubled = x * 2
            rt.synchronize()
            del doubled
            assert [(r.kind, r.first.op, r.second.op) for r in detect(rt.trace)] == [
                ("RAW", "fill_.Scalar", "mul.Tensor")]


# --- 3. the meta device --------------------------------------------------------------------

def _to_meta_ways(t: torch.Tensor) -> dict:
    return {"data.to": t.data.to("meta"), "to": t.to("meta"),
            "to_dtype": t.to("meta", dtype=torch.float16),
            "empty_like": torch.empty_like(t, device="meta"),
            "zeros_like": torch.zeros_like(t, device="meta")}


@pytest.mark.parametrize("kind", ["tensor", "parameter"])
def test_device_tensor_to_meta_is_metadata_only(kind):
    with sim_runtime(parse_policy("lazy")) as rt:
        t = torch.ones(4, 6, device=rt.device)[:, 1:5]  # queued, a view
        if kind == "parameter":
            t = torch.nn.Parameter(t.contiguous())
        log_before = len(rt.trace.log)
        for way, meta in _to_meta_ways(t).items():
            assert type(meta) is torch.Tensor and meta.device.type == "meta", way
            assert tuple(meta.shape) == (4, 4), way
            assert meta.dtype == (torch.float16 if way == "to_dtype" else torch.float32)
        # nothing queued, nothing read, nobody waited
        assert len(rt.trace.log) == log_before
        assert not _syncs(rt)


def test_meta_copies():
    with sim_runtime(parse_policy("lazy")) as rt:
        x = torch.ones(3, device=rt.device)
        meta = torch.empty(3, device="meta")
        log_before = len(rt.trace.log)
        assert meta.copy_(x) is meta  # copies nothing, as on CUDA: no op, no sync
        assert len(rt.trace.log) == log_before
        with pytest.raises(NotImplementedError, match="meta"):
            meta.to(rt.device)  # refused at the call, not a device error later
        with pytest.raises(NotImplementedError, match="meta"):
            x.copy_(meta)
        assert x.cpu().tolist() == [1.0] * 3  # no sticky device error either


def test_module_to_meta():
    with sim_runtime(parse_policy("eager")) as rt:
        lin = torch.nn.Linear(2, 3, device=rt.device)
        assert type(lin.weight) is SimTensor
        lin.to("meta")
        assert type(lin.weight) is torch.nn.Parameter and lin.weight.is_meta


def test_meta_class_assignment_to_a_device_tensor_class():
    """vLLM's reload metadata: ``meta.__class__ = type(param)``. A parameter on the
    simulator is a ``SimTensor`` (``Parameter`` of a tensor subclass keeps the subclass,
    marked ``_is_param``), and ``SimTensor``'s ``__slots__`` make its instances larger than
    a plain tensor's, which Python refuses to retype. What works is the plain class with
    the parameter's ``__dict__``: still a ``Parameter`` to ``isinstance``."""
    with sim_runtime(parse_policy("eager")) as rt:
        param = torch.nn.Parameter(torch.zeros(4, device=rt.device))
        assert type(param) is SimTensor and isinstance(param, torch.nn.Parameter)
        meta = param.data.to("meta")
        with pytest.raises(TypeError, match="layout differs"):
            meta.__class__ = type(param)
        meta.__dict__ = param.__dict__.copy()
        assert isinstance(meta, torch.nn.Parameter) and type(meta) is torch.Tensor
