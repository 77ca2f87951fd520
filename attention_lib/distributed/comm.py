"""One rank in its process group: who it is, what it sends, what it counts.

The pieces every distributed attention of this package shares: the
:class:`CommStats` a caller passes in to count, the description of a rank
(:class:`Comm`), the sends and receives (one hop round the ring, an
all-to-all), and the agreement of every rank on the shard shapes before any
computation (:func:`join_group`), so that a bad split is refused on every
rank at once.

Explained in chapter 14, *Attention across machines*.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from ..validation import check_attention_args, check_choice, check_instance
from .layout import LAYOUTS


@dataclass
class CommStats:
    """What one rank sent and held: pass one to a distributed attention to count.

    The counts come from the tensors themselves: every tensor handed to a send
    adds its bytes, and the K/V blocks (and their gradients) that the rank holds
    at once are summed at every step. Nothing is counted unless a ``CommStats``
    is passed in explicitly.

    Explained in chapter 14, *Attention across machines*.

    Attributes:
        bytes_sent: bytes this rank sent to other ranks (forward and backward
            add up; read it between the two to separate them).
        blocks: score blocks this rank computed in the forward pass, in units of
            one ``(N/P, N/P)`` block (a zig-zag chunk pair is a quarter; a block
            on the causal diagonal counts whole).
        peak_kv_bytes: the most bytes of keys and values (and, in the backward
            pass, of their gradients) this rank held at once.
    """

    bytes_sent: int = 0
    blocks: float = 0.0
    peak_kv_bytes: int = 0


def holding(stats: CommStats | None, tensors: Sequence[Tensor]) -> None:
    """Note the K/V bytes a rank holds right now in its peak (each tensor once)."""
    if stats is not None:
        held = sum(t.nbytes for t in {id(t): t for t in tensors}.values())
        stats.peak_kv_bytes = max(stats.peak_kv_bytes, held)


class Comm(NamedTuple):
    """Who this rank is in its group, what it computes, and what it counts."""

    group: dist.ProcessGroup | None
    rank: int
    world: int
    is_causal: bool
    layout: str
    scale: float
    stats: CommStats | None

    def chunks(self, rank: int) -> tuple[int, ...]:
        """The indices of the sequence chunks that ``rank`` holds."""
        if self.layout == "contiguous":
            return (rank,)
        return (rank, 2 * self.world - 1 - rank)


def exchange(
    sends: Sequence[tuple[int, Tensor]], recvs: Sequence[tuple[int, Tensor]], comm: Comm
) -> list:
    """Post every send and receive at once (``batch_isend_irecv``); count the sends."""
    ops = [dist.P2POp(dist.isend, t, group=comm.group, group_peer=p) for p, t in sends]
    ops += [dist.P2POp(dist.irecv, t, group=comm.group, group_peer=p) for p, t in recvs]
    if comm.stats is not None:
        comm.stats.bytes_sent += sum(t.nbytes for _, t in sends)
    return dist.batch_isend_irecv(ops) if ops else []


def pass_on(tensors: Sequence[Tensor], comm: Comm) -> tuple[list, list[Tensor]]:
    """Send ``tensors`` one hop round the ring and post the receipt of the previous
    rank's; returns the requests and the buffers that will hold what arrives."""
    incoming = [torch.empty_like(t) for t in tensors]
    after, before = (comm.rank + 1) % comm.world, (comm.rank - 1) % comm.world
    reqs = exchange([(after, t) for t in tensors], [(before, t) for t in incoming], comm)
    return reqs, incoming


def all_to_all(x: Tensor, split_dim: int, cat_dim: int, comm: Comm) -> Tensor:
    """Cut ``x`` into ``P`` pieces along ``split_dim``, send piece ``j`` to rank ``j``,
    and join the pieces received from every rank along ``cat_dim``."""
    pieces = [p.contiguous() for p in x.chunk(comm.world, dim=split_dim)]
    received = [torch.empty_like(p) for p in pieces]
    received[comm.rank] = pieces[comm.rank]
    others = [j for j in range(comm.world) if j != comm.rank]
    reqs = exchange([(j, pieces[j]) for j in others], [(j, received[j]) for j in others], comm)
    for req in reqs:
        req.wait()
    return torch.cat(received, dim=cat_dim)


def check_shards(
    query: Tensor, key: Tensor, value: Tensor, is_causal: bool, scale: float | None, **extra
) -> None:
    """One rank's own checks: shards ``(B, H, N/P, D)`` of one self-attention."""
    check_attention_args(query, key, value, dropout_p=0.0, scale=scale, is_causal=is_causal)
    if not query.dim() == key.dim() == value.dim() == 4 or query.shape[:3] != key.shape[:3]:
        shapes = [tuple(t.shape) for t in (query, key, value)]
        raise ValueError(f"query, key, value must be shards (B, H, N/P, D), got {shapes}")
    check_choice("layout", extra.get("layout", "contiguous"), LAYOUTS)
    check_instance("stats", extra.get("stats"), (CommStats, type(None)), "a CommStats or None")


def _check_group(shapes: list[tuple[int, ...]], layout: str, split_heads: bool) -> None:
    """The checks every rank makes on every rank's shapes, so all refuse together."""
    world, lengths, heads = len(shapes), [s[2] for s in shapes], shapes[0][1]
    if len(set(shapes)) > 1:  # chapter 14 prints this message and the next
        raise ValueError(f"every rank must hold a shard of one shape, so N must be divisible by "
                         f"P = {world}; got shard lengths {lengths}, shapes {shapes}")  # fmt: skip
    if layout == "zigzag" and lengths[0] % 2:  # a zig-zag shard is two chunks
        raise ValueError(f"N must be divisible by 2P = {2 * world}, got shards of {lengths[0]}")
    if split_heads and heads % world:
        raise ValueError(f"Ulysses gives each rank H / P whole heads: H must be divisible by P "
                         f"= {world}, got H = {heads} (or use ring attention)")  # fmt: skip


def join_group(
    query: Tensor,
    value: Tensor,
    group: dist.ProcessGroup | None,
    is_causal: bool,
    scale: float | None,
    stats: CommStats | None,
    layout: str = "contiguous",
    split_heads: bool = False,
) -> Comm:
    """Agree with every rank of the group on the shard shapes (one small
    all-gather), so that a bad split is refused on every rank at once and none
    waits for a partner that has already given up; then describe this rank."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    mine = torch.tensor([*query.shape, value.shape[-1]], device=query.device)
    shapes = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(shapes, mine, group=group)
    _check_group([tuple(s.tolist()) for s in shapes], layout, split_heads)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    return Comm(group, rank, world, is_causal, layout, scale, stats)
