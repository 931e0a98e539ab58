"""A single-rank server's process groups, as upstream's ``GroupCoordinator``.

``init_torch_distributed`` builds the groups from ``torch.distributed``, which a
simulator run has not; the decode graph runner only asks its groups to enter
``graph_capture`` (upstream's own method: the capture stream, no communicator to switch
for one rank) and to ``barrier`` between warm-ups (a group of one waits for no one). So
the groups are upstream's class, built from ``__new__`` with what a one-rank group holds.
"""
from __future__ import annotations

import torch


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
    g.ca_comm = g.pynccl_comm = g.pymscclpp_comm = g.qr_comm = None
    g.torch_symm_mem_comm = None
    return g


def publish(device) -> None:
    """The current runtime context's ranks and groups as a one-GPU server's launcher
    and ``init_torch_distributed`` stamp them: rank 0 everywhere (decode context
    parallelism off: its rank 0, as ``publish`` stamps it), no data-parallel controller
    (``dp_rank`` None), one single-rank group for tensor and pipeline parallelism."""
    from sglang.srt import runtime_context as rc
    g = single_rank_group(device)
    rc.get_parallel().override_permanently(
        tp_rank=0, pp_rank=0, attn_tp_rank=0, attn_dp_rank=0, attn_cp_rank=0,
        attn_dcp_rank=0, moe_ep_rank=0, dp_rank=None, tp_group=g, pp_group=g)
