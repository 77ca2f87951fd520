"""Attention across machines: ring attention and DeepSpeed-Ulysses on torch.distributed.

When one sequence no longer fits one device, each of ``P`` processes holds
``N / P`` of its positions: a shard ``(B, H, N/P, D)`` of the queries, keys and
values. Two ways to compute exact attention over the whole sequence:

* **Ring attention** (Liu et al., 2023): the K/V shards travel round a ring of
  the ranks, one hop per step; each rank attends its queries to the block it
  holds and merges the partial results through their log-sum-exp, exactly the
  online softmax of chapter 10. After ``P`` steps every query has seen every
  key, and no rank ever held more than two K/V blocks. The backward pass sends
  the blocks round again, with their gradients ``dK``/``dV`` travelling along
  and arriving home after ``P`` steps.
* **DeepSpeed-Ulysses** (Jacobs et al., 2023): an all-to-all turns the
  sequence split into a head split (each rank gets the whole sequence for
  ``H / P`` heads), attention runs locally, and a second all-to-all turns it
  back. It needs ``H`` divisible by ``P``.

The functions run inside the caller's process group (the default one when
``group=None``): they never create or destroy one. :func:`launch` starts
``P`` local processes with a gloo (CPU) or NCCL (GPU) group for a worker
function of this module, for the book's notebook and the tests; under
``torchrun --nproc-per-node P`` the command-line entry
``python -m attention_lib.distributed`` runs the same check.

Explained in chapter 12, *Attention across machines*.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from .masks import Causal, causal_mask
from .memory import TensorMemory
from .tiled import OnlineSoftmaxState, online_softmax_update, tiled_core
from .validation import check_attention_args, check_choice, check_instance, check_int, check_real

#: The two ways to lay a sequence over the ranks: ``"contiguous"`` (rank ``r``
#: holds chunk ``r`` of ``P``) and ``"zigzag"`` (rank ``r`` holds chunks ``r``
#: and ``2P - 1 - r`` of ``2P``).
LAYOUTS = ("contiguous", "zigzag")


@dataclass
class CommStats:
    """What one rank sent and held: pass one to a distributed attention to count.

    The counts come from the tensors themselves: every tensor handed to a send
    adds its bytes, and the K/V blocks (and their gradients) that the rank holds
    at once are summed at every step. Nothing is counted unless a ``CommStats``
    is passed in explicitly.

    Explained in chapter 12, *Attention across machines*.

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


def _holding(stats: CommStats | None, tensors: Sequence[Tensor]) -> None:
    """Note the K/V bytes a rank holds right now in its peak (each tensor once)."""
    if stats is not None:
        held = sum(t.nbytes for t in {id(t): t for t in tensors}.values())
        stats.peak_kv_bytes = max(stats.peak_kv_bytes, held)


class _Comm(NamedTuple):
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


# --------------------------------------------------------------------------- layouts


def zigzag_split(x: Tensor, world_size: int, dim: int = -2) -> list[Tensor]:
    """Cut a sequence into ``world_size`` zig-zag shards.

    The sequence (length ``N`` along ``dim``) is cut into ``2P`` equal chunks;
    shard ``r`` is chunk ``r`` followed by chunk ``2P - 1 - r``, so under a
    causal mask every rank holds one early and one late chunk and does the same
    work (the layout of ring-flash-attention's zig-zag ring and of Brandon et
    al.'s striped attention, at chunk granularity).

    Explained in chapter 12, *Attention across machines*.

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
    if x.shape[dim] % (2 * world):
        raise ValueError(f"zigzag_split cuts the sequence into 2P equal chunks: its length must "
                         f"be divisible by {2 * world}, got {x.shape[dim]}")  # fmt: skip
    chunks = x.chunk(2 * world, dim=dim)
    return [torch.cat([chunks[r], chunks[2 * world - 1 - r]], dim=dim) for r in range(world)]


def zigzag_merge(shards: Sequence[Tensor], dim: int = -2) -> Tensor:
    """Put zig-zag shards back in sequence order: the inverse of :func:`zigzag_split`.

    Explained in chapter 12, *Attention across machines*.

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


