"""Ring attention (Liu et al., 2023): the K/V blocks travel round a ring of the ranks.

Each rank folds every block that reaches it into an online softmax
(chapter 11's :func:`~attention_lib.tiled.online_softmax_update`); the
backward pass sends the blocks round again with their gradients, each block
taking chapter 11's backward step (:func:`~attention_lib.tiled.block_backward`).

Explained in chapter 14, *Attention across machines*.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..masks import Causal, causal_mask
from ..tiled import OnlineSoftmaxState, block_backward, online_softmax_update
from ..validation import check_choice, check_int
from .comm import Comm, CommStats, check_shards, holding, join_group, pass_on
from .layout import LAYOUTS


def _pairs(comm: Comm, source: int):
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

    Explained in chapter 14, *Attention across machines*.

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
        comm = Comm(None, rank, world, is_causal, layout, 1.0, None)
        pairs = sum(1 for src in range(world) for _ in _pairs(comm, src))
        counts.append(pairs / len(comm.chunks(rank)) ** 2)
    return counts


def _block_keep(causal: Causal | None, q: Tensor, k: Tensor) -> Tensor | None:
    """The keep-mask of a chunk pair: ``None`` (all) or the causal diagonal."""
    return None if causal is None else causal_mask(q.shape[1], k.shape[1], device=q.device)


def _ring_forward(q: Tensor, k: Tensor, v: Tensor, comm: Comm) -> tuple[Tensor, Tensor]:
    """Ring attention over flattened ``(N, L, d)`` shards, without autograd.

    Returns the output ``(N, L, d_v)`` and the log-sum-exp ``(N, L, 1)`` of
    every query row over all the keys of the sequence.
    """
    n_chunks, d_v = len(comm.chunks(comm.rank)), v.shape[-1]
    queries = q.chunk(n_chunks, dim=1)
    # One online-softmax state (m, l, acc) per query chunk (chapter 11): every
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
        reqs, incoming = ([], []) if last else pass_on(block, comm)
        holding(comm.stats, block + incoming)
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


def _ring_backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, comm: Comm
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of ring attention: the K/V blocks go round again, each with its
    ``dK``/``dV`` accumulators, which every rank adds to and which are home
    after ``P`` hops. Every block pair takes tiled attention's backward step
    (:func:`~attention_lib.tiled.block_backward`), its probabilities
    recomputed from the *global* log-sum-exp of the query rows."""
    n_chunks = len(comm.chunks(comm.rank))
    split = lambda t: t.chunk(n_chunks, dim=1)
    delta = (grad_out * out).sum(dim=-1, keepdim=True)  # D = rowsum(dO * O), (N, L, 1)
    queries, grads_out, lses, deltas = split(q), split(grad_out), split(lse), split(delta)
    grad_q = torch.zeros_like(q)
    block, grads = [k, v], [torch.zeros_like(k), torch.zeros_like(v)]
    for step in range(comm.world):
        source = (comm.rank - step) % comm.world
        last = step == comm.world - 1
        reqs, incoming = ([], []) if last else pass_on(block, comm)
        keys, values = split(block[0]), split(block[1])
        grad_keys, grad_values = split(grads[0]), split(grads[1])
        for i, j, causal in _pairs(comm, source):
            keep = _block_keep(causal, queries[i], keys[j])
            dq, dk, dv = block_backward(
                queries[i], keys[j], values[j], grads_out[i], lses[i], deltas[i],
                scale=comm.scale, keep=keep,
            )  # fmt: skip
            split(grad_q)[i].add_(dq)
            grad_keys[j].add_(dk)
            grad_values[j].add_(dv)
        # The gradients travel with their block, one hop behind it; the last hop
        # brings every block's dK and dV home to its owner.
        grad_reqs, grad_incoming = pass_on(grads, comm) if comm.world > 1 else ([], grads)
        holding(comm.stats, block + incoming + grads + grad_incoming)
        for req in reqs + grad_reqs:
            req.wait()
        block, grads = incoming, grad_incoming
    return grad_q, grads[0], grads[1]


class _RingAttention(torch.autograd.Function):
    """Ring attention that saves only its shard's inputs, output and log-sum-exp."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, comm: Comm) -> Tensor:
        out, lse = _ring_forward(q, k, v, comm)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.comm = comm
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        return *_ring_backward(grad_out.contiguous(), *ctx.saved_tensors, ctx.comm), None


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
    chapter 11), whose ``m + log l`` is the running log-sum-exp of every query
    row. After ``P`` steps the output equals attention over the whole
    sequence. Each rank holds at most two K/V blocks, so the K/V memory is
    ``O(N / P)`` (plus one ``(N/P, N/P)`` block of scores at a time, which a
    fused kernel would tile as chapter 11 does).

    Causal: query chunk ``a`` skips every key chunk after it and masks the
    diagonal one (``is_causal=True`` has the meaning of
    ``F.scaled_dot_product_attention`` over the whole, merged sequence). With
    the contiguous layout rank ``r`` then works on ``r + 1`` blocks; the zig-zag
    layout (shards from :func:`zigzag_split`) gives every rank the same work.

    **Gradients.** Differentiable in all three inputs (a
    ``torch.autograd.Function``): the backward pass sends the K/V blocks
    round the ring again, each with its ``dK``/``dV`` accumulators, which
    every rank adds its share to; after ``P`` hops they are home. Each block
    takes chapter 11's backward step
    (``attention_lib.tiled.block_backward``), its probabilities
    recomputed from the global log-sum-exp saved by the forward pass, so the
    memory stays ``O(N / P)``.

    Runs in the caller's process group (the default group when ``group`` is
    ``None``); it never creates or destroys one. Before any computation the
    ranks agree on their shard shapes (one small all-gather), so an uneven
    split is refused on every rank with the same message.

    Explained in chapter 14, *Attention across machines*.

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
        shards are computed (and sent) in float32, as chapter 11 computes them,
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
    check_shards(query, key, value, is_causal, scale, layout=layout, stats=stats)
    comm = join_group(query, value, group, is_causal, scale, stats, layout)
    b, h, length, d_v = *query.shape[:3], value.shape[-1]
    dtype = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    q, k, v = (t.to(dtype).reshape(b * h, length, -1).contiguous() for t in (query, key, value))
    out = _RingAttention.apply(q, k, v, comm)  # (B*H, N/P, D_v)
    return out.reshape(b, h, length, d_v).to(query.dtype)
