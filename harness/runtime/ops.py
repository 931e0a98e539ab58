"""One classification of aten ops, shared by both backends' dispatch.

Every aten op that reaches a backend is sorted onto one rung of one ladder, decided once
per overload and cached (``info``):

1. **special** -- ops with device semantics of their own: transfers (``_to_copy``,
   ``copy_``, ``.item()``: the transfer rung below), allocations (``empty*``),
   ``record_stream``, pinning;
2. **host** -- no device tensor involved (decided per call, ``Backend.on_device``);
3. **composite** -- CompositeImplicitAutograd ops are decomposed, so the parts are seen;
4. **inplace view** / **view** -- metadata only (``t_()``, ``view``, ``select``...);
5. **no kernel** -- allocation or metadata work that runs nothing on the device
   (``_unsafe_view``, ``resize_``, ``set_``...), and **query** -- ops returning no tensor
   and mutating nothing (``is_same_size``): metadata questions;
6. **kernel** -- a launch on the current stream: it reads its inputs (not the ones a
   ``*_like`` / ``new_*`` factory uses for metadata only), reads and writes its in-place
   arguments (``copy_`` only writes), writes its fresh outputs.

What each rung *does* is the backend's: the simulator queues closures on its simulated
streams, the CUDA capture lets CUDA run the op and records it for the detector. A backend
subclasses ``Backend`` and names a handler per rung (and per special it models); the
ladder itself, the read/write rule, which ops sync the host and the sync labels live here
only, so the two backends cannot drift apart.

**The transfer rung.** ``classify_transfer`` decides what one call of a transfer op is --
a ``Transfer``: D2H into new host memory (``x.to("cpu")``) or into a host tensor
(``host.copy_(dev)``), H2D into new device memory or into a device tensor, ``.item()``,
device to device (an ordinary kernel), or host only -- and the rules that follow from it
(the op's name, whether the host waits, the sync label, whether the result is pinned).
``Backend.transfer`` routes the call to the backend's effect for that kind
(``d2h_new``, ``d2h_into``, ``h2d_new``, ``h2d_into``, ``d2h_item``, ``d2d``,
``host_op``): the simulator queues the copy on its stream, the CUDA capture records it.
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from harness.runtime.schema import OpEffects, effects
from harness.runtime.trace import COPY_D2H, COPY_D2H_ITEM, COPY_H2D

aten = torch.ops.aten

# Rungs of the ladder (``OpInfo.route``)
COMPOSITE, INPLACE_VIEW, VIEW, NO_KERNEL, QUERY, KERNEL = (
    "composite", "inplace_view", "view", "no_kernel", "query", "kernel")

# Host-sync labels: the trace shows these; both backends use the same words.
SYNC_D2H = "blocking D2H (.cpu/.tolist)"
SYNC_D2H_INTO = "blocking D2H (copy_ into pageable memory)"
SYNC_ITEM = "blocking D2H (.item)"
SYNC_H2D = "blocking H2D"  # PyTorch's blocking H2D is memcpy_and_sync on the stream


class SyncRule(enum.Enum):
    """Which calls of an op whose output size depends on data sync the host (``OpInfo.sync``)."""

    ALWAYS = "always"  # nonzero, masked_select, unique, equal...
    BOOL_INDEX = "bool_index"  # indexing with a bool / uint8 mask (an integer index: no)
    NO_OUTPUT_SIZE = "no_output_size"  # repeat_interleave without ``output_size=``


def implicit_sync_label(name: str) -> str:
    return f"implicit sync: {name}"


def _ops(*names: str) -> frozenset:
    out = set()
    for n in names:
        packet, _, overload = n.partition(".")
        op = getattr(getattr(aten, packet, None), overload or "default", None)
        if op is not None:
            out.add(op)
    return frozenset(out)


# Specials: op -> the name of the backend method that models it.
SPECIALS: Dict[Any, str] = {
    aten._to_copy.default: "transfer",
    aten.copy_.default: "transfer",
    aten._local_scalar_dense.default: "transfer",
    aten.empty.memory_format: "empty",
    aten.empty_strided.default: "empty",
    aten.new_empty.default: "empty",
    aten.new_empty_strided.default: "empty",
    aten.empty_like.default: "empty_like",
    aten.record_stream.default: "record_stream",
    aten.lift_fresh.default: "first_arg",
    aten.detach_.default: "first_arg",
    aten._pin_memory.default: "pin",
    aten.is_pinned.default: "is_pinned",
}

# Ops whose output shape depends on data: CUDA syncs the current stream to size them.
_SYNC_OPS = _ops("nonzero.default", "masked_select.default", "_unique2.default",
                 "unique_dim.default", "unique_consecutive.default", "_unique.default",
                 "equal.default", "is_nonzero.default", "bincount.default")
_BOOL_INDEX_OPS = _ops("index.Tensor", "index_put_.default", "index_put.default",
                       "_index_put_impl_.default")
_REPEAT_INTERLEAVE = _ops("repeat_interleave.Tensor")
# No kernel runs: allocation or metadata only (the storage gets an id when first used).
NO_KERNEL_OPS = _ops("empty.memory_format", "empty_strided.default", "new_empty.default",
                     "new_empty_strided.default", "empty_like.default", "_unsafe_view.default",
                     "resize_.default", "resize_as_.default", "set_.source_Storage",
                     "set_.source_Storage_storage_offset", "set_.source_Tensor",
                     "set_.default", "detach_.default", "lift_fresh.default",
                     "is_pinned.default", "_has_same_storage_numel.default")
# Ops returning no tensor that do read device data (not metadata queries).
_READS_WITHOUT_TENSOR_RESULT = _ops("_assert_async.default", "_assert_async.msg")
COPY = aten.copy_.default
ITEM = aten._local_scalar_dense.default


READ, WRITE = 1, 2  # the flags of an argument's access rule (``OpInfo.arg_rules``)


class OpInfo:
    """What the ladder knows about one overload (immutable once built)."""

    __slots__ = ("func", "name", "route", "special", "effects", "metadata_reads",
                 "touches_data", "sync", "arg_rules", "kwarg_rules", "returns_fresh")

    def __init__(self, func: Any) -> None:
        self.func = func
        self.name: str = func.__name__  # "add.Tensor": the trace's op name
        self.special: Optional[str] = SPECIALS.get(func)
        eff = self.effects = effects(func)
        base = func._schema.name.split("::", 1)[-1]
        # ``*_like`` / ``new_*`` factories use their input's metadata only (as CSAN models)
        self.metadata_reads = base.endswith("_like") or base.startswith("new_")
        inplace_view = torch.Tag.inplace_view in func.tags
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(),
                                                          "CompositeImplicitAutograd"):
            route = COMPOSITE
        elif inplace_view:
            route = INPLACE_VIEW
        elif eff.is_view:
            route = VIEW
        elif func in NO_KERNEL_OPS:
            route = NO_KERNEL
        elif self._is_query(func, eff):
            route = QUERY
        else:
            route = KERNEL
        self.route = route
        # Host ops on pinned memory are host accesses unless they touch no data: views,
        # restrides, allocations, ``*_like`` factories (a view is not a host read).
        self.touches_data = not (eff.is_view or inplace_view or func in NO_KERNEL_OPS
                                 or self.metadata_reads)
        self.sync: Optional[SyncRule] = (
            SyncRule.ALWAYS if func in _SYNC_OPS else
            SyncRule.BOOL_INDEX if func in _BOOL_INDEX_OPS else
            SyncRule.NO_OUTPUT_SIZE if func in _REPEAT_INTERLEAVE else None)
        # The read/write rule of each tensor argument, as ``READ | WRITE`` flags. In-place
        # arguments are read and written (``copy_``'s only written); inputs are read unless
        # a ``*_like`` / ``new_*`` factory uses their metadata only. ``arg_rules`` has one
        # entry per positional parameter (None: not a tensor), ``kwarg_rules`` holds the
        # keyword-only tensors as (name, rule): the argument walkers index them directly.
        positional = [None] * len(func._schema.arguments)
        keyword = []
        for key, write in eff.tensor_args:
            read = func is not COPY if write else not self.metadata_reads
            rule = (READ if read else 0) | (WRITE if write else 0)
            if type(key) is int:
                positional[key] = rule
            else:
                keyword.append((key, rule))
        # the first return is not an argument (a kernel's fresh output, most ops)
        self.returns_fresh = not eff.return_alias or eff.return_alias[0] is None
        self.arg_rules: Tuple[Optional[int], ...] = tuple(positional)
        self.kwarg_rules: Tuple[Tuple[str, int], ...] = tuple(keyword)

    @staticmethod
    def _is_query(func: Any, eff: OpEffects) -> bool:
        returns_tensor = any("Tensor" in str(r.type) for r in func._schema.returns)
        return (not returns_tensor and not eff.mutates and func not in _SYNC_OPS
                and func not in _READS_WITHOUT_TENSOR_RESULT)

    def __repr__(self) -> str:
        return f"<OpInfo {self.name} {self.special or self.route}>"


@functools.cache
def info(func: Any) -> OpInfo:
    """The classification of ``func`` (cached per overload: asked for every op)."""
    return OpInfo(func)


def syncs_host(op: OpInfo, args: tuple, kwargs: dict) -> bool:
    """Does CUDA sync the current stream to size this op's output?"""
    rule = op.sync
    if rule is None:
        return False
    if rule is SyncRule.ALWAYS:
        return True
    if rule is SyncRule.BOOL_INDEX:  # (indices: positional, a tensor list)
        indices = args[1] if len(args) > 1 else None
        for t in indices if isinstance(indices, (list, tuple)) else (indices,):
            if isinstance(t, torch.Tensor) and t.dtype in _MASK_DTYPES:
                return True
        return False
    return kwargs.get("output_size") is None