def _pairs(comm: _Comm, source: int):
    """``(i, j, causal)`` for every query chunk ``i`` of this rank that sees key
    chunk ``j`` of ``source``'s block: whole (``None``), on the diagonal
    (``Causal(0)``), or not at all (left out)."""
    for i, a in enumerate(comm.chunks(comm.rank)):
        for j, c in enumerate(comm.chunks(source)):
            if not comm.is_causal or c < a:
                yield i, j, None
            elif c == a:
                yield i, j, Causal(0)


def ring_blocks_per_rank(
    world_size: int, *, is_causal: bool = True, layout: str = "contiguous"
) -> list[float]:
    """How many score blocks each rank of a ring computes, rank by rank.

    Counted in units of one ``(N/P, N/P)`` block, with the rule the ring
    itself follows (a block from a later position is skipped, one on the
    diagonal is computed whole and masked). Contiguous and causal, rank ``r``
    computes ``r + 1`` blocks; zig-zag evens this out to ``(2P + 1) / 4`` on
    every rank; without a mask every rank computes ``P``.

    Explained in chapter 12, *Attention across machines*.

    Args:
        world_size: the number of ranks ``P``.
        is_causal: whether the attention is causal.
        layout: ``"contiguous"`` or ``"zigzag"``.

    Returns:
        A list of ``P`` block counts.
    """
    world = check_int("world_size", world_size, minimum=1)
    check_choice("layout", layout, LAYOUTS)
    counts = []
    for rank in range(world):
        comm = _Comm(None, rank, world, is_causal, layout, 1.0, None)
        pairs = sum(1 for src in range(world) for _ in _pairs(comm, src))
        counts.append(pairs / len(comm.chunks(rank)) ** 2)
    return counts


# --------------------------------------------------------------------------- communication


def _exchange(
    sends: Sequence[tuple[int, Tensor]], recvs: Sequence[tuple[int, Tensor]], comm: _Comm
) -> list:
    """Post every send and receive at once (``batch_isend_irecv``); count the sends."""
    ops = [dist.P2POp(dist.isend, t, group=comm.group, group_peer=p) for p, t in sends]
    ops += [dist.P2POp(dist.irecv, t, group=comm.group, group_peer=p) for p, t in recvs]
    if comm.stats is not None:
        comm.stats.bytes_sent += sum(t.nbytes for _, t in sends)
    return dist.batch_isend_irecv(ops) if ops else []


def _pass_on(tensors: Sequence[Tensor], comm: _Comm) -> tuple[list, list[Tensor]]:
    """Send ``tensors`` one hop round the ring and post the receipt of the previous
    rank's; returns the requests and the buffers that will hold what arrives."""
    incoming = [torch.empty_like(t) for t in tensors]
    after, before = (comm.rank + 1) % comm.world, (comm.rank - 1) % comm.world
    reqs = _exchange([(after, t) for t in tensors], [(before, t) for t in incoming], comm)
    return reqs, incoming


def _all_to_all(x: Tensor, split_dim: int, cat_dim: int, comm: _Comm) -> Tensor:
    """Cut ``x`` into ``P`` pieces along ``split_dim``, send piece ``j`` to rank ``j``,
    and join the pieces received from every rank along ``cat_dim``."""
    pieces = [p.contiguous() for p in x.chunk(comm.world, dim=split_dim)]
    received = [torch.empty_like(p) for p in pieces]
    received[comm.rank] = pieces[comm.rank]
    others = [j for j in range(comm.world) if j != comm.rank]
    reqs = _exchange([(j, pieces[j]) for j in others], [(j, received[j]) for j in others], comm)
    for req in reqs:
        req.wait()
    return torch.cat(received, dim=cat_dim)


class _AllToAll(torch.autograd.Function):
    """An all-to-all whose backward pass is the all-to-all the other way round."""

    @staticmethod
    def forward(ctx, x: Tensor, split_dim: int, cat_dim: int, comm: _Comm) -> Tensor:
        ctx.args = (cat_dim, split_dim, comm)
        return _all_to_all(x, split_dim, cat_dim, comm)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        return _all_to_all(grad, *ctx.args), None, None, None


