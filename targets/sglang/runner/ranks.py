"""A single-rank server's process groups, as upstream's ``GroupCoordinator``.

``init_torch_distributed`` builds the groups from ``torch.distributed``, which a
simulator run has not; the decode graph runner only asks its groups to enter
``graph_capture`` (upstream's own method: the capture stream, no communicator to switch
for one rank) and to ``barrier`` between warm-ups (a group of one waits for no one). So
the groups are upstream's class, built from ``__new__`` with what a one-rank group holds.

Where they are kept is the release's (``contract.RANK_WAYS``, read from its source):
stamped on the runtime context's parallel namespace where that holds them until
``clear_stamp``; else -- where the namespace reads the ranks and groups through
``parallel_state``'s getters -- in the module globals ``initialize_model_parallel`` and
``initialize_dp_attention`` set, restored when the run ends (``scope``).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator, Optional

import torch

_PS = "sglang.srt.distributed.parallel_state"
_DPA = "sglang.srt.layers.dp_attention"
# the module globals a one-rank server's ``init_distributed_environment`` /
# ``initialize_model_parallel`` set (every group the one rank's) and
# ``initialize_dp_attention`` sets (attention DP off: rank 0 of width 1)
GROUP_GLOBALS = ("_WORLD", "_TP", "_ATTN_TP", "_ATTN_CP", "_DCP", "_MOE_DP", "_MOE_EP",
                 "_MOE_TP", "_PP", "_SELF_PP")
DP_ATTENTION_GLOBALS = {"_ATTN_DP_RANK": 0, "_ATTN_DP_SIZE": 1}


def way() -> Optional[str]:
    """How the installed release keeps them (``contract.RANK_WAYS``, read from its source;
    None: neither way)."""
    from targets import static
    from targets.sglang.boundary import contract
    return contract.server_config_way(static.package_root("sglang"), contract.RANK_WAYS)


def single_rank_group(device):
    from sglang.srt.distributed.parallel_state import GroupCoordinator

    class SingleRankGroup(GroupCoordinator):
        def barrier(self) -> None:
            pass  # one rank: nothing to wait for

    g = SingleRankGroup.__new__(SingleRankGroup)
    g.unique_name, g.rank, g.ranks, g.world_size = "specrace:single-rank", 0, [0], 1
    g.rank_in_group, g.local_rank, g.local_size = 0, 0, 1
    g.device_module = torch.get_device_module(torch.device(device))
    g.device = torch.device(device)
    # one rank: no communicator of any kind (the graph runner asks for the PCIe-IPC
    # all-reduce's before capture on a GPU)
    g.ca_comm = g.pynccl_comm = g.pymscclpp_comm = g.qr_comm = None
    g.torch_symm_mem_comm = g.pcie_ipc_comm = None
    g.hpu_communicator = g.xpu_communicator = None
    g.use_hpu_communicator = g.use_xpu_communicator = False
    g.cpu_group = g.device_group = None
    return g


def publish(device) -> None:
    """The ranks and groups as a one-GPU server's launcher and ``init_torch_distributed``
    leave them: rank 0 everywhere (decode context parallelism off: its rank 0, as
    ``publish`` stamps it), no data-parallel controller (``dp_rank`` None), one
    single-rank group for every kind of parallelism -- on the context, or in
    ``parallel_state``'s and ``dp_attention``'s globals (``contract.RANK_WAYS``)."""
    g = single_rank_group(device)
    if way() == "parallel_state_globals":
        import importlib
        ps, dpa = importlib.import_module(_PS), importlib.import_module(_DPA)
        for name in GROUP_GLOBALS:
            if hasattr(ps, name):  # those the release declares (0.5.18 has no _SELF_PP)
                setattr(ps, name, g)
        for name, value in DP_ATTENTION_GLOBALS.items():
            setattr(dpa, name, value)
        return
    from sglang.srt import runtime_context as rc
    rc.get_parallel().override_permanently(
        tp_rank=0, pp_rank=0, attn_tp_rank=0, attn_dp_rank=0, attn_cp_rank=0,
        attn_dcp_rank=0, moe_ep_rank=0, dp_rank=None, tp_group=g, pp_group=g)


def parallel_state():
    """What ``ModelRunner.__init__`` is handed of the placement where the release has it
    (``ParallelState``: 0.5.19, 0.5.20): a one-GPU server's, no data-parallel controller
    (the scheduler's ``dp_rank`` None); None where the runner reads the context."""
    if way() != "parallel_state_globals":
        return None
    from sglang.srt.distributed.parallel_state_wrapper import ParallelState
    if hasattr(ParallelState, "trivial"):  # 0.5.16 on
        return ParallelState.trivial(dp_rank=None)
    # 0.5.15: no factory; the fields as its scheduler fills them for one rank (every rank
    # 0, every width 1), no data-parallel controller
    return ParallelState(**{f.name: None if f.name == "dp_rank" else
                            1 if f.name.endswith("_size") else 0
                            for f in dataclasses.fields(ParallelState)})


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """A run's ranks and groups outlive it in no module: the globals ``publish`` sets are
    restored when the run ends (the context's stamp goes with the context:
    ``upstream.server_config``)."""
    if way() != "parallel_state_globals":
        yield
        return
    import importlib
    saved = [(m, n, getattr(m, n)) for m, names in (
        (importlib.import_module(_PS), GROUP_GLOBALS),
        (importlib.import_module(_DPA), tuple(DP_ATTENTION_GLOBALS))) for n in names
        if hasattr(m, n)]
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
