"""Differential "gotcha suite" for the simulator: ordinary torch code on ``sim`` must give
plain CPU torch's results under every schedule policy (each case syncs properly: results
come back through blocking ``.cpu()``), plus the simulator's own device semantics.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as Fn

from harness.policies import parse_policy
from harness.runtime.sim import SimDeviceError
from harness.runtime.sim.runtime import sim_runtime
from harness.runtime.sim.tensor import SimTensor

POLICIES = ["eager", "lazy", "random(3)", "pct(4,3)"]


def _pinned(t: torch.Tensor, dev) -> torch.Tensor:
    """Pinned on the simulator; plain on the CPU reference (a CPU build cannot pin)."""
    return t.pin_memory() if torch.device(dev).type != "cpu" else t


def _host(v):
    """Bring a result back to plain host values (blocking, so properly synchronised)."""
    if isinstance(v, torch.Tensor):
        h = v.cpu()
        assert type(h) is not SimTensor
        return ("T", h.dtype, tuple(h.shape), h.tolist())
    if isinstance(v, (list, tuple)):
        return [_host(x) for x in v]
    return v


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


# --- the cases: fn(dev) -> tensors / python values ---------------------------------------

def _x(dev):
    return torch.arange(12, dtype=torch.float32, device=dev).reshape(3, 4)


def _setitem_tensor(dev):
    x = torch.zeros(3, 4, device=dev)
    x[1] = torch.tensor([1.0, 2.0, 3.0, 4.0], device=dev)
    x[:, 0] = 7.0
    x[2, 1:3] = torch.full((2,), -1.0, device=dev)
    return x


def _setitem_mask(dev):
    x = _x(dev)
    x[x > 5] = 0.0
    x[torch.tensor([True, False, True], device=dev)] += 100.0
    return x


def _index_put(dev):
    x = torch.zeros(6, dtype=torch.int64, device=dev)
    idx = torch.tensor([0, 2, 2, 5], device=dev)
    vals = torch.tensor([1, 2, 3, 4], device=dev)
    y = x.clone()
    x.index_put_((idx,), vals, accumulate=True)
    y[idx[:2]] = vals[:2]
    return x, y


def _inplace(dev):
    x = _x(dev)
    x.add_(1).mul_(2).sub_(torch.ones(4, device=dev)).clamp_(max=15.0)
    x.div_(2)
    x.neg_()
    x.abs_()
    return x


def _out_eq(dev):
    a, b = _x(dev), torch.ones(3, 4, device=dev)
    out = torch.empty(3, 4, device=dev)
    torch.add(a, b, alpha=3, out=out)
    out2 = torch.zeros(4, dtype=torch.int64, device=dev)
    torch.argmax(a, dim=0, out=out2[:4])  # out= into a view
    return out, out2


def _views(dev):
    x = _x(dev)
    v = x.view(4, 3)
    r = x.reshape(2, 6)
    f = x.flatten()
    p = x.permute(1, 0)
    v[0, 0] = 100.0  # writes through a view reach the base and every other view
    return x, v, r, f, p.contiguous(), p.is_contiguous(), x.t().stride()


def _inplace_views(dev):
    x = torch.arange(6, device=dev)
    x.unsqueeze_(0)
    y = torch.arange(6, device=dev).reshape(2, 3)
    y.t_()
    z = torch.arange(3, device=dev)
    z.squeeze_()
    return x, tuple(x.shape), y, tuple(y.shape), z


def _int_conversions(dev):
    x = _x(dev)
    return (int(x[1, 2]), float(x.sum()), bool(x[0, 0]), x[2, 3].item(),
            x.max().item(), int(torch.tensor(3, device=dev)))


def _copy_both_ways(dev):
    host = torch.arange(4, dtype=torch.float32)
    d = torch.zeros(4, device=dev)
    d.copy_(host)  # pageable H2D
    d.add_(1)
    pinned = _pinned(torch.tensor([5.0, 6.0, 7.0, 8.0]), dev)
    e = torch.zeros(4, device=dev)
    e.copy_(pinned, non_blocking=True)
    back = torch.empty(4)
    back.copy_(d)  # blocking D2H into pageable memory
    back2 = _pinned(torch.zeros(4), dev)
    back2.copy_(e * 2, non_blocking=True)
    nb = (d * 3).to("cpu", non_blocking=True)  # pinned on a device; read after the sync
    torch.get_device_module(dev).synchronize()
    return d, e, back.tolist(), back2.clone().tolist(), nb.tolist()


def _to_device(dev):
    h = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)
    d = h.to(dev)
    d2 = h.to(dev, non_blocking=True)
    d3 = h.to(device=dev, dtype=torch.float64)
    return d, d2, d3, d.to(torch.int64), d.to("cpu"), str(d3.dtype)


def _nonzero(dev):
    x = torch.tensor([0, 3, 0, 5, 6], device=dev)
    nz = x.nonzero()
    mask = x > 2
    sel = x[mask]
    return nz, nz.shape[0], sel, torch.where(x > 4)[0], x.masked_select(mask)


def _embedding(dev):
    w = torch.arange(20, dtype=torch.float32, device=dev).reshape(10, 2)
    ids = torch.tensor([[1, 9], [0, 3]], device=dev)
    return Fn.embedding(ids, w), torch.nn.functional.embedding(ids[0], w)


def _dtypes(dev):
    x = _x(dev)
    return (x.to(torch.int32), x.double(), x.half().float(), x.bool(), x.long() // 3,
            (x > 3).to(torch.uint8), x.to(torch.bfloat16).float(), x.int().float())


# more gotchas: zero-size, views written in place, out=, dtype copies, data-dependent

def c_zero_size(d):
    e = torch.empty(0, device=d)
    z = torch.zeros((0, 4), device=d)
    return e, torch.cat([z, _x(d)]), torch.tensor([], device=d), z.sum(0)


def c_view_inplace(d):
    x = _x(d)
    x.t().add_(1)
    x[:, 1].mul_(2)
    x[1:, ::2] += 5
    return x


def c_idx_accum(d):
    x = torch.zeros(5, device=d)
    i = torch.tensor([0, 2], device=d)
    x[i] += 1
    x[i] += torch.tensor([1.0, 3.0], device=d)
    return x


def c_cat_stack_out(d):
    out = torch.empty(6, 4, device=d)
    torch.cat([_x(d), _x(d)], out=out)
    s = torch.empty(2, 3, 4, device=d)
    torch.stack([_x(d), _x(d)], out=s)
    return out, s


def c_fill_0dim(d):
    x = torch.zeros(3, device=d)
    x.fill_(torch.tensor(2.5, device=d))
    y = torch.zeros(3, device=d)
    y.fill_(torch.tensor(4.0))  # a 0-dim CPU tensor is a legal argument
    return x, y


def c_copy_broadcast(d):
    x = torch.zeros(3, 4, device=d)
    x.copy_(torch.arange(4.0, device=d))
    y = torch.zeros(3, device=d)
    y.copy_(torch.tensor(5.0))
    return x, y


def c_copy_dtype(d):
    x = torch.zeros(3, dtype=torch.int32, device=d)
    x.copy_(torch.tensor([1, 2, 3], dtype=torch.int64))
    h = torch.zeros(3, dtype=torch.float64)
    h.copy_(x)
    p = _pinned(torch.tensor([7, 8, 9], dtype=torch.int64), d)
    y = p.to(d, dtype=torch.int32, non_blocking=True)
    return x, h.tolist(), y


def c_scalars(d):
    x = _x(d)
    return (x.sum().tolist(), x[0, :1].item(), len(x), [r.tolist() for r in x],
            bool(x.any()), (x > 100).any().item(), int(x.argmax()))


def c_unique_counts(d):
    x = torch.tensor([3, 1, 3, 2, 3], device=d)
    u, c = x.unique(return_counts=True)
    return u, c, torch.bincount(x), torch.searchsorted(torch.tensor([1, 3, 5], device=d), x)


def c_bitcast(d):
    x = torch.tensor([1.0, -2.0], device=d)
    return x.view(torch.int32), x.view(torch.uint8).shape


def c_split_sizes(d):
    return list(_x(d).split([1, 2])), list(_x(d).tensor_split(3, dim=1))


def c_half_types(d):
    return (torch.tensor([1.5, 2.25], dtype=torch.bfloat16, device=d).tolist(),
            torch.ones(2, dtype=torch.float16, device=d).sum())


def c_masked_scatter(d):
    x = torch.zeros(4, device=d)
    m = torch.tensor([True, False, True, False], device=d)
    return x.masked_scatter_(m, torch.tensor([5.0, 6.0], device=d))


def c_sum_dtype(d):
    x = torch.tensor([250, 10], dtype=torch.uint8, device=d)
    return x.sum(dtype=torch.int64), x.sum(), torch.full_like(x, 3, dtype=torch.int32)


def c_where_scalar(d):
    x = _x(d)
    return torch.where(x > 3, 1, 0), torch.where(x > 3, x, 0.5), x.clamp_min(3).clamp_max_(7)


def c_argsort_stable(d):
    x = torch.tensor([3, 1, 3, 2, 1], device=d)
    return x.sort(stable=True).indices, x.argsort(descending=True, stable=True)


def c_negative_index(d):
    x = _x(d)
    return x[-1], x[:, -2:], x[torch.tensor([-1, 0], device=d)]


def c_outer_einsum(d):
    a = torch.arange(3.0, device=d)
    return torch.outer(a, a), torch.einsum("i,j->ij", a, a), a.unsqueeze(1) @ a.unsqueeze(0)


def c_bitmask_logits(d):
    logits = _x(d)
    bitmask = torch.tensor([[-1], [5], [0]], dtype=torch.int32, device=d)
    bits = torch.arange(4, device=d, dtype=torch.int32)
    allowed = ((bitmask >> bits) & 1).bool()
    return logits.masked_fill(~allowed, float("-inf")).argmax(-1)


def c_new_tensor(d):
    x = _x(d)
    return (x.new_tensor([[1, 2]]), x.new_ones(2, dtype=torch.int64),
            torch.tensor([x.shape[0], 3], device=d))


def c_int_setitem(d):
    x = torch.zeros(3, 3, dtype=torch.int64, device=d)
    x[0, 1] = 5
    x[torch.tensor(2), 2] = 7
    x[1] = torch.tensor([1, 2, 3])
    return x


def c_inplace_view_after_queued_use(d):
    # queued kernels must keep the layout they were launched with (t_/unsqueeze_ later)
    x = torch.arange(6, device=d).reshape(2, 3).clone()
    y = x * 10
    x.t_()
    z = torch.arange(3, device=d).clone()
    w = z + 1
    z.unsqueeze_(0)
    return y, x, w, z


def _record_stream(dev):
    x = torch.ones(3, device=dev) * 4
    if torch.device(dev).type != "cpu":  # CPU tensors have no record_stream
        x.record_stream(torch.get_device_module(dev).current_stream())
    return x


CASES = {
    "zeros": lambda d: torch.zeros(2, 3, device=d),
    "ones_int": lambda d: torch.ones(4, dtype=torch.int32, device=d),
    "full": lambda d: torch.full((2, 2), 3.5, device=d),
    "full_bool": lambda d: torch.full((3,), True, device=d),
    "empty_then_fill": lambda d: torch.empty(3, 2, device=d).fill_(4.0),
    "empty_then_zero": lambda d: torch.empty(5, dtype=torch.int64, device=d).zero_(),
    "arange": lambda d: (torch.arange(5, device=d), torch.arange(2, 11, 3, device=d),
                         torch.arange(0.0, 1.0, 0.25, device=d)),
    "tensor_list": lambda d: (torch.tensor([1, 2, 3], device=d),
                              torch.tensor([[1.5, 2.5], [3.5, 4.5]], device=d),
                              torch.tensor([True, False], device=d),
                              torch.tensor(7, device=d), torch.as_tensor([4, 5], device=d)),
    "like_factories": lambda d: (torch.zeros_like(_x(d)), torch.ones_like(_x(d)),
                                 torch.full_like(_x(d), 2.0), _x(d).new_zeros(2),
                                 _x(d).new_full((2,), 9.0), _x(d).new_tensor([1.0, 2.0]),
                                 torch.empty_like(_x(d)).fill_(1.0)),
    "linspace_eye": lambda d: (torch.linspace(0, 1, 5, device=d), torch.eye(3, device=d)),
    "index_tensor": lambda d: (_x(d)[torch.tensor([2, 0], device=d)],
                               _x(d)[:, torch.tensor([3, 1], device=d)],
                               _x(d)[torch.tensor([0, 2], device=d),
                                     torch.tensor([1, 3], device=d)]),
    "index_select": lambda d: _x(d).index_select(1, torch.tensor([0, 0, 3], device=d)),
    "gather": lambda d: torch.gather(_x(d), 1, torch.tensor([[0, 1], [3, 3], [2, 0]], device=d)),
    "scatter": lambda d: torch.zeros(3, 5, device=d).scatter_(
        1, torch.tensor([[0, 4], [1, 2], [3, 3]], device=d), _x(d)[:, :2]),
    "scatter_add": lambda d: torch.zeros(5, device=d).scatter_add_(
        0, torch.tensor([0, 1, 1, 4], device=d), torch.ones(4, device=d)),
    "index_put": _index_put,
    "index_add": lambda d: torch.zeros(4, device=d).index_add_(
        0, torch.tensor([0, 3, 3], device=d), torch.tensor([1.0, 2.0, 3.0], device=d)),
    "cat_stack": lambda d: (torch.cat([_x(d), _x(d) * 2]), torch.cat([_x(d), _x(d)], dim=1),
                            torch.stack([_x(d)[0], _x(d)[1]]), torch.hstack([_x(d)[0], _x(d)[2]])),
    "views": _views,
    "inplace_views": _inplace_views,
    "split_chunk": lambda d: (list(_x(d).split(2, dim=1)), list(_x(d).chunk(3)),
                              list(_x(d).unbind(0))),
    "narrow_flip_roll": lambda d: (_x(d).narrow(1, 1, 2), _x(d).flip(0), _x(d).roll(1, 1),
                                   _x(d)[::2, 1::2].clone()),
    "expand_repeat": lambda d: (torch.arange(3, device=d).expand(2, 3).clone(),
                                torch.arange(3, device=d).repeat(2),
                                torch.arange(3, device=d)[:, None] * torch.ones(1, 2, device=d)),
    "inplace_ops": _inplace,
    "out_kwarg": _out_eq,
    "setitem_tensor": _setitem_tensor,
    "setitem_bool_mask": _setitem_mask,
    "reductions": lambda d: (_x(d).argmax(), _x(d).argmax(dim=1), _x(d).sum(), _x(d).sum(0),
                             _x(d).mean(1), _x(d).max(dim=1).values, _x(d).max(dim=1).indices,
                             _x(d).min(), _x(d).prod(1), _x(d).any(), (_x(d) > 100).all()),
    "cumsum": lambda d: (_x(d).cumsum(1), torch.tensor([1, 2, 3], device=d).cumsum(0)),
    "where_masked_fill": lambda d: (torch.where(_x(d) > 5, _x(d), -1.0),
                                    _x(d).masked_fill(_x(d) < 3, float("-inf")),
                                    torch.where(_x(d) > 5, _x(d), torch.zeros(3, 4, device=d))),
    "embedding": _embedding,
    "matmul": lambda d: (_x(d) @ _x(d).t(), torch.mm(_x(d), torch.ones(4, 2, device=d)),
                         torch.matmul(_x(d), torch.arange(4.0, device=d)),
                         torch.bmm(_x(d)[None], _x(d).t()[None])),
    "softmax_topk_sort": lambda d: (torch.softmax(_x(d), -1), _x(d).topk(2, dim=1).indices,
                                    _x(d).flip(1).sort(dim=1).values, Fn.log_softmax(_x(d), 0)),
    "dtype_conversions": _dtypes,
    "compare_bitwise": lambda d: (_x(d) == 3, _x(d) < 5, (_x(d) > 2) & (_x(d) < 9),
                                  torch.arange(8, device=d) ^ 5, ~(_x(d) > 2)),
    "cpu_tolist_item": lambda d: (_x(d).cpu(), _x(d).tolist(), _x(d)[1, 1].item(),
                                  torch.tensor([3, 4], device=d).tolist()),
    "int_float_bool": _int_conversions,
    "copy_both_ways": _copy_both_ways,
    "to_device": _to_device,
    "nonzero_bool_index": _nonzero,
    "unique_repeat_interleave": lambda d: (
        torch.unique(torch.tensor([3, 1, 3, 2], device=d)),
        torch.repeat_interleave(torch.tensor([1, 2], device=d), torch.tensor([2, 3], device=d))),
    "equal_allclose": lambda d: (torch.equal(_x(d), _x(d).clone()),
                                 torch.allclose(_x(d), _x(d) + 1e-9),
                                 torch.equal(_x(d), _x(d) + 1)),
    "pad_clamp": lambda d: (Fn.pad(_x(d), (1, 2)), _x(d).clamp(2, 8), torch.clamp(_x(d), min=4)),
    "elementwise_math": lambda d: (torch.exp(_x(d) / 10), torch.sqrt(_x(d)), _x(d) ** 2,
                                   torch.remainder(_x(d), 3),
                                   torch.div(_x(d), 4, rounding_mode="floor")),
    "scalar_0dim_cpu_mix": lambda d: (_x(d) + torch.tensor(2.0), _x(d) * torch.tensor(3)),
    "masked_fill_inplace": lambda d: _x(d).masked_fill_(_x(d) > 6, -2.0),
    "record_stream": lambda d: _record_stream(d),
    "host_randn_to_device": lambda d: torch.randn(
        3, 2, generator=torch.Generator().manual_seed(0)).to(d) * 2,
    "int_bitmask": lambda d: ((torch.full((2, 3), -1, dtype=torch.int32, device=d) >> 3) & 0x0F0F,
                              torch.arange(64, device=d).view(2, 32).to(torch.int32).bitwise_or(1)),
    **{name[2:]: fn for name, fn in list(globals().items()) if name.startswith("c_")},
    "triu_diag": lambda d: (torch.triu(_x(d)), torch.diagonal(_x(d)).clone(),
                            torch.tril(_x(d), -1)),
}


def _run_sim(policy: str, fn):
    with sim_runtime(parse_policy(policy)) as rt:
        return _host(fn(rt.device))


def test_case_count():
    assert len(CASES) >= 40


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_op_matches_cpu(case, policy):
    fn = CASES[case]
    want = _host(fn("cpu"))
    got = _run_sim(policy, fn)
    assert _same(got, want), f"{case} under {policy}:\n sim {got}\n cpu {want}"


# --- determinism ------------------------------------------------------------------------

def _multi_stream_program(rt):
    m = rt.module
    S, F = m.Stream(), m.Stream()
    rt.label(S, "schedule")
    rt.label(F, "forward")
    x = torch.zeros(8, dtype=torch.int64, device=rt.device)  # ints: poison compares equal
    outs = []
    for i in range(6):
        with m.stream(F):
            x.add_(i)
            y = x * 2
            e = m.Event()
            e.record()
        with m.stream(S):
            z = (x + 1).sum()
            if i % 2:
                S.wait_event(e)
            outs.append(z)
            w = y[:4].clone()
        if i % 3 == 2:
            outs.append(w.tolist())
    m.synchronize()
    return [o.item() if isinstance(o, torch.Tensor) else o for o in outs]


@pytest.mark.parametrize("policy", ["random(5)", "pct(3,3)", "lazy", "stall(forward)"])
def test_same_policy_same_schedule(policy):
    runs = []
    for _ in range(2):
        with sim_runtime(parse_policy(policy)) as rt:
            values = _multi_stream_program(rt)
            order = [(op.stream, op.seq, op.name) for op in rt.trace.executed]
            times = [(op.start, op.end) for op in rt.trace.executed]
        runs.append((values, order, times))
    assert runs[0] == runs[1]
    assert len(runs[0][1]) > 30


def test_different_seeds_differ():
    """The seed matters (otherwise random() would be one fixed schedule)."""
    orders = set()
    for seed in range(6):
        with sim_runtime(parse_policy(f"random({seed})")) as rt:
            _multi_stream_program(rt)
            orders.add(tuple((op.stream, op.seq) for op in rt.trace.executed))
    assert len(orders) > 1


# --- device errors, poison, mixed devices -----------------------------------------------

def test_embedding_out_of_range_surfaces_at_next_sync_lazy():
    with sim_runtime(parse_policy("lazy")) as rt:
        w = torch.zeros(10, 4, device=rt.device)
        ids = torch.tensor([1, 12], device=rt.device)  # 12 is out of range
        out = Fn.embedding(ids, w)  # enqueued, not run: no error yet
        more = out.sum() + 1  # still fine: asynchronous
        assert rt.dev.error is None
        with pytest.raises(SimDeviceError, match="embedding"):
            more.item()


def test_embedding_out_of_range_sticky():
    """Like a CUDA device-side assert, the error stays: every later sync raises it."""
    with sim_runtime(parse_policy("lazy")) as rt:
        w = torch.zeros(10, 4, device=rt.device)
        out = Fn.embedding(torch.tensor([99], device=rt.device), w)
        with pytest.raises(SimDeviceError):
            rt.module.synchronize()
        with pytest.raises(SimDeviceError):
            torch.ones(1, device=rt.device).tolist()
        del out


def test_embedding_out_of_range_eager_still_raises_at_sync():
    with sim_runtime(parse_policy("eager")) as rt:
        w = torch.zeros(10, 4, device=rt.device)
        ids = torch.tensor([1, 12], device=rt.device)
        out = Fn.embedding(ids, w)  # the enqueue itself never raises
        with pytest.raises(SimDeviceError):
            out.cpu()


@pytest.mark.parametrize("policy", ["eager", "lazy"])
def test_empty_is_poisoned(policy):
    """Fresh blocks read as poison (every tensor is kept alive, so no block is reused)."""
    with sim_runtime(parse_policy(policy)) as rt:
        d = rt.device
        keep = [torch.empty(3, dtype=torch.int32, device=d),
                torch.empty(2, dtype=torch.int64, device=d), torch.empty(4, device=d),
                torch.empty(2, dtype=torch.bool, device=d),
                torch.empty(2, dtype=torch.uint8, device=d)]
        keep.append(torch.empty_like(torch.zeros(2, device=d)))
        keep.append(torch.zeros(1, device=d).new_empty(2, dtype=torch.int32))
        got = [t.tolist() for t in keep]
        assert got[0] == [0x5A5A5A5A] * 3 and got[1] == [0x5A5A5A5A] * 2
        assert all(math.isnan(v) for v in got[2]) and got[3] == [True, True]
        assert got[4] == [0x5A, 0x5A] and all(math.isnan(v) for v in got[5])
        assert got[6] == [0x5A5A5A5A] * 2


def test_queued_output_is_poison_until_it_runs():
    """An op's output exists at enqueue but holds garbage until the kernel executes."""
    with sim_runtime(parse_policy("stall(forward)")) as rt:
        m = rt.module
        F = m.Stream()
        rt.label(F, "forward")
        x = torch.ones(4, dtype=torch.int32, device=rt.device)
        m.synchronize()
        with m.stream(F):
            y = x * 3
        assert y._buf.tolist() == [0x5A5A5A5A] * 4  # not run: stall(forward)
        with m.stream(F):
            assert y.tolist() == [3, 3, 3, 3]


