"""Tiled attention with an online softmax: attention without the score matrix.

Naive attention builds the whole ``(Lq, Lk)`` score matrix, so its memory grows
as ``Lq * Lk``. The *online softmax* (Milakov & Gimelshein, 2018) keeps, for
every query row, a running maximum ``m``, a running sum ``l`` of exponentials and
a running, un-normalised output ``acc``; when a new block of keys raises the
maximum, the old sum and output are rescaled by ``exp(m_old - m_new)``. Attention
can then walk over the keys block by block and only ever holds one
``(block_q, block_k)`` tile of scores (Rabe & Staats, 2021; FlashAttention, Dao
et al., 2022).

The online softmax itself (its state and its update) lives in
:mod:`attention_lib.online_softmax`; its names are importable from here too.

The backward pass does the same in reverse: it saves only the inputs, the
output and one log-sum-exp per query row, and recomputes each tile of
probabilities from them, in the order of FlashAttention-2 (Dao, 2023). So
training, too, needs memory linear in the sequence length.

This is the same algorithm as a FlashAttention kernel, written with ordinary
PyTorch ops: a teaching model, not a fused GPU kernel.

Explained in chapter 11, *Efficient attention*.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .masks import Causal

# Re-exported: the API page and ring attention reach them as attention_lib.tiled.*
from .online_softmax import OnlineSoftmaxState, online_softmax, online_softmax_update  # noqa: F401
from .online_softmax import online_softmax_core as _update
from .validation import check_attention_args, check_int, check_mask

#: Default ``(block_q, block_k)`` of :func:`tiled_attention`: a ``(B*H, 256, 256)``
#: float32 score tile is 2 MiB for 8 heads, small enough to stay in the CPU's
#: caches and large enough that each matmul does real work (chosen with
#: ``benchmarks/bench_tiled.py``).
DEFAULT_BLOCK_SIZE: tuple[int, int] = (256, 256)

_NEG_INF = float("-inf")
_LOG2_E = math.log2(math.e)


def tiled_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    block_size: int | tuple[int, int] = DEFAULT_BLOCK_SIZE,
    window: int | None = None,
) -> Tensor:
    r"""Scaled dot-product attention computed tile by tile with an online softmax.

    Gives the output of ``softmax(Q K^T * scale) V`` (as
    ``F.scaled_dot_product_attention`` and
    :func:`~attention_lib.scaled_dot_product_attention`) without ever building
    the ``(Lq, Lk)`` score matrix: the queries are cut into blocks of
    ``block_q`` rows and, for each, the keys/values into blocks of ``block_k``;
    only one ``(block_q, block_k)`` tile of scores exists at a time, so the extra
    memory is ``O(block_q * block_k + Lq * d_v)`` per batch/head instead of
    ``O(Lq * Lk)``.

    With ``is_causal=True`` query ``i`` sees keys ``0 .. i`` (the top-left
    alignment of ``F.scaled_dot_product_attention(is_causal=True)`` and
    :func:`~attention_lib.causal_mask`, also for ``Lq != Lk``); key blocks that
    lie entirely above the diagonal are skipped, not computed and masked, and
    only the tiles that the diagonal crosses are masked. With that alignment
    every query sees key 0, so no causal row is empty. A query row whose keys
    are *all* removed by ``mask`` gets a zero output, never ``NaN`` (as the lib
    SDPA and torch >= 2.5), and ``Lk = 0`` gives zeros (as torch).

    **Sliding window.** With ``is_causal=True`` and ``window=w``, query ``i``
    sees only keys ``i - w < j <= i`` (itself and the ``w - 1`` before it, as
    in 🤗 transformers' sliding-window mask). Key blocks that lie entirely before the band are
    skipped too, so at a fixed window the work grows linearly in ``Lq``, not
    quadratically (chapter 10).

    **Gradients.** The function is differentiable in ``query``, ``key`` and
    ``value`` with the memory of the forward pass: instead of letting autograd
    store every tile, it saves only the inputs, the output and the log-sum-exp
    of every query row, and its backward pass recomputes each tile of
    probabilities from them (FlashAttention-2's order: for each key block, for
    each query block, ``dV += P^T dO``, ``dP = dO V^T``,
    ``dS = P * (dP - D)`` with ``D = rowsum(dO * O)``, ``dQ += dS K * scale``,
    ``dK += dS^T Q * scale``). A fully masked row gets zero gradients.
    Dropout together with gradients is refused: the backward pass would have to
    recompute exactly the dropout mask of the forward pass, which is not stored.

    Explained in chapter 11, *Efficient attention*.

    Args:
        query: ``(..., Lq, d_k)`` floating tensor.
        key: ``(..., Lk, d_k)`` tensor with the dtype and device of ``query``.
        value: ``(..., Lk, d_v)`` tensor with the dtype and device of ``query``.
        mask: optional keep-mask broadcastable to ``(..., Lq, Lk)``: bool
            (``True`` = may attend) or 0/1 integer/float (``0`` = masked), as in
            :func:`~attention_lib.scaled_dot_product_attention`; it is read one
            tile at a time and never receives a gradient.
        dropout_p: dropout probability on the attention weights (0 = none);
            only without gradients.
        is_causal: if ``True``, query ``i`` may attend only to keys ``0 .. i``.
        scale: multiplier of the scores; defaults to ``1 / sqrt(d_k)``.
        block_size: ``(block_q, block_k)``, or one int for both: how many query
            rows and key columns one score tile has.
        window: with ``is_causal=True``, the sliding-window length ``w >= 1``;
            ``None`` (default) for no window.

    Returns:
        ``output`` of shape ``(..., Lq, d_v)`` (only the output: the weights are
        never formed), the leading dims ``...`` being those of ``query``,
        ``key`` and ``value`` broadcast together. float16/bfloat16 inputs are
        computed in float32 (forward and backward) and the output cast back.

    Raises:
        TypeError: if ``query``/``key``/``value`` are not floating tensors of
            one dtype, ``mask`` has an unsupported type or dtype, ``is_causal``
            is not a bool or ``block_size`` is not an int or a pair of ints.
        ValueError: on a ``d_k`` mismatch between query and key, an ``Lk``
            mismatch between key and value, leading dims or a mask that do not
            broadcast, a numeric mask that is not 0/1, tensors on different
            devices, ``dropout_p`` outside ``[0, 1)``, a non-positive ``scale``, a
            block size below 1, a ``window`` below 1 or without ``is_causal``,
            or ``dropout_p > 0`` while an input requires grad (with gradients
            enabled).

    Shapes:
        - query: ``(..., Lq, d_k)``
        - key: ``(..., Lk, d_k)``
        - value: ``(..., Lk, d_v)``
        - mask: broadcastable to ``(..., Lq, Lk)``
        - output: ``(..., Lq, d_v)``
    """
    batch_shape = check_attention_args(
        query, key, value, dropout_p=dropout_p, scale=scale, is_causal=is_causal
    )  # the broadcast leading dims "..."
    block_size = check_block_size(block_size)
    if window is not None and check_int("window", window, minimum=1) and not is_causal:
        raise ValueError(f"window={window} needs is_causal=True (a causal sliding window)")
    q_len, k_len = query.shape[-2], key.shape[-2]
    keep = (
        None
        if mask is None
        else check_mask(mask, (*batch_shape, q_len, k_len), device=query.device)
    )
    causal = Causal(0, window) if is_causal else None
    return tiled_core(
        query,
        key,
        value,
        keep,
        causal=causal,
        dropout_p=float(dropout_p),
        scale=scale,
        block_size=block_size,
    )


def tiled_core(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    keep: Tensor | None,
    *,
    causal: Causal | None,
    dropout_p: float,
    scale: float | None,
    block_size: tuple[int, int] = DEFAULT_BLOCK_SIZE,
) -> Tensor:
    """The core of :func:`tiled_attention`, without input checks.

    ``keep`` is a bool keep-mask or ``None``, ``causal`` a
    :class:`~attention_lib.masks.Causal` (any offset and window) or ``None``,
    prepared by the entry point. It refuses only what it cannot compute:
    dropout while gradients are needed.
    """
    q_len, k_len, d_k, d_v = query.shape[-2], key.shape[-2], query.shape[-1], value.shape[-1]
    batch_shape = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    needs_grad = torch.is_grad_enabled() and (
        query.requires_grad or key.requires_grad or value.requires_grad
    )
    if needs_grad and dropout_p > 0.0:  # the backward recomputes the weights, not the mask
        raise ValueError(
            f"tiled attention cannot apply dropout_p={dropout_p!r} with gradients (the random mask"
            " is not stored): use dropout_p=0.0, torch.no_grad(), or backend 'lib' or 'torch'"
        )
    scale = 1.0 / math.sqrt(d_k) if scale is None else float(scale)

    # float16/bfloat16 are computed in float32. The leading dims are broadcast and
    # flattened into one batch dim N, so that every tile is one batched matmul
    # (bmm) over all batches and heads at once; autograd sums the gradients of
    # these views back over the broadcast dims and casts them to the input dtype.
    out_dtype = query.dtype
    dtype = torch.float32 if out_dtype in (torch.float16, torch.bfloat16) else out_dtype
    n = math.prod(batch_shape)
    q = query.to(dtype).expand(*batch_shape, q_len, d_k).reshape(n, q_len, d_k)  # (N, Lq, d_k)
    k = key.to(dtype).expand(*batch_shape, k_len, d_k).reshape(n, k_len, d_k)  # (N, Lk, d_k)
    v = value.to(dtype).expand(*batch_shape, k_len, d_v).reshape(n, k_len, d_v)  # (N, Lk, d_v)
    if keep is not None:
        keep = keep.expand(*batch_shape, q_len, k_len)  # (..., Lq, Lk), a view, no copy
    tiles = _Tiles(tuple(batch_shape), *block_size, causal, scale)
    if needs_grad:
        out = _TiledAttention.apply(q, k, v, keep, tiles)  # (N, Lq, d_v)
    else:
        out, _ = _tiled_forward(q, k, v, keep, tiles, dropout_p)  # (N, Lq, d_v)
    return out.reshape(*batch_shape, q_len, d_v).to(out_dtype)  # (..., Lq, d_v)


def block_backward(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    grad_out: Tensor,
    lse: Tensor,
    delta: Tensor,
    *,
    scale: float,
    keep: Tensor | None = None,
    base2: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""One block pair's share of the gradients of attention, from the rows' global log-sum-exp.

    The step that the backward pass of :func:`tiled_attention` takes for every
    tile, and ring attention for every block that reaches a rank
    (:func:`~attention_lib.distributed.ring_attention`): for a block of
    queries and a block of keys and values, recompute the probabilities from
    the log-sum-exp of each query row over *all* its keys, then

    .. math::

        P &= \exp(Q K^\top \cdot \mathrm{scale} - \mathrm{lse}), \qquad
        dV = P^\top dO, \qquad dP = dO\, V^\top,

        dS &= P \odot (dP - D), \qquad
        dQ = dS\, K \cdot \mathrm{scale}, \qquad
        dK = dS^\top Q \cdot \mathrm{scale},

    with :math:`D = \mathrm{rowsum}(dO \odot O)` of the whole output rows. The
    gradients of the whole attention are the sums of these shares over the
    block pairs: :math:`dQ` of a query block over its key blocks, :math:`dK`
    and :math:`dV` of a key block over its query blocks.

    A building block, like :func:`tiled_core`: it checks nothing (the caller
    prepared the blocks). A query row whose ``lse`` is ``-inf`` (it saw no
    key) gets zero gradients.

    The step behind the backward pass of chapter 11's ``tiled_attention``,
    which it and the ring attention of chapter 14 call; no chapter calls it
    directly.

    Args:
        query: ``(..., Lq, d_k)`` the query block.
        key: ``(..., Lk, d_k)`` the key block.
        value: ``(..., Lk, d_v)`` the value block.
        grad_out: ``(..., Lq, d_v)`` the gradient of the output rows, ``dO``.
        lse: ``(..., Lq, 1)`` every query row's log-sum-exp over all its keys
            (not only this block's), as the forward pass saved it.
        delta: ``(..., Lq, 1)`` ``D = rowsum(dO * O)`` of every query row.
        scale: the multiplier of the scores used in the forward pass.
        keep: optional bool keep-mask broadcastable to ``(..., Lq, Lk)``
            (``True`` = the pair was attended).
        base2: ``lse`` is in base-2 units (``log2 sum 2^(s log2 e)``, as
            :func:`tiled_attention` saves it); the probabilities are then
            computed with ``exp2``.

    Returns:
        ``(dq, dk, dv)``, shaped as ``query``, ``key``, ``value``: this block
        pair's share of each gradient.

    Shapes:
        - query, grad_out: ``(..., Lq, d_k)``, ``(..., Lq, d_v)``
        - key, value: ``(..., Lk, d_k)``, ``(..., Lk, d_v)``
        - lse, delta: ``(..., Lq, 1)``
    """
    lead, (q_len, d_k), k_len = query.shape[:-2], query.shape[-2:], key.shape[-2]
    q, k, v, g = (t.reshape(-1, *t.shape[-2:]) for t in (query, key, value, grad_out))
    n = q.shape[0]  # the leading dims flattened: (N, L, d)
    lse = lse.reshape(n, q_len, 1)
    lse = lse.masked_fill(lse == _NEG_INF, float("inf"))  # P = 0 for a row without keys
    if keep is not None:
        keep = keep.broadcast_to(*lead, q_len, k_len).reshape(n, q_len, k_len)
    grads = (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v))
    scratch = (*q.new_empty(2, n * q_len * k_len), q.new_empty(n * q_len * d_k))
    _tile_backward(
        q, k, v, g, lse, delta.reshape(n, q_len, 1), keep,
        scale=scale, base2=base2, scratch=scratch, grads=grads,
    )  # fmt: skip
    return tuple(grad.reshape(*lead, *grad.shape[-2:]) for grad in grads)


