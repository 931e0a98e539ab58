"""The transfer rung (``ops.classify_transfer``), backend-free: which kind a call is and
the rules that follow from it. Both backends implement only the effects, so one table
here pins what both do; the simulator's traces check the effects end to end."""
from __future__ import annotations

import pytest
import torch

from harness.runtime import ops
from harness.runtime.ops import Transfer
from harness.runtime.sim.runtime import sim_runtime
from harness.runtime.trace import COPY_D2H, COPY_D2H_ITEM, COPY_H2D, OpKind, SyncRecord

aten = torch.ops.aten
DEV, HOST_T = torch.zeros(2), torch.zeros(2)  # "device" and host tensors, told by is_dev


def _is_dev(t: torch.Tensor) -> bool:
    return t is DEV


def _classify(func, args, kwargs=None):
    # "cuda" parses on any machine; the classifier only compares the ``device=`` type
    return ops.classify_transfer(ops.info(func), args, kwargs or {}, _is_dev, "cuda")


@pytest.mark.parametrize("func, args, kwargs, kind", [
    (aten._to_copy.default, (DEV,), {"device": "cpu"}, Transfer.D2H_NEW),
    (aten._to_copy.default, (HOST_T,), {"device": "cuda"}, Transfer.H2D_NEW),
    (aten._to_copy.default, (DEV,), {"dtype": torch.int32}, Transfer.D2D),  # stays put
    (aten._to_copy.default, (HOST_T,), {"dtype": torch.int32}, Transfer.HOST),
    (aten.copy_.default, (HOST_T, DEV), {}, Transfer.D2H_INTO),
    (aten.copy_.default, (DEV, HOST_T), {}, Transfer.H2D_INTO),
    (aten.copy_.default, (DEV, DEV), {}, Transfer.D2D),
    (aten.copy_.default, (HOST_T, HOST_T), {}, Transfer.HOST),
    (aten._local_scalar_dense.default, (DEV,), {}, Transfer.D2H_ITEM),
    (aten._local_scalar_dense.default, (HOST_T,), {}, Transfer.HOST),
])
def test_each_call_is_one_kind(func, args, kwargs, kind):
    assert _classify(func, args, kwargs).kind is kind


def test_non_blocking_is_read_from_either_spelling():
    assert _classify(aten.copy_.default, (HOST_T, DEV, True)).non_blocking
    assert _classify(aten.copy_.default, (HOST_T, DEV), {"non_blocking": True}).non_blocking
    assert not _classify(aten.copy_.default, (HOST_T, DEV)).non_blocking
    assert _classify(aten._to_copy.default, (DEV,),
                     {"device": "cpu", "non_blocking": True}).non_blocking


@pytest.mark.parametrize("kind, non_blocking, pinned, waits", [
    (Transfer.D2H_NEW, False, False, True),
    (Transfer.D2H_NEW, True, True, False),  # the only D2H the host does not wait for
    (Transfer.D2H_INTO, True, False, True),  # non_blocking into pageable memory: it waits
    (Transfer.D2H_INTO, True, True, False),
    (Transfer.H2D_NEW, False, True, True),  # memcpy_and_sync
    (Transfer.H2D_INTO, True, False, False),  # a pageable source is staged first
    (Transfer.D2H_ITEM, False, False, True),
])
def test_when_the_host_waits(kind, non_blocking, pinned, waits):
    assert ops.TransferCall(kind, None, None, non_blocking).host_waits(pinned) is waits


def test_names_labels_and_pinning_follow_the_kind():
    call = ops.TransferCall(Transfer.D2H_NEW, None, None, True)
    assert (call.op_name, call.sync_label, call.pins_result) == (COPY_D2H, ops.SYNC_D2H, True)
    assert ops.TransferCall(Transfer.D2H_INTO, None, None, False).sync_label == ops.SYNC_D2H_INTO
    assert ops.TransferCall(Transfer.H2D_INTO, None, None, True).op_name == COPY_H2D
    item = ops.TransferCall(Transfer.D2H_ITEM, None, None, False)
    assert (item.op_name, item.sync_label) == (COPY_D2H_ITEM, ops.SYNC_ITEM)
    assert not ops.TransferCall(Transfer.H2D_NEW, None, None, True).pins_result


def test_the_simulator_does_what_the_rung_decided():
    with sim_runtime() as rt:
        x = torch.arange(4).to(rt.device)  # a blocking H2D
        x.cpu()  # a blocking D2H into new memory
        x.to("cpu", non_blocking=True)  # into new pinned memory: no sync
        x.sum().item()
        host = torch.empty(4, dtype=x.dtype)
        host.copy_(x)  # into pageable memory: a sync
        log = rt.trace.log
    copies = [(r.name, r.kind) for r in log if getattr(r, "kind", None) == OpKind.COPY]
    assert copies == [(COPY_H2D, OpKind.COPY), (COPY_D2H, OpKind.COPY),
                      (COPY_D2H, OpKind.COPY), (COPY_D2H_ITEM, OpKind.COPY),
                      (COPY_D2H, OpKind.COPY)]
    assert [r.label for r in log if isinstance(r, SyncRecord)] == [
        ops.SYNC_H2D, ops.SYNC_D2H, ops.SYNC_ITEM, ops.SYNC_D2H_INTO]