_MASK_DTYPES = (torch.bool, torch.uint8)


def data_accesses(op: OpInfo, args: tuple, kwargs: dict,
                  access_of: Callable[[torch.Tensor], Any],
                  other: Optional[Callable[[torch.Tensor, OpInfo], None]] = None
                  ) -> Tuple[List[Any], List[Any]]:
    """(reads, writes) of a kernel's device-tensor arguments, by the rule above
    (``OpInfo.arg_rules`` / ``kwarg_rules``). ``access_of(t)`` is the backend's access of a
    device tensor and None for any other tensor, which ``other(t, op)`` then sees. (The
    CUDA backend's walker; the simulator's, which also unwraps, is ``sim.launch.scan``.)"""
    reads: List[Any] = []
    writes: List[Any] = []
    # (``arg_rules`` has an entry per positional parameter: never fewer than ``args``)
    for v, rule in zip(args, op.arg_rules):
        if rule is not None:
            note_accesses(op, v, rule, access_of, other, reads, writes)
    if kwargs:
        for name, rule in op.kwarg_rules:
            note_accesses(op, kwargs.get(name), rule, access_of, other, reads, writes)
    return reads, writes


def note_accesses(op: OpInfo, v: Any, rule: int, access_of: Callable[[torch.Tensor], Any],
                  other: Optional[Callable[[torch.Tensor, OpInfo], None]], reads: list,
                  writes: list) -> None:
    """One tensor argument's accesses (a Tensor[] / Tensor?[] is the one nesting; None, or
    a number passed for a Tensor, accesses nothing)."""
    for t in (v,) if isinstance(v, torch.Tensor) else v if isinstance(v, (list, tuple)) else ():
        if not isinstance(t, torch.Tensor):
            continue
        a = access_of(t)
        if a is None:
            if other is not None:
                other(t, op)
        else:
            if rule & READ:
                reads.append(a)
            if rule & WRITE:
                writes.append(a)