def test_mixed_devices_raise():
    with sim_runtime(parse_policy("eager")) as rt:
        d = rt.device
        x = torch.ones(3, device=d)
        with pytest.raises(RuntimeError, match="same device"):
            x + torch.ones(3)
        with pytest.raises(RuntimeError, match="same device"):
            torch.cat([x, torch.ones(3)])
        with pytest.raises(RuntimeError, match="same device"):
            x.index_select(0, torch.tensor([0, 1]))
        # 0-dim CPU tensors and Python scalars are legal, as on CUDA
        assert (x + torch.tensor(2.0)).tolist() == [3.0, 3.0, 3.0]
        assert (x * 2).tolist() == [2.0, 2.0, 2.0]


def test_shape_errors_raise_at_the_call_even_when_queued():
    with sim_runtime(parse_policy("lazy")) as rt:
        a = torch.ones(2, 3, device=rt.device)
        with pytest.raises(RuntimeError):
            a @ torch.ones(2, 3, device=rt.device)
        with pytest.raises(RuntimeError):
            a.view(4)


def test_tensor_repr_never_syncs():
    with sim_runtime(parse_policy("lazy")) as rt:
        x = torch.ones(3, device=rt.device) * 2
        pending = rt.dev.pending_ops()
        assert "SimTensor" in repr(x) and str(x) == repr(x) and f"{x}" == repr(x)
        assert rt.dev.pending_ops() == pending > 0