class _AllGather(torch.autograd.Function):
    """Every rank's shard, joined along the sequence; backward sums each rank's
    gradient of a shard back to the shard's owner (a reduce-scatter)."""

    @staticmethod
    def forward(ctx, x: Tensor, comm: _Comm) -> Tensor:
        ctx.comm = comm
        return _all_to_all(x.repeat(1, comm.world, 1, 1), 1, 2, comm)  # (B, H, N, D)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        comm = ctx.comm
        pieces = _all_to_all(grad, 2, 1, comm)  # (B, P * H, N/P, D): each rank's dx
        return pieces.unflatten(1, (comm.world, -1)).sum(dim=1), None


# --------------------------------------------------------------------------- ring attention


def _block_keep(causal: Causal | None, q: Tensor, k: Tensor) -> Tensor | None:
    """The keep-mask of a chunk pair: ``None`` (all) or the causal diagonal."""
    return None if causal is None else causal_mask(q.shape[1], k.shape[1], device=q.device)


def _ring_forward(q: Tensor, k: Tensor, v: Tensor, comm: _Comm) -> tuple[Tensor, Tensor]:
    """Ring attention over flattened ``(N, L, d)`` shards, without autograd.

    Returns the output ``(N, L, d_v)`` and the log-sum-exp ``(N, L, 1)`` of
    every query row over all the keys of the sequence.
    """
    n_chunks, d_v = len(comm.chunks(comm.rank)), v.shape[-1]
    queries = q.chunk(n_chunks, dim=1)
    # One online-softmax state (m, l, acc) per query chunk (chapter 10): every
    # block that arrives is folded in, and m + log l is the running log-sum-exp.
    states = [
        OnlineSoftmaxState.empty(x.shape[:1], x.shape[1], d_v, dtype=q.dtype, device=q.device)
        for x in queries
    ]  # row_max, row_sum: (N, L/c, 1); acc: (N, L/c, d_v)
    block = [k, v]
    for step in range(comm.world):
        source = (comm.rank - step) % comm.world
        # Post the next hop first: the transfer overlaps the compute below.
        last = step == comm.world - 1
        reqs, incoming = ([], []) if last else _pass_on(block, comm)
        _holding(comm.stats, block + incoming)
        keys, values = block[0].chunk(n_chunks, dim=1), block[1].chunk(n_chunks, dim=1)
        for i, j, causal in _pairs(comm, source):
            scores = queries[i] @ keys[j].transpose(1, 2) * comm.scale  # (N, L/c, L/c)
            keep = _block_keep(causal, queries[i], keys[j])
            if keep is not None:
                scores = scores.masked_fill(~keep, float("-inf"))
            states[i] = online_softmax_update(states[i], scores, values[j])
            if comm.stats is not None:
                comm.stats.blocks += 1 / n_chunks**2
        for req in reqs:
            req.wait()
        block = incoming
    out = torch.cat([s.output() for s in states], dim=1)  # (N, L, d_v)
    lse = torch.cat([s.row_max + torch.log(s.row_sum) for s in states], dim=1)  # (N, L, 1)
    return out, lse


