"""Gathering first: every rank gathers all keys and values, then attends locally.

The simple, exact baseline that ring attention improves on: ``O(N)`` K/V
memory per rank.

Explained in chapter 14, *Attention across machines*.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..masks import Causal
from ..tiled import tiled_core
from .comm import Comm, CommStats, all_to_all, check_shards, holding, join_group


class _AllGather(torch.autograd.Function):
    """Every rank's shard, joined along the sequence; backward sums each rank's
    gradient of a shard back to the shard's owner (a reduce-scatter)."""

    @staticmethod
    def forward(ctx, x: Tensor, comm: Comm) -> Tensor:
        ctx.comm = comm
        return all_to_all(x.repeat(1, comm.world, 1, 1), 1, 2, comm)  # (B, H, N, D)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        comm = ctx.comm
        pieces = all_to_all(grad, 2, 1, comm)  # (B, P * H, N/P, D): each rank's dx
        return pieces.unflatten(1, (comm.world, -1)).sum(dim=1), None


def allgather_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    is_causal: bool = False,
    group: dist.ProcessGroup | None = None,
    scale: float | None = None,
    stats: CommStats | None = None,
) -> Tensor:
    """The simple way: gather every rank's keys and values, then attend locally.

    Exact, but every rank holds the keys and values of the whole sequence,
    ``O(N)`` memory per rank, which is what ring attention avoids. The backward
    pass sends each rank's gradient of every shard to the shard's owner.
    Contiguous layout only.

    Explained in chapter 14, *Attention across machines*.

    Args, returns, raises and shapes: as :func:`ring_attention`, without
    ``layout``.
    """
    check_shards(query, key, value, is_causal, scale, stats=stats)
    comm = join_group(query, value, group, is_causal, scale, stats)
    k, v = _AllGather.apply(key, comm), _AllGather.apply(value, comm)  # (B, H, N, D)
    holding(stats, [k, v])
    causal = Causal(comm.rank * query.shape[2]) if is_causal else None  # global positions
    return tiled_core(query, k, v, None, causal=causal, dropout_p=0.0, scale=comm.scale)