def test_numpy_refused():
    with sim_runtime(parse_policy("eager")) as rt:
        with pytest.raises(TypeError, match="cpu"):
            torch.ones(2, device=rt.device).numpy()


def test_data_dependent_ops_sync_the_current_stream_only():
    from harness.runtime.trace import SyncRecord

    with sim_runtime(parse_policy("lazy")) as rt:
        m = rt.module
        F = m.Stream()
        rt.label(F, "forward")
        with m.stream(F):
            other = torch.ones(3, device=rt.device) * 2  # pending on forward
        x = torch.tensor([0, 4, 0, 5], device=rt.device) * 1  # pending on default
        default = rt.dev.default_stream
        assert len(default.pending) >= 1 and len(F.pending) == 2
        nz = x.nonzero()
        assert not default.pending  # the implicit sync drained the current stream
        sel = x[x > 4]
        syncs = [r.label for r in rt.trace.log if isinstance(r, SyncRecord)]
        assert [s for s in syncs if s.startswith("implicit sync")] == [
            "implicit sync: nonzero.default", "implicit sync: index.Tensor"]
        assert len(F.pending) == 2  # forward was not touched
        assert nz.tolist() == [[1], [3]] and sel.tolist() == [5]
        assert other._buf.isnan().all()  # still poison: forward never ran