def _block_grads(
    q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor, lse: Tensor, delta: Tensor,
    keep: Tensor | None, scale: float,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """One block's share of dQ, dK, dV (chapter 10's backward step), with the
    probabilities recomputed from the *global* log-sum-exp of the query rows."""
    probs = torch.exp(q @ k.transpose(1, 2) * scale - lse)  # P = exp(s - lse), (N, Lq, Lk)
    if keep is not None:
        probs = probs.masked_fill(~keep, 0.0)
    grad_scores = probs * (grad_out @ v.transpose(1, 2) - delta)  # dS = P * (dP - D)
    grad_q = grad_scores @ k * scale  # (N, Lq, d_k)
    return grad_q, grad_scores.transpose(1, 2) @ q * scale, probs.transpose(1, 2) @ grad_out


def _ring_backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, comm: _Comm
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of ring attention: the K/V blocks go round again, each with its
    ``dK``/``dV`` accumulators, which every rank adds to and which are home
    after ``P`` hops."""
    n_chunks = len(comm.chunks(comm.rank))
    split = lambda t: t.chunk(n_chunks, dim=1)
    delta = (grad_out * out).sum(dim=-1, keepdim=True)  # D = rowsum(dO * O), (N, L, 1)
    queries, grads_out, lses, deltas = split(q), split(grad_out), split(lse), split(delta)
    grad_q = torch.zeros_like(q)
    block, grads = [k, v], [torch.zeros_like(k), torch.zeros_like(v)]
    for step in range(comm.world):
        source = (comm.rank - step) % comm.world
        last = step == comm.world - 1
        reqs, incoming = ([], []) if last else _pass_on(block, comm)
        keys, values = split(block[0]), split(block[1])
        grad_keys, grad_values = split(grads[0]), split(grads[1])
        for i, j, causal in _pairs(comm, source):
            keep = _block_keep(causal, queries[i], keys[j])
            dq, dk, dv = _block_grads(
                queries[i], keys[j], values[j], grads_out[i], lses[i], deltas[i], keep, comm.scale
            )
            split(grad_q)[i].add_(dq)
            grad_keys[j].add_(dk)
            grad_values[j].add_(dv)
        # The gradients travel with their block, one hop behind it; the last hop
        # brings every block's dK and dV home to its owner.
        grad_reqs, grad_incoming = _pass_on(grads, comm) if comm.world > 1 else ([], grads)
        _holding(comm.stats, block + incoming + grads + grad_incoming)
        for req in reqs + grad_reqs:
            req.wait()
        block, grads = incoming, grad_incoming
    return grad_q, grads[0], grads[1]


class _RingAttention(torch.autograd.Function):
    """Ring attention that saves only its shard's inputs, output and log-sum-exp."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, comm: _Comm) -> Tensor:
        out, lse = _ring_forward(q, k, v, comm)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.comm = comm
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        return *_ring_backward(grad_out.contiguous(), *ctx.saved_tensors, ctx.comm), None


def _check_shards(
    query: Tensor, key: Tensor, value: Tensor, is_causal: bool, scale: float | None, **extra
) -> None:
    """One rank's own checks: shards ``(B, H, N/P, D)`` of one self-attention."""
    check_attention_args(query, key, value, dropout_p=0.0, scale=scale, is_causal=is_causal)
    if not query.dim() == key.dim() == value.dim() == 4 or query.shape[:3] != key.shape[:3]:
        shapes = [tuple(t.shape) for t in (query, key, value)]
        raise ValueError(f"query, key, value must be shards (B, H, N/P, D), got {shapes}")
    check_choice("layout", extra.get("layout", "contiguous"), LAYOUTS)
    if extra.get("stats") is not None:
        check_instance("stats", extra["stats"], CommStats, "a CommStats or None")


def _check_group(shapes: list[tuple[int, ...]], layout: str, split_heads: bool) -> None:
    """The checks every rank makes on every rank's shapes, so all refuse together."""
    world, lengths, heads = len(shapes), [s[2] for s in shapes], shapes[0][1]
    if len(set(shapes)) > 1:
        raise ValueError(f"every rank must hold a shard of one shape, so N must be divisible by "
                         f"P = {world}; got shard lengths {lengths}, shapes {shapes}")  # fmt: skip
    if layout == "zigzag" and lengths[0] % 2:
        raise ValueError(f"a zig-zag shard is two chunks: N must be divisible by 2P = "
                         f"{2 * world}, got shard length {lengths[0]}")  # fmt: skip
    if split_heads and heads % world:
        raise ValueError(f"Ulysses gives each rank H / P whole heads: H must be divisible by P "
                         f"= {world}, got H = {heads} (or use ring attention)")  # fmt: skip


def _join(
    query: Tensor,
    value: Tensor,
    group: dist.ProcessGroup | None,
    is_causal: bool,
    scale: float | None,
    stats: CommStats | None,
    layout: str = "contiguous",
    split_heads: bool = False,
) -> _Comm:
    """Agree with every rank of the group on the shard shapes (one small
    all-gather), so that a bad split is refused on every rank at once and none
    waits for a partner that has already given up; then describe this rank."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    mine = torch.tensor([*query.shape, value.shape[-1]], device=query.device)
    shapes = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(shapes, mine, group=group)
    _check_group([tuple(s.tolist()) for s in shapes], layout, split_heads)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    return _Comm(group, rank, world, is_causal, layout, scale, stats)


def ring_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    is_causal: bool = False,
    group: dist.ProcessGroup | None = None,
    layout: str = "contiguous",
    scale: float | None = None,
    stats: CommStats | None = None,
) -> Tensor:
    r"""Ring attention: exact attention over a sequence split across the ranks.

    Call it on every rank of ``group`` with that rank's shard of the
    sequence. At step ``t`` rank ``r`` holds the K/V block of rank
    ``r - t (mod P)``: it sends that block on to rank ``r + 1`` (with
    ``batch_isend_irecv``, overlapping the transfer with its compute), scores
    its queries against the block, and folds the block into its running
    online-softmax state (:func:`~attention_lib.tiled.online_softmax_update`,
    chapter 10), whose ``m + log l`` is the running log-sum-exp of every query
    row. After ``P`` steps the output equals attention over the whole
    sequence. Each rank holds at most two K/V blocks, so the K/V memory is
    ``O(N / P)`` (plus one ``(N/P, N/P)`` block of scores at a time, which a
    fused kernel would tile as chapter 10 does).

    Causal: query chunk ``a`` skips every key chunk after it and masks the
    diagonal one (``is_causal=True`` has the meaning of
    ``F.scaled_dot_product_attention`` over the whole, merged sequence). With
    the contiguous layout rank ``r`` then works on ``r + 1`` blocks; the zig-zag
    layout (shards from :func:`zigzag_split`) gives every rank the same work.

    **Gradients.** Differentiable in all three inputs (a
    ``torch.autograd.Function``): the backward pass sends the K/V blocks
    round the ring again, each with its ``dK``/``dV`` accumulators, which
    every rank adds its share to; after ``P`` hops they are home. Each block
    takes chapter 10's backward step, its probabilities recomputed from the
    global log-sum-exp saved by the forward pass, so the memory stays
    ``O(N / P)``.

    Runs in the caller's process group (the default group when ``group`` is
    ``None``); it never creates or destroys one. Before any computation the
    ranks agree on their shard shapes (one small all-gather), so an uneven
    split is refused on every rank with the same message.

    Explained in chapter 12, *Attention across machines*.

    Args:
        query: this rank's ``(B, H, N/P, D)`` shard of the queries.
        key: this rank's ``(B, H, N/P, D)`` shard of the keys.
        value: this rank's ``(B, H, N/P, D_v)`` shard of the values.
        is_causal: causal attention over the whole sequence: the query at
            position ``i`` of the merged sequence attends to the keys at
            positions ``<= i`` (``F.scaled_dot_product_attention``'s
            ``is_causal``), whichever ranks hold them, in either layout.
        group: the process group (default: the default group).
        layout: how the shards were cut: ``"contiguous"`` (rank ``r`` holds
            positions ``r N/P .. (r + 1) N/P - 1``) or ``"zigzag"``
            (:func:`zigzag_split`).
        scale: multiplier of the scores; defaults to ``1 / sqrt(D)``.
        stats: a :class:`CommStats` that counts the bytes this rank sends, the
            blocks it computes and the K/V bytes it holds (forward and
            backward); ``None`` counts nothing.

    Returns:
        This rank's ``(B, H, N/P, D_v)`` shard of the output. float16/bfloat16
        shards are computed (and sent) in float32, as chapter 10 computes them,
        and the output is cast back.

    Raises:
        TypeError: if the inputs are not floating tensors of one dtype, or
            ``stats`` is not a :class:`CommStats`.
        ValueError: if a shard is not 4-D, key and query shards differ in
            shape, the ranks' shards differ in shape (``N`` not divisible by
            ``P``), a zig-zag shard has an odd length, or ``layout`` is unknown.

    Shapes:
        - query, key: ``(B, H, N/P, D)``
        - value: ``(B, H, N/P, D_v)``
        - output: ``(B, H, N/P, D_v)``
    """
    _check_shards(query, key, value, is_causal, scale, layout=layout, stats=stats)
    comm = _join(query, value, group, is_causal, scale, stats, layout)
    b, h, length, d_v = *query.shape[:3], value.shape[-1]
    dtype = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    q, k, v = (t.to(dtype).reshape(b * h, length, -1).contiguous() for t in (query, key, value))
    out = _RingAttention.apply(q, k, v, comm)  # (B*H, N/P, D_v)
    return out.reshape(b, h, length, d_v).to(query.dtype)


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
    rank runs ordinary attention on its heads (chapter 10's tiled core); a
    second all-to-all returns every rank its positions for all ``H`` heads.
    Each rank sends ``(P - 1) / P`` of each of its four shards (Q, K, V and
    the output) per pass, so the traffic per rank falls as ``1 / P``, but ``P``
    can be at most ``H``: the head count must be divisible by ``P``. The
    backward pass is the same all-to-alls in reverse.

    Runs in the caller's process group, like :func:`ring_attention`, and
    refuses an uneven split or ``H`` not divisible by ``P`` on every rank.

    Explained in chapter 12, *Attention across machines*.

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
    _check_shards(query, key, value, is_causal, scale, stats=stats)
    comm = _join(query, value, group, is_causal, scale, stats, split_heads=True)
    # sequence-sharded (B, H, N/P, D) -> head-sharded (B, H/P, N, D)
    q, k, v = (_AllToAll.apply(t, 1, 2, comm) for t in (query, key, value))
    causal = Causal(0) if is_causal else None
    out = tiled_core(q, k, v, None, causal=causal, dropout_p=0.0, scale=comm.scale)
    return _AllToAll.apply(out, 2, 1, comm)  # (B, H/P, N, D_v) -> (B, H, N/P, D_v)


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

    Explained in chapter 12, *Attention across machines*.

    Args, returns, raises and shapes: as :func:`ring_attention`, without
    ``layout``.
    """
    _check_shards(query, key, value, is_causal, scale, stats=stats)
    comm = _join(query, value, group, is_causal, scale, stats)
    k, v = _AllGather.apply(key, comm), _AllGather.apply(value, comm)  # (B, H, N, D)
    _holding(stats, [k, v])
    causal = Causal(comm.rank * query.shape[2]) if is_causal else None  # global positions
    return tiled_core(query, k, v, None, causal=causal, dropout_p=0.0, scale=comm.scale)


