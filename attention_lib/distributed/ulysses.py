"""DeepSpeed-Ulysses (Jacobs et al., 2023): from a sequence split to a head split and back;
and Ulysses x ring (USP, Fang and Zhao, 2024) on a grid of ranks.

Explained in chapter 14, *Attention across machines*.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..masks import Causal
from ..tiled import tiled_core
from ..validation import check_int
from .comm import Comm, CommStats, all_to_all, check_shards, join_group
from .ring import ring_attention


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


def usp_groups(ulysses_size: int) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """Make the rows and columns of the ``U x R`` grid of the default group
    (every rank must call it, in the same order as its other groups) and
    return this rank's ``(ulysses_group, ring_group)``. Rank ``r`` is column
    ``r mod U`` of row ``r // U``: a row is a Ulysses group (inside a node, on
    the fast link), a column a ring (across nodes); with contiguous shards,
    row ``g`` holds chunk ``g`` of the ``R`` chunks the ring passes round.

    Explained in chapter 14, *Attention across machines*.

    Args:
        ulysses_size: ``U``, the ranks of a row; must divide the world size.

    Raises:
        TypeError, ValueError: if ``ulysses_size`` is not an int ``>= 1`` that
            divides the world size.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    u = check_int("ulysses_size", ulysses_size, minimum=1, maximum=world)
    if world % u:
        raise ValueError(f"ulysses_size must divide the world size {world}, got {u}")
    rows = [dist.new_group([g * u + c for c in range(u)]) for g in range(world // u)]
    columns = [dist.new_group([g * u + c for g in range(world // u)]) for c in range(u)]
    return rows[rank // u], columns[rank % u]


def usp_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    ulysses_group: dist.ProcessGroup,
    ring_group: dist.ProcessGroup,
    is_causal: bool = False,
    scale: float | None = None,
    stats: CommStats | None = None,
) -> Tensor:
    """Exact attention over a sequence split across a ``U x R`` grid of ranks:
    Ulysses' all-to-all in the row, :func:`ring_attention` down the column.

    Call it on every rank with that rank's contiguous shard (rank ``r`` holds
    positions ``r N/P .. (r + 1) N/P - 1``) and the groups of
    :func:`usp_groups`. Per pass each rank sends ``(U - 1) / U`` of each of
    its four shards (Q, K, V, output) in the rows and ``2 (R - 1)`` shards'
    worth of K/V down the column: ``4 (U - 1) / U + 2 (R - 1)`` shards, between
    Ulysses' ``4 (P - 1) / P`` and the ring's ``2 (P - 1)``. ``H`` must be
    divisible by ``U``, not by ``P``. Differentiable; the backward pass is the
    ring's backward between the all-to-alls in reverse.

    Explained in chapter 14, *Attention across machines*.

    Args:
        query: this rank's ``(B, H, N/P, D)`` shard of the queries.
        key: this rank's ``(B, H, N/P, D)`` shard of the keys.
        value: this rank's ``(B, H, N/P, D_v)`` shard of the values.
        ulysses_group: this rank's row (``U`` ranks holding consecutive shards).
        ring_group: this rank's column (``R`` ranks, one per row).
        is_causal: causal attention over the whole sequence.
        scale: multiplier of the scores; defaults to ``1 / sqrt(D)``.
        stats: a :class:`CommStats` counting the bytes this rank sends in both
            groups; ``None`` counts nothing.

    Returns:
        This rank's ``(B, H, N/P, D_v)`` shard of the output.

    Raises:
        TypeError, ValueError: as :func:`~attention_lib.distributed.ulysses_attention`
            (``H`` must be divisible by ``U``) and :func:`ring_attention`.

    Shapes:
        - query, key: ``(B, H, N/P, D)``
        - value: ``(B, H, N/P, D_v)``
        - output: ``(B, H, N/P, D_v)``
    """
    check_shards(query, key, value, is_causal, scale, stats=stats)
    row = join_group(query, value, ulysses_group, is_causal, scale, stats, split_heads=True)
    # the row's shards, (B, H, N/P, D) each -> the row's chunk for H/U heads, (B, H/U, N/R, D)
    q, k, v = (_AllToAll.apply(t, 1, 2, row) for t in (query, key, value))
    out = ring_attention(q, k, v, is_causal=is_causal, group=ring_group, scale=row.scale,
                         stats=stats)  # fmt: skip
    return _AllToAll.apply(out, 2, 1, row)  # (B, H/U, N/R, D_v) -> (B, H, N/P, D_v)