# --- the transfer rung ------------------------------------------------------------------

class Transfer(enum.Enum):
    """What one call of a transfer op (``_to_copy``, ``copy_``, ``.item()``) is. The value
    names the backend method that implements its effect (``Backend.transfer``)."""

    D2H_NEW = "d2h_new"  # x.to("cpu"[, non_blocking]): into new host memory
    D2H_INTO = "d2h_into"  # host.copy_(dev[, non_blocking]): into an existing host tensor
    H2D_NEW = "h2d_new"  # x.to(dev[, non_blocking]): into new device memory
    H2D_INTO = "h2d_into"  # dev.copy_(host[, non_blocking]): into an existing device tensor
    D2H_ITEM = "d2h_item"  # .item() of a device tensor: a D2H the host always waits for
    D2D = "d2d"  # both ends on the device (or a dtype change there): an ordinary kernel
    HOST = "host_op"  # no device memory involved: the backend's ``host_op``


_D2H = (Transfer.D2H_NEW, Transfer.D2H_INTO)
_H2D = (Transfer.H2D_NEW, Transfer.H2D_INTO)
_OP_NAMES = {Transfer.D2H_NEW: COPY_D2H, Transfer.D2H_INTO: COPY_D2H,
             Transfer.H2D_NEW: COPY_H2D, Transfer.H2D_INTO: COPY_H2D,
             Transfer.D2H_ITEM: COPY_D2H_ITEM}
