"""Kernel launch on the simulated device: the ``kernel`` rung of the ``ops`` ladder.

Outputs are allocated now (or the op runs at once when the policy lets the idle stream run
it: the fast path), the computation is queued as a closure on the current stream, and the
op is recorded with what it read and wrote and the user frame that issued it.
"""
from __future__ import annotations

from typing import Any, List, Tuple

import torch

from seams import context
from harness.runtime import ops
from harness.runtime.ops import READ, WRITE
from harness.runtime.trace import OpRecord, user_frame
from harness.runtime.sim.streams import current_device
from harness.runtime.sim.meta import DATA_DEPENDENT, Meta, is_user_error, meta_outputs
from harness.runtime.sim.tensor import (NESTED, SimTensor, access, adopt, device_access, kernel_arg,
                     new_storage, unwrap)


def _host_arg(t: torch.Tensor, op: ops.OpInfo) -> None:
    """CUDA refuses a (non-scalar) CPU tensor mixed with device tensors; so do we."""
    if t.dim() > 0 and t.device.type == "cpu":
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at "
                           f"least two devices, sim:0 and cpu! (in {op.func.name()})")



def scan(op: ops.OpInfo, args: tuple, kwargs: dict) -> Tuple[tuple, dict, list, list]:
    """One walk over a kernel's arguments for all the simulator needs of them: the
    arguments as its CPU kernel takes them (device memory for each device tensor, the CPU
    for the ``sim`` device) and what it reads and writes on the device, by the rule
    ``ops.data_accesses`` applies on CUDA (``OpInfo.arg_rules``). A host tensor where a
    device one is due is refused, as CUDA refuses it (``_host_arg``). Asked for every
    kernel: unwrapping and the access rule took two walks before."""
    rules = op.arg_rules
    bargs = []
    reads: list = []
    writes: list = []
    # (``rules`` has an entry per positional parameter: never fewer than ``args``)
    for v, rule in zip(args, rules):
        if type(v) is SimTensor:
            if rule:
                acc = v._acc or access(v)
                if rule & READ:
                    reads.append(acc)
                if rule & WRITE:
                    writes.append(acc)
            bargs.append(v._buf)
        elif isinstance(v, NESTED):
            if rule is not None:  # Tensor[] / Tensor?[]
                ops.note_accesses(op, v, rule, device_access, _host_arg, reads, writes)
            bargs.append(unwrap(v))
        else:
            # (``rule`` 0: a ``*_like`` / ``new_*`` factory's input, read for its metadata
            # only -- a host tensor is fine there, as on CUDA: ``zeros_like(host,
            # device="cuda")``)
            if rule and isinstance(v, torch.Tensor):
                _host_arg(v, op)
            bargs.append(v)
    if kwargs:
        for name, rule in op.kwarg_rules:
            ops.note_accesses(op, kwargs.get(name), rule, device_access, _host_arg, reads,
                              writes)
        kwargs = {k: unwrap(v) for k, v in kwargs.items()}
    return tuple(bargs), kwargs, reads, writes


