"""Paged attention in place: attention that reads the keys through the block table.

A :class:`~attention_lib.PagedKVCache` stores each sequence's keys and values
in fixed-size blocks scattered over a pool. Gathering them into one dense
``(B, H_kv, T, d_k)`` tensor before attending (what
:class:`~attention_lib.PagedBatch` does) copies the whole cache at
every step: memory and traffic that grow with the tokens held.
PagedAttention (Kwon et al., 2023), FlashInfer and FlashAttention's paged
kernels instead *walk* the block table: they load a few blocks of keys at a
time, fold their scores into chapter 11's online-softmax state (running
maximum ``m``, running sum ``l``, running output ``acc``), and move on, so the
extra memory is one tile of blocks, whatever the length of the sequences.

:func:`paged_attention` is that walk written with ordinary PyTorch ops: at
each tile it reads the next few blocks of every sequence's table from the
pool, computes their scores against the sequence's
queries, hides the keys each query may not see (later positions, keys outside
a sliding window or outside the query's chunk, slots past the sequence's end)
and merges the tile with ``online_softmax_core``, the merge of chapter 11's
tiled attention (:func:`~attention_lib.tiled.online_softmax_update` without
its checks: the engine validates once per step). Attention sinks (gpt-oss)
are the state's starting point: ``m = sink``, ``l = 1``, ``acc = 0`` is a
virtual key of logit ``sink`` and value zero.

Explained in chapter 12, *Serving attention*.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from .online_softmax import OnlineSoftmaxState, online_softmax_core
from .validation import check_int, check_tensor

#: Default keys read per tile of :func:`paged_attention` (whole blocks, at
#: least one): 32 keep one step's extra memory below a quarter of the gathered
#: keys and values of 8 sequences of 512 tokens.
DEFAULT_TILE = 32


def paged_attention(
    query: Tensor,
    key_pool: Tensor,
    value_pool: Tensor,
    tables: Tensor,
    positions: Tensor,
    lengths: Tensor,
    *,
    scale: float | None = None,
    window: int | None = None,
    chunk: int | None = None,
    softcap: float | None = None,
    sink: Tensor | None = None,
    tile: int = DEFAULT_TILE,
) -> Tensor:
    """Attention of every sequence's queries to its keys, read block by block
    from the pool through its block table (no gathered key/value tensor).

    Explained in chapter 12, *Serving attention*.

    Args:
        query: ``(S, H, Lq, d_k)`` queries of ``S`` sequences (rows of padding
            have position ``-1``).
        key_pool: ``(num_blocks, block_size, H_kv, d_k)`` keys of one layer's
            pool (``H`` a multiple of ``H_kv``: grouped-query attention).
        value_pool: ``(num_blocks, block_size, H_kv, d_v)`` values.
        tables: ``(S, max_blocks)`` integer block ids of each sequence, in
            order; ``-1`` for a block it does not hold (past its end, or freed
            because it fell out of a sliding window).
        positions: ``(S, Lq)`` integer position of each query in its
            sequence; ``-1`` for a padding query, which sees no key (its
            output is zero).
        lengths: ``(S,)`` keys held by each sequence (its new keys included):
            key ``t`` of sequence ``s`` is at slot ``t % block_size`` of block
            ``tables[s, t // block_size]``.
        scale: multiplies the scores; ``None`` means ``1 / sqrt(d_k)``.
        window: a query at position ``p`` sees the keys ``p - window < t <= p``
            only (sliding-window attention); ``None``: all ``t <= p``.
        chunk: a query sees only the keys of its own chunk of ``chunk``
            positions (Llama 4's chunked attention).
        softcap: the scaled scores become ``softcap * tanh(s / softcap)``.
        sink: ``(H,)`` attention-sink logits (a virtual key of value zero).
        tile: keys read at once (rounded down to whole blocks, at least one):
            the extra memory is one tile.

    Returns:
        ``(S, H, Lq, d_v)``: the output of each query (zero for padding).

    Raises:
        TypeError: if a tensor argument is not a tensor of the right kind.
        ValueError: if the shapes do not fit together or ``tile < 1``.
    """
    for name, t in (("query", query), ("key_pool", key_pool), ("value_pool", value_pool)):
        check_tensor(name, t)
    check_int("tile", tile, minimum=1)
    num_seqs, heads, q_len, d_k = query.shape
    _, block_size, kv_heads, _ = key_pool.shape
    fits = (
        key_pool.dim() == value_pool.dim() == 4
        and key_pool.shape[:3] == value_pool.shape[:3]
        and key_pool.shape[-1] == d_k
        and heads % kv_heads == 0
        and tables.dim() == 2
        and len(tables) == num_seqs
        and tuple(positions.shape) == (num_seqs, q_len)
        and tuple(lengths.shape) == (num_seqs,)
    )
    if not fits:
        shapes = [tuple(t.shape) for t in (query, key_pool, value_pool, tables, positions, lengths)]
        what = "query (S, H, Lq, d_k), pools (N, bs, H_kv, d_k|d_v), tables (S, M)"
        raise ValueError(f"expected {what}, positions (S, Lq), lengths (S,): got {shapes}")
    return paged_attention_core(
        query, key_pool, value_pool, tables, positions, lengths,
        scale=d_k**-0.5 if scale is None else scale, window=window, chunk=chunk,
        softcap=softcap, sink=sink, tile_blocks=max(1, tile // block_size),
    )  # fmt: skip


class WalkPlan(NamedTuple):
    """What a walk over the block tables reads, for every layer that shares
    the tables, positions, window and chunk (the engine makes it once per
    step and group, chapter 12): per tile, the rows that hold keys there
    (a prefix of the batch when the sequences are sorted longest first), the
    block ids to read, and the ``(R, 1, g Lq, n bs)`` mask of hidden keys."""

    tiles: Iterable[tuple[int, Tensor, Tensor]]
    real: Tensor  # (S, Lq): the queries that are not padding


def walk_plan(
    tables: Tensor,
    positions: Tensor,
    lengths: Tensor,
    *,
    block_size: int,
    group: int,
    window: int | None,
    chunk: int | None,
    tile_blocks: int,
    lazy: bool = False,
) -> WalkPlan:
    """The :class:`WalkPlan` of :func:`paged_attention` (no checks), its tiles
    made as the walk reads them (``lazy``: a tile's mask at a time) or all at
    once, for the layers of a step to share."""
    # The first key any query may see: its window's or its chunk's start.
    first = torch.zeros_like(positions)
    if window is not None:
        first = (positions - window + 1).clamp(min=0)
    if chunk is not None:
        first = torch.maximum(first, positions // chunk * chunk)
    real = positions >= 0
    lowest = int(first[real].min()) if bool(real.any()) else 0
    ends = lengths.tolist()
    used = -(-max(ends, default=0) // block_size)
    pos = positions.repeat(1, group)[:, None, :, None]  # (S, 1, g Lq, 1), as the rows of q
    first = first.repeat(1, group)[:, None, :, None]
    # Sequences sorted longest first (as the engine runs them): a tile reads the
    # rows that still hold keys there, a prefix of the batch, and nothing else.
    descending = all(a >= b for a, b in itertools.pairwise(ends))

    def tiles() -> Iterator[tuple[int, Tensor, Tensor]]:
        for b0 in range(lowest // block_size, used, tile_blocks):
            rows = sum(e > b0 * block_size for e in ends) if descending else len(ends)
            ids = tables[:rows, b0 : b0 + tile_blocks]  # (R, n)
            n = ids.shape[1]
            t = torch.arange(b0 * block_size, (b0 + n) * block_size, device=tables.device)
            held = (t < lengths[:rows, None]) & (ids >= 0).repeat_interleave(block_size, dim=1)
            sees = held[:, None, None, :] & (t <= pos[:rows]) & (t >= first[:rows])
            yield rows, ids.clamp(min=0).flatten(), ~sees  # a missing block: block 0, hidden

    return WalkPlan(tiles() if lazy else list(tiles()), real)


def paged_attention_core(
    query: Tensor,
    key_pool: Tensor,
    value_pool: Tensor,
    tables: Tensor,
    positions: Tensor,
    lengths: Tensor,
    *,
    scale: float,
    window: int | None,
    chunk: int | None,
    softcap: float | None,
    sink: Tensor | None,
    tile_blocks: int,
    plan: WalkPlan | None = None,
) -> Tensor:
    """:func:`paged_attention` without its checks: the walk that each
    attention layer of chapter 12's engine runs at every step (the engine
    validated its inputs once for the step, and hands the step's ``plan``)."""
    num_seqs, heads, q_len, _ = query.shape
    _, block_size, kv_heads, d_v = value_pool.shape
    group = heads // kv_heads
    if plan is None:
        plan = walk_plan(tables, positions, lengths, block_size=block_size, group=group,
                         window=window, chunk=chunk, tile_blocks=tile_blocks, lazy=True)  # fmt: skip
    # The g query heads of a key/value head are rows of one matrix: (S, H_kv, g Lq, d_k).
    q = query.reshape(num_seqs, kv_heads, group * q_len, -1) * scale
    state = OnlineSoftmaxState.empty(
        (num_seqs, kv_heads), group * q_len, d_v, dtype=query.dtype, device=query.device
    )
    if sink is not None:  # a virtual key of logit `sink` and value 0: m = sink, l = 1
        start = sink.to(query.dtype).reshape(1, kv_heads, group, 1).repeat_interleave(q_len, 2)
        state = OnlineSoftmaxState(start.expand_as(state.row_max).clone(),
                                   state.row_sum + 1, state.acc)  # fmt: skip
    row_max, row_sum, acc = state
    for rows, blocks, hidden in plan.tiles:
        k, v = (
            pool.index_select(0, blocks).view(rows, -1, kv_heads, pool.shape[-1]).transpose(1, 2)
            for pool in (key_pool, value_pool)
        )  # (R, H_kv, n bs, d_k) and (R, H_kv, n bs, d_v)
        scores = q[:rows] @ k.transpose(-2, -1)  # (R, H_kv, g Lq, n bs)
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        scores = scores.masked_fill_(hidden, float("-inf"))
        part = OnlineSoftmaxState(row_max[:rows], row_sum[:rows], acc[:rows])  # views
        part = online_softmax_core(part, scores, v, base2=False, dropout_p=0.0, inplace=True)
        row_max[:rows] = part.row_max  # the sum and the output were updated in place
        del scores, k, v
    out = OnlineSoftmaxState(row_max, row_sum, acc).output().view(num_seqs, heads, q_len, d_v)
    return out.masked_fill(~plan.real[:, None, :, None], 0.0)