# --------------------------------------------------------------------------- private cores
# Everything below is unchecked: the public functions above validate once, then
# call these (the tile loops run thousands of times per call at long lengths).


class _Tiles(NamedTuple):
    """How the ``(N, Lq, Lk)`` score matrix is cut into tiles, and what is kept."""

    batch_shape: tuple[int, ...]  # the leading dims "..." flattened into N
    block_q: int
    block_k: int
    causal: Causal | None  # query i sees keys j <= i + offset (> i + offset - window, same chunk)
    scale: float

    def key_start(self, q_start: int) -> int:
        """Start of the first key block that the query block at ``q_start`` sees."""
        if self.causal is None:
            return 0
        offset, window, chunk = self.causal
        first_key = 0
        if window is not None:
            # Window: keys j <= q_start + offset - window are seen by no query of this
            # block; the key blocks that lie entirely before the band are skipped.
            first_key = max(0, q_start + offset - window + 1)
        if chunk is not None:  # Chunk: keys before the first query's chunk neither
            first_key = max(first_key, (q_start + offset) // chunk * chunk)
        return first_key // self.block_k * self.block_k

    def key_stop(self, q_end: int, k_len: int) -> int:
        """End of the keys that the query block ending at ``q_end`` sees."""
        # Causal: query i sees keys j <= i + offset, so keys from q_end + offset on
        # are never seen by this query block; their tiles are skipped entirely.
        if self.causal is None:
            return k_len
        return min(k_len, max(0, q_end + self.causal.offset))

    def first_query(self, k_start: int) -> int:
        """Start of the first query block that sees the key block at ``k_start``."""
        if self.causal is None:
            return 0
        return max(0, k_start - self.causal.offset) // self.block_q * self.block_q

    def query_stop(self, k_end: int, q_len: int) -> int:
        """End of the queries that see the key block ending at ``k_end``."""
        if self.causal is None:
            return q_len
        offset, window, chunk = self.causal
        stop = q_len
        if window is not None:
            # Window: key j is seen by queries j - offset .. j - offset + window - 1 only.
            stop = min(stop, max(0, k_end - 1 - offset + window))
        if chunk is not None:  # Chunk: key j is seen by queries up to its chunk's end
            stop = min(stop, max(0, ((k_end - 1) // chunk + 1) * chunk - offset))
        return stop

    def keep_tile(
        self, keep: Tensor | None, q_start: int, q_end: int, k_start: int, k_end: int, n: int
    ) -> Tensor | None:
        """Bool keep-mask of one tile, ``(N or 1, bq, bk)``; ``None`` = keep all."""
        tile_keep = None
        offset, window, chunk = (0, None, None) if self.causal is None else self.causal
        crosses_diagonal = self.causal is not None and k_end - 1 > q_start + offset
        # the lower edge of the window band, j > i + offset - window, crosses this tile
        crosses_band_edge = window is not None and k_start <= q_end - 1 + offset - window
        # a chunk starts after the first key of this tile, at or before its last query
        crosses_chunk = chunk is not None and k_start < (q_end - 1 + offset) // chunk * chunk
        if crosses_diagonal or crosses_band_edge or crosses_chunk:
            rows = torch.arange(q_start, q_end, device=_device(keep)).unsqueeze(1) + offset
            cols = torch.arange(k_start, k_end, device=rows.device)  # (bk,)
            tile_keep = cols <= rows  # (bq, bk): key j <= query i + offset
            if crosses_band_edge:
                tile_keep &= cols > rows - window  # ... and j > i + offset - window
            if crosses_chunk:
                tile_keep &= cols // chunk == rows // chunk  # ... and j in the chunk of i
            tile_keep = tile_keep.unsqueeze(0)  # (1, bq, bk)
        if keep is not None:
            user = keep[..., q_start:q_end, k_start:k_end]  # (..., bq, bk), a view
            user = user.reshape(n, q_end - q_start, k_end - k_start)  # (N, bq, bk)
            tile_keep = user if tile_keep is None else user & tile_keep
        return tile_keep


def _device(t: Tensor | None) -> torch.device | None:
    return None if t is None else t.device


def _hide_blocked(scores: Tensor, tile_keep: Tensor | None) -> Tensor:
    """Set the scores of the pairs that ``tile_keep`` does not keep to ``-inf``, in place."""
    if tile_keep is not None:
        scores.masked_fill_(tile_keep.logical_not(), _NEG_INF)
    return scores


def _attend_query_block(
    q_block: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Tensor | None,
    q_start: int,
    tiles: _Tiles,
    dropout_p: float,
    tile_buffer: Tensor,
) -> OnlineSoftmaxState:
    """One query block against its keys, one ``(bq, bk)`` tile at a time.

    ``q_block`` ``(N, bq, d_k)`` is already multiplied by ``scale * log2(e)``
    (scores in base-2 units). Every tile is written into ``tile_buffer``.
    """
    n, bq, _ = q_block.shape
    q_end, d_v = q_start + bq, v.shape[-1]
    state = OnlineSoftmaxState.empty((n,), bq, d_v, dtype=q_block.dtype, device=q_block.device)
    k_stop = tiles.key_stop(q_end, k.shape[1])
    for k_start in range(tiles.key_start(q_start), k_stop, tiles.block_k):
        k_end = min(k_start + tiles.block_k, k_stop)
        scores = tile_buffer[: n * bq * (k_end - k_start)].view(n, bq, k_end - k_start)
        torch.bmm(q_block, k[:, k_start:k_end].transpose(1, 2), out=scores)  # (N, bq, bk)
        _hide_blocked(scores, tiles.keep_tile(keep, q_start, q_end, k_start, k_end, n))
        state = _update(
            state, scores, v[:, k_start:k_end], base2=True, dropout_p=dropout_p, inplace=True
        )
    return state


def _tiled_forward(
    q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, tiles: _Tiles, dropout_p: float
) -> tuple[Tensor, Tensor]:
    """Tiled attention over flattened ``(N, L, d)`` tensors, without autograd.

    Returns ``(out, lse)``: ``out`` ``(N, Lq, d_v)`` and ``lse`` ``(N, Lq, 1)``,
    the log-sum-exp of every row's scores in base-2 units
    (``log2 sum_j 2^(s_j log2 e)``; ``-inf`` for a row that sees no key).
    """
    n, q_len, _ = q.shape
    k_len, d_v = v.shape[1:]
    out = q.new_empty(n, q_len, d_v)  # (N, Lq, d_v)
    lse = q.new_empty(n, q_len, 1)  # (N, Lq, 1)
    # Every score tile is written into one reused buffer (allocating a fresh tile
    # per step costs page faults and cache misses).
    tile_buffer = q.new_empty(n * min(tiles.block_q, q_len) * min(tiles.block_k, k_len))
    for q_start in range(0, q_len, tiles.block_q):
        q_end = min(q_start + tiles.block_q, q_len)
        # Scores in base-2 units: scale * log2(e) is folded into the query block,
        # and the online softmax uses exp2, which is cheaper than exp.
        q_block = q[:, q_start:q_end] * (tiles.scale * _LOG2_E)  # (N, bq, d_k)
        state = _attend_query_block(q_block, k, v, keep, q_start, tiles, dropout_p, tile_buffer)
        out[:, q_start:q_end] = state.output()  # (N, bq, d_v)
        lse[:, q_start:q_end] = state.row_max + torch.log2(state.row_sum)  # (N, bq, 1)
    return out, lse


def _tile_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grad_out: Tensor,
    lse: Tensor,
    delta: Tensor,
    tile_keep: Tensor | None,
    *,
    scale: float,
    base2: bool,
    scratch: tuple[Tensor, Tensor, Tensor],
    grads: tuple[Tensor, Tensor, Tensor],
) -> None:
    """One tile's backward step (:func:`block_backward`), added into ``grads`` in place.

    ``q`` ``(N, bq, d_k)``, ``k`` ``(N, bk, d_k)``, ``v`` ``(N, bk, d_v)``,
    ``grad_out`` ``(N, bq, d_v)``; ``lse`` (``+inf`` for a row without keys) and
    ``delta`` ``(N, bq, 1)``; ``grads`` are ``dQ`` of the query rows, ``dK`` and
    ``dV`` of the key block. ``scratch`` holds three flat buffers (for ``P``,
    ``dP``/``dS`` and one ``dS K``), reused from tile to tile: matmuls write into
    contiguous buffers only, since one that adds into a strided slice of a bigger
    tensor takes a slow path.
    """
    n, bq, d_k = q.shape
    shape = (n, bq, k.shape[1])
    probs, grad_scores = (b[: math.prod(shape)].view(shape) for b in scratch[:2])
    grad_q, grad_k, grad_v = grads
    # scores, (N, bq, bk), in base-2 units if base2; beta=0 ignores the old contents
    probs.baddbmm_(q, k.transpose(1, 2), beta=0.0, alpha=scale * _LOG2_E if base2 else scale)
    _hide_blocked(probs, tile_keep)
    exp = torch.exp2 if base2 else torch.exp
    exp(probs.sub_(lse), out=probs)  # P = exp(s - lse), recomputed from lse
    grad_v.baddbmm_(probs.transpose(1, 2), grad_out)  # dV += P^T dO
    torch.bmm(grad_out, v.transpose(1, 2), out=grad_scores)  # dP = dO V^T
    grad_scores.sub_(delta).mul_(probs)  # dS = P * (dP - D)
    grad_q_tile = scratch[2][: n * bq * d_k].view(n, bq, d_k)
    torch.bmm(grad_scores, k, out=grad_q_tile)
    grad_q.add_(grad_q_tile, alpha=scale)  # dQ += dS K scale
    grad_k.baddbmm_(grad_scores.transpose(1, 2), q, alpha=scale)  # dK += dS^T Q scale


def _tiled_backward(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    keep: Tensor | None,
    tiles: _Tiles,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of tiled attention, recomputing each tile of ``P`` from ``lse``.

    FlashAttention-2's order: the key block is the outer loop (so each key
    block's ``dK`` and ``dV`` stay local), the query block the inner one.
    """
    n, q_len, d_k = q.shape
    k_len = k.shape[1]
    # P = exp2(s - lse). A row that sees no key has lse = -inf; +inf makes its
    # P = exp2(-inf - inf) = 0 instead of NaN, so its gradients are zero.
    lse = lse.masked_fill(lse == _NEG_INF, float("inf"))  # (N, Lq, 1)
    delta = (grad_out * out).sum(dim=-1, keepdim=True)  # D = rowsum(dO * O), (N, Lq, 1)
    grad_q = torch.zeros_like(q)  # (N, Lq, d_k)
    grad_k, grad_v = torch.empty_like(k), torch.empty_like(v)  # (N, Lk, d_k), (N, Lk, d_v)
    # Reused buffers (see _tile_backward): the tiles P and dP (which becomes dS in
    # place), and one query block's share of dQ.
    tile = n * min(tiles.block_q, q_len) * min(tiles.block_k, k_len)
    scratch = (*q.new_empty(2, tile), q.new_empty(n * min(tiles.block_q, q_len) * d_k))
    for k_start in range(0, k_len, tiles.block_k):
        k_end = min(k_start + tiles.block_k, k_len)
        k_block, v_block = k[:, k_start:k_end], v[:, k_start:k_end]  # (N, bk, d_k), (N, bk, d_v)
        grad_k_block, grad_v_block = torch.zeros_like(k_block), torch.zeros_like(v_block)
        q_stop = tiles.query_stop(k_end, q_len)
        for q_start in range(tiles.first_query(k_start), q_stop, tiles.block_q):
            q_end = min(q_start + tiles.block_q, q_len)
            rows = slice(q_start, q_end)
            _tile_backward(
                q[:, rows], k_block, v_block, grad_out[:, rows], lse[:, rows], delta[:, rows],
                tiles.keep_tile(keep, q_start, q_end, k_start, k_end, n), scale=tiles.scale,
                base2=True, scratch=scratch, grads=(grad_q[:, rows], grad_k_block, grad_v_block),
            )  # fmt: skip
        grad_k[:, k_start:k_end] = grad_k_block  # dK = sum over query blocks of dS^T Q scale
        grad_v[:, k_start:k_end] = grad_v_block
    return grad_q, grad_k, grad_v


class _TiledAttention(torch.autograd.Function):
    """Tiled attention whose backward pass recomputes the tiles (FlashAttention-2).

    Saves only ``q``, ``k``, ``v``, the output and the per-row log-sum-exp:
    ``O(N * L * d)`` memory, never a ``(Lq, Lk)`` matrix.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, tiles: _Tiles):
        out, lse = _tiled_forward(q, k, v, keep, tiles, 0.0)
        ctx.save_for_backward(q, k, v, out, lse, keep)
        ctx.tiles = tiles
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        q, k, v, out, lse, keep = ctx.saved_tensors
        grads = _tiled_backward(grad_out.contiguous(), q, k, v, out, lse, keep, ctx.tiles)
        return (*grads, None, None)


def check_block_size(block_size: object) -> tuple[int, int]:
    """``block_size`` is an int ``>= 1`` or a pair ``(block_q, block_k)`` of them."""
    if not (isinstance(block_size, tuple) and len(block_size) == 2):
        return (check_int("block_size (an int or a pair)", block_size, minimum=1),) * 2
    names = ("block_size[0] (block_q)", "block_size[1] (block_k)")
    return tuple(check_int(name, size, minimum=1) for name, size in zip(names, block_size))