_SYNC_LABELS = {Transfer.D2H_NEW: SYNC_D2H, Transfer.D2H_INTO: SYNC_D2H_INTO,
                Transfer.H2D_NEW: SYNC_H2D, Transfer.H2D_INTO: SYNC_H2D,
                Transfer.D2H_ITEM: SYNC_ITEM}


@dataclass(frozen=True)
class TransferCall:
    """One call of a transfer op as ``classify_transfer`` found it."""

    kind: Transfer
    src: Any  # the tensor copied from
    dst: Any  # the tensor copied into (``copy_``); None: ``_to_copy`` / ``.item()``
    non_blocking: bool

    @property
    def op_name(self) -> str:
        """The copy op's name in the trace (``D2D`` and ``HOST`` make no copy op)."""
        return _OP_NAMES[self.kind]

    @property
    def sync_label(self) -> str:
        return _SYNC_LABELS[self.kind]

    @property
    def pins_result(self) -> bool:
        """PyTorch pins the new host memory of a non_blocking D2H (so it can be async)."""
        return self.kind is Transfer.D2H_NEW and self.non_blocking

    def host_waits(self, pinned_host: bool) -> bool:
        """Does the host wait for the copy (a sync of the current stream after it)?
        ``pinned_host``: the host end is pinned memory. A D2H returns before it lands only
        when non_blocking *and* into pinned memory; torch's blocking H2D is a copy plus a
        sync of the stream (memcpy_and_sync), a non_blocking one (a pageable source is
        staged first) returns at once; ``.item()`` always waits."""
        kind = self.kind
        if kind in _D2H:
            return not (self.non_blocking and pinned_host)
        if kind in _H2D:
            return not self.non_blocking
        return kind is Transfer.D2H_ITEM