# --- pinned memory and compiled code on the simulator --------------------------------------

def test_every_way_to_pin_is_watched_pinned_memory():
    """``torch.tensor(..., pin_memory=True)`` pins inside C++, past dispatch modes; the
    simulator still sees it (upstream sglang stages H2D copies this way)."""
    from harness.runtime import hostmem
    from harness.detect import detect
    with sim_runtime(parse_policy("stall(side)")) as rt:
        made = [torch.tensor([1, 2, 3], dtype=torch.int64, pin_memory=True),
                torch.zeros(3, dtype=torch.int64).pin_memory(),
                torch.empty(3, dtype=torch.int64, pin_memory=True)]
        for t in made:
            assert t.is_pinned() and hostmem.lookup(t) is not None
        side = rt.module.Stream()
        rt.label(side, "side")
        with rt.module.stream(side):
            dev = made[0].to(rt.device, non_blocking=True)  # reads pinned memory later
        made[0].fill_(9)  # host overwrite while the copy is still queued: WAR
        races = detect(rt.trace)
        rt.synchronize()
    assert [r.kind for r in races] == ["WAR"]
    assert races[0].second.actor == "host"
    assert torch.tensor([1], pin_memory=False).tolist() == [1]  # outside: plain torch
    del dev


def test_compiled_function_runs_eagerly_on_the_simulator():
    """A ``torch.compile``d function (upstream's debug asserts are) runs op by op through
    the simulator's handler, with its ops on the stream and in the trace."""
    double = torch.compile(lambda x: x * 2, dynamic=True)
    with sim_runtime() as rt:
        x = torch.ones(3, device=rt.device)
        y = double(x)
        assert y.cpu().tolist() == [2.0, 2.0, 2.0]
        assert "mul.Tensor" in [op.name for op in rt.trace.ops()]


def test_device_less_stream_calls_mean_the_gpu_outside_a_simulator_session(monkeypatch):
    """Once ``sim`` is registered torch names it the accelerator, so a device-less
    ``torch.get_device_module().current_stream()`` (upstream's graph capture) reaches the
    simulator's module during a CUDA run too: outside a session, on a machine with a GPU,
    it answers with the GPU's stream; inside one, with the simulator's."""
    from harness.runtime import sim
    gpu_stream = object()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: gpu_stream)
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: gpu_stream)
    assert sim.module.current_stream() is gpu_stream
    assert sim.module.default_stream(0) is gpu_stream
    with sim_runtime(parse_policy("eager")) as rt:
        assert isinstance(sim.module.current_stream(), sim.Stream)
        assert sim.module.current_stream() is torch.get_device_module(rt.device).current_stream()
