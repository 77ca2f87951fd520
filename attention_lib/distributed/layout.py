"""How a sequence is laid over the ranks: contiguous or zig-zag shards.

Explained in chapter 14, *Attention across machines*.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..validation import check_instance, check_int

#: The two ways to lay a sequence over the ranks: ``"contiguous"`` (rank ``r``
#: holds chunk ``r`` of ``P``) and ``"zigzag"`` (rank ``r`` holds chunks ``r``
#: and ``2P - 1 - r`` of ``2P``).
LAYOUTS = ("contiguous", "zigzag")


def zigzag_split(x: Tensor, world_size: int, dim: int = -2) -> list[Tensor]:
    """Cut a sequence into ``world_size`` zig-zag shards.

    The sequence (length ``N`` along ``dim``) is cut into ``2P`` equal chunks;
    shard ``r`` is chunk ``r`` followed by chunk ``2P - 1 - r``, so under a
    causal mask every rank holds one early and one late chunk and does the same
    work (the layout of ring-flash-attention's zig-zag ring and of Brandon et
    al.'s striped attention, at chunk granularity).

    Explained in chapter 14, *Attention across machines*.

    Args:
        x: tensor with the sequence along ``dim``.
        world_size: the number of ranks ``P``.
        dim: the sequence dimension (default ``-2``, as in ``(B, H, N, D)``).

    Returns:
        ``P`` tensors of length ``N / P`` along ``dim``.

    Raises:
        TypeError: if ``x`` is not a tensor or ``world_size`` not an int.
        ValueError: if ``world_size < 1`` or ``N`` is not divisible by ``2P``.
    """
    check_instance("x", x, Tensor, "a torch.Tensor")
    world = check_int("world_size", world_size, minimum=1)
    if x.shape[dim] % (2 * world):  # 2P equal chunks
        raise ValueError(f"N={x.shape[dim]} must be a multiple of 2 * world_size = {2 * world}")
    chunks = x.chunk(2 * world, dim=dim)
    return [torch.cat([chunks[r], chunks[2 * world - 1 - r]], dim=dim) for r in range(world)]


def zigzag_merge(shards: Sequence[Tensor], dim: int = -2) -> Tensor:
    """Put zig-zag shards back in sequence order: the inverse of :func:`zigzag_split`.

    Explained in chapter 14, *Attention across machines*.

    Args:
        shards: the ``P`` shards, in rank order.
        dim: the sequence dimension.

    Returns:
        The whole sequence, length ``P`` times a shard's.

    Raises:
        ValueError: if a shard has an odd length along ``dim``.
    """
    halves = [shard.chunk(2, dim=dim) for shard in shards]
    if any(len(h) != 2 or h[0].shape != h[1].shape for h in halves):
        raise ValueError(f"zigzag shards have two equal halves, got {[s.shape for s in shards]}")
    return torch.cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim=dim)