def launch(backend: ops.Backend, op: ops.OpInfo, args: tuple, kwargs: dict) -> Any:
    """The kernel rung (``SimBackend.kernel`` itself: one Python frame less per op)."""
    dev = context.current().sim_device or current_device()  # (the latter: the error, when none)
    stream = dev.current
    # (launch is always 3 runtime frames below the caller: dispatch, __torch_dispatch__)
    frame = user_frame(4)
    func = op.func
    bargs, bkwargs, reads, writes = scan(op, args, kwargs)
    name = op.name
    idle = not stream.pending and dev.policy.runs_idle(stream.sid, dev.trace.stream_names)
    meta = None
    syncs = op.sync is not None and ops.syncs_host(op, args, kwargs)
    if not idle or syncs:
        meta = None if syncs else meta_outputs(func, args, kwargs)
        if syncs or meta is DATA_DEPENDENT:
            # CUDA syncs the host here (nonzero, boolean masks, .equal); so do we, and run
            # the op at once: its output's size is known only then.
            dev.host_sync([(stream.sid, stream.enq)], ops.implicit_sync_label(name), frame)
            idle, meta = True, None

    if idle:
        # Run the kernel now, then let the policy decide nothing else; the op is recorded
        # exactly as a queued one would be.
        try:
            # ``func._op`` is what ``OpOverload.__call__`` calls: one Python frame less
            result = func._op(*bargs, **bkwargs)
        except Exception as exc:
            # A kernel failing on its *data* (an out-of-range gather index) is a device-side
            # error: CUDA reports it at the next sync, not at the launch, on every schedule.
            # So take the queued path below, whose kernel fails when it executes and leaves
            # the sticky error. Errors the host would raise (shapes, dtypes) raise here.
            if meta is not None or is_user_error(exc):
                raise
            meta = meta_outputs(func, args, kwargs)
            if meta is DATA_DEPENDENT:
                raise
            idle = False
        if idle:
            if type(result) is torch.Tensor and op.returns_fresh:
                # one fresh output, most kernels: ``_wrap_outputs`` for that case alone
                outs = adopt(dev, result, frame, name)
                writes.append(outs._acc or access(outs))
            else:
                new: List[SimTensor] = []
                outs = _wrap_outputs(dev, result, args, kwargs, op.effects, frame, name, new)
                writes.extend([access(o) for o in new])
            dev.ran_at_once(stream, OpRecord(stream.sid, name, reads, writes, frame))
            return outs

    new = []
    outs = _alloc_outputs(dev, meta, args, kwargs, op.effects, frame, name, new)
    writes.extend([access(o) for o in new])  # fresh outputs: written by the op
    bargs = kernel_arg(args)
    bkwargs = kernel_arg(kwargs)
    out_bufs = [o._buf for o in new]
    run = func._op  # (``OpOverload.__call__``'s own call)

    def kernel() -> None:
        res = run(*bargs, **bkwargs)
        if not out_bufs:  # in-place, or no returns: it wrote its arguments
            return
        fresh = [r for r in _flat(res) if r is not None and not _aliases_arg(r, bargs, bkwargs)]
        for dst, src in zip(out_bufs, fresh):
            dst.copy_(src)

    dev.enqueue(OpRecord(stream.sid, name, reads, writes, frame, fn=kernel))
    return outs


def _flat(res: Any) -> List[Any]:
    if isinstance(res, (list, tuple)):
        return list(res)
    return [res]


def _aliases_arg(r: torch.Tensor, bargs, bkwargs) -> bool:
    for v in bargs:
        if v is r:
            return True
    for v in bkwargs.values():
        if v is r:
            return True
    return False


def _wrap_outputs(dev, result, args, kwargs, eff, frame, name: str, new: list) -> Any:
    """Map a real result back to wrappers: aliased returns are the argument wrappers,
    fresh ones move into blocks of the allocator (named after the op ``name``, and
    appended to ``new``)."""
    if isinstance(result, torch.Tensor):
        owner = eff.return_alias[0] if eff.return_alias else None
        if owner is not None:
            return args[owner] if type(owner) is int else kwargs.get(owner)
        t = adopt(dev, result, frame, name)
        new.append(t)
        return t
    items = _flat(result)
    wrapped = []
    for i, r in enumerate(items):
        owner = eff.return_alias[i] if i < len(eff.return_alias) else None
        if owner is not None:
            wrapped.append(args[owner] if type(owner) is int else kwargs.get(owner))
        elif isinstance(r, torch.Tensor):
            t = adopt(dev, r, frame, name)
            new.append(t)
            wrapped.append(t)
        else:
            wrapped.append(r)
    # Non-sequence results (a Python bool/int from ops like aten.equal) are returned as
    # themselves: ``type(False)([False])`` would be ``bool([False]) == True``.
    if not isinstance(result, (list, tuple)):
        return wrapped[0]
    return type(result)(wrapped)


def _alloc_outputs(dev, meta, args, kwargs, eff, frame, name: str, new: list) -> Any:
    """Outputs of a queued kernel, from the meta run: argument wrappers for aliased
    returns, fresh (poisoned) storage named after the op ``name`` for the rest
    (appended to ``new``)."""
    if meta == ():  # no returns: the op writes its arguments only (meta.py)
        return None
    single = isinstance(meta, Meta)
    metas = [meta] if single else list(meta)
    outs = []
    for i, m in enumerate(metas):
        owner = eff.return_alias[i] if i < len(eff.return_alias) else None
        if owner is not None:
            outs.append(args[owner] if type(owner) is int else kwargs.get(owner))
        elif m is None:
            outs.append(None)
        else:
            shape, stride, dtype = m
            t = new_storage(dev, shape, stride, dtype, frame, name)
            new.append(t)
            outs.append(t)
    return outs[0] if single else (tuple(outs) if isinstance(meta, tuple) else outs)