def classify_transfer(op: OpInfo, args: tuple, kwargs: dict,
                      is_dev: Callable[[torch.Tensor], bool], dev_type: str) -> TransferCall:
    """What this call of ``_to_copy`` / ``copy_`` / ``_local_scalar_dense`` is, for a backend
    whose device tensors ``is_dev`` tells and whose device type is ``dev_type``."""
    src = args[0]
    src_dev = is_dev(src)
    if op.func is COPY:  # dst.copy_(src[, non_blocking])
        dst, src = src, args[1]
        non_blocking = (bool(args[2]) if len(args) > 2
                        else bool(kwargs.get("non_blocking", False)))
        dst_dev, src_dev = src_dev, isinstance(src, torch.Tensor) and is_dev(src)
        kind = (Transfer.D2D if dst_dev and src_dev else Transfer.H2D_INTO if dst_dev
                else Transfer.D2H_INTO if src_dev else Transfer.HOST)
        return TransferCall(kind, src, dst, non_blocking)
    if op.func is ITEM:
        return TransferCall(Transfer.D2H_ITEM if src_dev else Transfer.HOST, src, None, False)
    # _to_copy(src, *, dtype, device, non_blocking, ...): no ``device=`` stays where src is
    target = kwargs.get("device")
    dst_dev = torch.device(target).type == dev_type if target is not None else src_dev
    kind = (Transfer.D2D if src_dev and dst_dev else Transfer.D2H_NEW if src_dev
            else Transfer.H2D_NEW if dst_dev else Transfer.HOST)
    return TransferCall(kind, src, None, bool(kwargs.get("non_blocking", False)))


class Backend:
    """One backend's handlers for the ladder's rungs. ``dispatch`` picks the handler once
    per overload (``_handlers``, per class) and calls ``handler(self, op, args, kwargs)``.

    Subclasses define ``on_device(args, kwargs)``, ``host_op`` and one method per rung
    (``composite``, ``inplace_view``, ``view``, ``no_kernel``, ``query``, ``kernel``), and
    a method for each special of ``SPECIALS`` they model; a special they leave out is
    classified like any other op. The transfer specials are routed here (``transfer``):
    a backend defines ``dev_type``, ``is_dev(tensor)`` and one effect per ``Transfer``
    kind, called as ``effect(op, call, args, kwargs)``.
    """

    _handlers: Dict[int, Tuple[OpInfo, Any, Any]]
    dev_type: str  # the device type a ``device=`` argument names for this backend

    def is_dev(self, t: torch.Tensor) -> bool:
        raise NotImplementedError

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls._handlers = {}

    def on_device(self, args: tuple, kwargs: dict) -> bool:
        raise NotImplementedError

    def dispatch(self, func: Any, args: tuple, kwargs: dict, on_device: bool = False) -> Any:
        """``on_device``: the caller knows a device tensor is among the arguments (the
        simulator's dispatch sees its tensor type in ``types``), so the walk that
        ``on_device(args, kwargs)`` makes is spared."""
        # Keyed by ``id``: an overload's ``__hash__`` is Python code, asked for every op.
        # The entry holds ``func`` itself, so no other object can take its id meanwhile.
        entry = self._handlers.get(id(func))
        if entry is None:
            entry = self._handlers[id(func)] = self._entry(func)
        op, special, routed = entry
        if special is not None:
            return special(self, op, args, kwargs)
        if not (on_device or self.on_device(args, kwargs)):
            return self.host_op(op, args, kwargs)
        return routed(self, op, args, kwargs)

    @classmethod
    def _entry(cls, func: Any) -> Tuple[OpInfo, Any, Any]:
        op = info(func)
        special = getattr(cls, op.special, None) if op.special is not None else None
        return op, special, getattr(cls, op.route)

    def host_op(self, op: OpInfo, args: tuple, kwargs: dict) -> Any:
        raise NotImplementedError

    def transfer(self, op: OpInfo, args: tuple, kwargs: dict) -> Any:
        """The transfer rung: what the call is is decided here, what it does is the
        backend's effect for that kind."""
        call = classify_transfer(op, args, kwargs, self.is_dev, self.dev_type)
        if call.kind is Transfer.HOST:
            return self.host_op(op, args, kwargs)
        return getattr(self, call.kind.value)(op, call, args, kwargs)