# --------------------------------------------------------------------------- running it

#: The distributed attentions by name, for :class:`Case`.
METHODS: dict[str, Callable[..., Tensor]] = {
    "allgather": allgather_attention,
    "ring": ring_attention,
    "ulysses": ulysses_attention,
}


@dataclass(frozen=True)
class Case:
    """One distributed attention to run and check: what, on which inputs.

    The inputs are the whole sequence, drawn from ``seed``; each rank takes its
    shard. :func:`run_cases` runs cases on the ranks, :func:`reference` computes
    the same case in one process with ``F.scaled_dot_product_attention``.

    Explained in chapter 12, *Attention across machines*.

    Attributes:
        method: ``"ring"``, ``"ulysses"`` or ``"allgather"``.
        shape: ``(B, H, N, D)`` of the whole sequence.
        is_causal: causal attention.
        layout: ``"contiguous"`` or ``"zigzag"`` (ring only).
        dtype: the dtype of the inputs.
        seed: the seed of the inputs.
        repeats: if above 0, time this many forward + backward passes.
        world_size: run on ranks ``0 .. world_size - 1`` only (a subgroup);
            ``None`` for the whole group.
    """

    method: str = "ring"
    shape: tuple[int, int, int, int] = (1, 4, 32, 8)
    is_causal: bool = False
    layout: str = "contiguous"
    dtype: torch.dtype = torch.float64
    seed: int = 0
    repeats: int = 0
    world_size: int | None = None

    def inputs(self, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(q, k, v, grad_out)`` of the whole sequence, all ``(B, H, N, D)``."""
        gen = torch.Generator().manual_seed(self.seed)
        return tuple(
            torch.randn(self.shape, generator=gen, dtype=self.dtype).to(device) for _ in "qkvg"
        )

    def split(self, x: Tensor, world_size: int) -> list[Tensor]:
        """The shards of ``x`` (sequence along dim 2); contiguous shards may be uneven."""
        if self.layout == "zigzag":
            return zigzag_split(x, world_size)
        return list(torch.tensor_split(x, world_size, dim=2))

    def merge(self, shards: Sequence[Tensor]) -> Tensor:
        """The whole sequence from its shards."""
        return zigzag_merge(shards) if self.layout == "zigzag" else torch.cat(list(shards), 2)


def run_cases(cases: Sequence[Case]) -> list[dict]:
    """The worker: run every case on this rank of the default process group.

    For each case, this rank takes its shard of the inputs, runs the forward
    and backward pass, and returns its shards of the output and of the
    gradients (on the CPU), with its :class:`CommStats` of the forward and the
    backward pass, the peak bytes of every tensor the forward pass allocated
    (``peak_bytes``, chapter 10's :class:`~attention_lib.memory.TensorMemory`) and, if
    ``case.repeats``, the mean wall time of a forward +
    backward pass (between barriers, so the slowest rank's time). A case whose
    shards are refused gives ``{"error": message}`` and the group goes on.

    Explained in chapter 12, *Attention across machines*.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    groups = {}  # every rank creates every subgroup, in the same order
    for size in sorted({case.world_size or world for case in cases}):
        groups[size] = None if size == world else dist.new_group(list(range(size)))
    results = []
    for case in cases:
        size = case.world_size or world
        if rank >= size:  # not in this case's group
            results.append(None)
            continue
        kwargs = {"layout": case.layout} if case.layout != "contiguous" else {}
        kwargs["group"] = groups[size]
        attention = METHODS[case.method]
        q, k, v, g = (case.split(t, size)[rank] for t in case.inputs(device))
        q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
        stats = CommStats()
        try:
            with TensorMemory() as memory:  # everything the forward pass allocates
                out = attention(q, k, v, is_causal=case.is_causal, stats=stats, **kwargs)
        except (TypeError, ValueError) as error:
            results.append({"error": f"{type(error).__name__}: {error}"})
            continue
        forward = replace(stats)  # the backward pass adds to `stats`
        grads = torch.autograd.grad(out, (q, k, v), g)
        result = {"out": out.detach(), "dq": grads[0], "dk": grads[1], "dv": grads[2]}
        result = {name: t.cpu() for name, t in result.items()}
        result.update(forward=forward, total=stats, peak_bytes=memory.peak, seconds=None)
        if case.repeats:
            dist.barrier(group=groups[size])
            start = time.perf_counter()
            for _ in range(case.repeats):
                out = attention(q, k, v, is_causal=case.is_causal, **kwargs)
                torch.autograd.grad(out, (q, k, v), g)
            dist.barrier(group=groups[size])
            result["seconds"] = (time.perf_counter() - start) / case.repeats
        results.append(result)
    return results


def reference(case: Case) -> dict[str, Tensor]:
    """The case in one process: ``F.scaled_dot_product_attention`` and autograd.

    Returns the whole output and the gradients of q, k, v (``"out"``,
    ``"dq"``, ``"dk"``, ``"dv"``), the oracle for :func:`gather`.

    Explained in chapter 12, *Attention across machines*.
    """
    q, k, v, g = case.inputs()
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=case.is_causal)
    grads = torch.autograd.grad(out, (q, k, v), g)
    return {"out": out.detach(), "dq": grads[0], "dk": grads[1], "dv": grads[2]}


def gather(case: Case, per_rank: Sequence[dict]) -> dict[str, Tensor]:
    """Join the ranks' shards of one case's output and gradients into whole tensors.

    Explained in chapter 12, *Attention across machines*.
    """
    return {name: case.merge([r[name] for r in per_rank]) for name in ("out", "dq", "dk", "dv")}


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it: bind port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, backend: str | None, timeout: float, out_dir: str,
           threads: int, worker: Callable, args: tuple) -> None:  # fmt: skip
    """One spawned process: join the group, run the worker, save what it returns."""
    torch.set_num_threads(threads)
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=timeout),
    )  # fmt: skip
    try:
        torch.save(worker(*args), os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def launch(
    worker: Callable,
    world_size: int,
    *args: object,
    backend: str | None = None,
    timeout: float = 120.0,
    threads: int = 1,
) -> list:
    """Run ``worker(*args)`` in ``world_size`` new processes of one process group.

    The processes are started with ``torch.multiprocessing`` (the ``spawn``
    start method, so it works from a notebook as from a script); each joins a
    new default group on 127.0.0.1 at a free port (gloo on CPUs, NCCL when
    there are GPUs, one per rank), calls ``worker(*args)``, saves what it
    returns and leaves the group. ``worker`` must be importable (defined in a
    module, such as :func:`run_cases`), not defined in a notebook cell.

    Nothing can hang: the group's collectives time out after ``timeout``
    seconds, and if the processes have not all finished by then they are
    terminated and a ``TimeoutError`` is raised. An exception in a worker is
    raised here (``torch.multiprocessing.ProcessRaisedException``).

    Explained in chapter 12, *Attention across machines*.

    Args:
        worker: an importable function, run on every rank.
        world_size: the number of processes ``P``.
        *args: the worker's arguments (pickled to every process).
        backend: ``"gloo"``, ``"nccl"`` or ``None`` for NCCL if CUDA is
            available, else gloo.
        timeout: seconds for the whole run and for any one collective.
        threads: ``torch.set_num_threads`` in every process.

    Returns:
        What the worker returned, one entry per rank, in rank order.
    """
    world = check_int("world_size", world_size, minimum=1)
    timeout = check_real("timeout", timeout, above=0)
    with tempfile.TemporaryDirectory() as out_dir:
        args = (world, _free_port(), backend, timeout, out_dir, threads, worker, args)
        context = mp.start_processes(_entry, args, nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        try:
            while not context.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"the {world} workers did not finish in {timeout:g} s")
        finally:
            for process in context.processes:  # only the processes started above
                if process.is_alive():
                    process.terminate()
        return [
            torch.load(os.path.join(out_dir, f"{r}.pt"), weights_only=False) for r in range(world)
        ]


def _check_cases(world: int) -> list[Case]:
    """What :func:`main` checks on ``world`` ranks: both methods, causal and not, both
    layouts, two dtypes, on a sequence of ``8 P`` positions (so any ``P`` divides it)."""
    kinds = (("ring", "contiguous"), ("ring", "zigzag"), ("ulysses", "contiguous"))
    grid = [(m, c, lay, dt) for dt in (torch.float64, torch.float32) for c in (False, True)
            for m, lay in kinds]  # fmt: skip
    return [
        Case(m, (1, 4, 8 * world, 8), c, lay, dt, seed=i) for i, (m, c, lay, dt) in enumerate(grid)
    ]


#: The tolerance of every check, by dtype.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}


def _max_errors(case: Case, per_rank: Sequence[dict]) -> dict[str, float]:
    """The largest absolute difference from :func:`reference` of the gathered
    output and gradients of one case."""
    got, want = gather(case, [r for r in per_rank if r is not None]), reference(case)
    return {name: (got[name] - want[name]).abs().max().item() for name in want}


def main(argv: Sequence[str] | None = None) -> int:
    """``torchrun --nproc-per-node P -m attention_lib.distributed``: check every case.

    Joins the group torchrun describes (NCCL with GPUs, else gloo), runs
    :func:`_check_cases` on every rank, gathers the shards on rank 0, which
    prints each case's largest errors against the single-process reference and
    returns 1 if any is above :data:`TOLERANCE`.
    """
    parser = argparse.ArgumentParser(description=main.__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per collective")
    args = parser.parse_args(argv)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    try:
        cases = _check_cases(dist.get_world_size())
        results = run_cases(cases)
        everyone = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(results, everyone, dst=0)
        if dist.get_rank() != 0:
            return 0
        world, failed = dist.get_world_size(), 0
        print(f"P = {world}, backend {backend}: largest |error| against one process")
        for i, case in enumerate(cases):
            per_rank = [r[i] for r in everyone]
            if "error" in per_rank[0]:
                print(f"{case.method:8} {case.layout:10} refused: {per_rank[0]['error']}")
                continue
            worst = max(_max_errors(case, per_rank).values())
            failed += worst > TOLERANCE[case.dtype]
            causal = "causal" if case.is_causal else "full"
            print(f"{case.method:8} {case.layout:10} {causal:6} {case.dtype!s:13} {worst:.1e}")
        print("all exact" if not failed else f"{failed} case(s) above the tolerance")
        return int(failed > 0)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
