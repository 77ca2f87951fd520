"""DeepSpeed-Ulysses (Jacobs et al., 2023): from a sequence split to a head split and back.

Explained in chapter 14, *Attention across machines*.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..masks import Causal
from ..tiled import tiled_core
from .comm import Comm, CommStats, all_to_all, check_shards, join_group


class _AllToAll(torch.autograd.Function):
    """An all-to-all whose backward pass is the all-to-all the other way round."""

    @staticmethod
    def forward(ctx, x: Tensor, split_dim: int, cat_dim: int, comm: Comm) -> Tensor:
        ctx.args = (cat_dim, split_dim, comm)
        return all_to_all(x, split_dim, cat_dim, comm)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        return all_to_all(grad, *ctx.args), None, None, None


def ulysses_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    is_causal: bool = False,
    group: dist.ProcessGroup | None = None,
    scale: float | None = None,
    stats: CommStats | None = None,
) -> Tensor:
    """DeepSpeed-Ulysses: from a sequence split to a head split and back.

    An all-to-all gives each rank the *whole* sequence for ``H / P`` of the
    heads (rank ``j`` receives head group ``j`` of every rank's shard); each
    rank runs ordinary attention on its heads (chapter 11's tiled core); a
    second all-to-all returns every rank its positions for all ``H`` heads.
    Each rank sends ``(P - 1) / P`` of each of its four shards (Q, K, V and
    the output) per pass, so the traffic per rank falls as ``1 / P``, but ``P``
    can be at most ``H``: the head count must be divisible by ``P``. The
    backward pass is the same all-to-alls in reverse.

    Runs in the caller's process group, like :func:`ring_attention`, and
    refuses an uneven split or ``H`` not divisible by ``P`` on every rank.

    Explained in chapter 14, *Attention across machines*.

    Args:
        query: this rank's ``(B, H, N/P, D)`` shard of the queries
            (contiguous layout).
        key: this rank's ``(B, H, N/P, D)`` shard of the keys.
        value: this rank's ``(B, H, N/P, D_v)`` shard of the values.
        is_causal: causal attention over the whole sequence, as in
            :func:`ring_attention`.
        group: the process group (default: the default group).
        scale: multiplier of the scores; defaults to ``1 / sqrt(D)``.
        stats: a :class:`CommStats` that counts the bytes this rank sends;
            ``None`` counts nothing.

    Returns:
        This rank's ``(B, H, N/P, D_v)`` shard of the output.

    Raises:
        TypeError: as :func:`ring_attention`.
        ValueError: as :func:`ring_attention`, and if ``H`` is not divisible
            by ``P``.

    Shapes:
        - query, key: ``(B, H, N/P, D)``
        - value: ``(B, H, N/P, D_v)``
        - output: ``(B, H, N/P, D_v)``
    """
    check_shards(query, key, value, is_causal, scale, stats=stats)
    comm = join_group(query, value, group, is_causal, scale, stats, split_heads=True)
    # sequence-sharded (B, H, N/P, D) -> head-sharded (B, H/P, N, D)
    q, k, v = (_AllToAll.apply(t, 1, 2, comm) for t in (query, key, value))
    causal = Causal(0) if is_causal else None
    out = tiled_core(q, k, v, None, causal=causal, dropout_p=0.0, scale=comm.scale)
    return _AllToAll.apply(out, 2, 1, comm)  # (B, H/P, N, D_v) -> (B, H, N/P, D_v)
