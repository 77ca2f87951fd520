"""The online softmax: a softmax read block by block, with a running maximum and sum.

A softmax over ``n`` scores needs their maximum (for stability) and the sum of
their exponentials before it can write a single weight. The *online softmax*
(Milakov & Gimelshein, 2018) keeps, for every row, a running maximum ``m``, a
running sum ``l`` of exponentials and (for attention) a running, un-normalised
output ``acc``; when a new block raises the maximum, the old sum and output are
rescaled by ``exp(m_old - m_new)``. Tiled attention
(:func:`~attention_lib.tiled.tiled_attention`) and ring attention are this
recurrence over blocks of keys.

The names are also importable from :mod:`attention_lib.tiled` and from
``attention_lib``.

Explained in chapter 11, *Efficient attention*.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .validation import check_dropout_p, check_instance, check_int, check_tensor

_NEG_INF = float("-inf")


class OnlineSoftmaxState(NamedTuple):
    """What the online softmax remembers about every query row between blocks.

    Explained in chapter 11, *Efficient attention*.

    Attributes:
        row_max: ``(..., Lq, 1)`` running maximum ``m`` of the scores seen so far
            (``-inf`` for a row that has seen no key yet).
        row_sum: ``(..., Lq, 1)`` running sum ``l = sum_j exp(s_j - m)``.
        acc: ``(..., Lq, d_v)`` running un-normalised output
            ``sum_j exp(s_j - m) v_j``.
    """

    row_max: Tensor
    row_sum: Tensor
    acc: Tensor

    @classmethod
    def empty(
        cls,
        leading_shape: tuple[int, ...],
        q_len: int,
        d_v: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> OnlineSoftmaxState:
        """The state before any key was seen: ``m = -inf``, ``l = 0``, ``acc = 0``.

        Args:
            leading_shape: the batch/head dims ``...``.
            q_len: number of query rows ``Lq``.
            d_v: width of the values.
            dtype: floating dtype of the state.
            device: device of the state.

        Returns:
            The initial state.
        """
        row_max = torch.full((*leading_shape, q_len, 1), _NEG_INF, dtype=dtype, device=device)
        row_sum = torch.zeros((*leading_shape, q_len, 1), dtype=dtype, device=device)
        acc = torch.zeros((*leading_shape, q_len, d_v), dtype=dtype, device=device)
        return cls(row_max, row_sum, acc)

    def output(self) -> Tensor:
        """The normalised output ``acc / l``, shape ``(..., Lq, d_v)``.

        A row that saw no key at all (every key masked) has ``l = 0`` and
        ``acc = 0``; its output is zero, not ``0 / 0 = NaN``, as in
        :func:`~attention_lib.scaled_dot_product_attention`.
        """
        # l >= 1 for every row that saw a key (its maximum contributes exp(0) = 1).
        denominator = self.row_sum.masked_fill(self.row_sum == 0, 1.0)  # (..., Lq, 1)
        return self.acc / denominator  # (..., Lq, d_v)


def online_softmax_update(
    state: OnlineSoftmaxState,
    scores: Tensor,
    value: Tensor,
    *,
    base2: bool = False,
    dropout_p: float = 0.0,
    inplace: bool = False,
) -> OnlineSoftmaxState:
    r"""Fold one block of keys into the online-softmax state.

    With the block's scores :math:`s_j` (already scaled; ``-inf`` = masked) and
    values :math:`v_j`:

    .. math::

        m' &= \max(m, \max_j s_j),

        l' &= e^{m - m'} l + \sum_j e^{s_j - m'},

        \mathrm{acc}' &= e^{m - m'} \mathrm{acc} + \sum_j e^{s_j - m'} v_j .

    Explained in chapter 11, *Efficient attention*.

    Args:
        state: the state after the previous blocks (start with
            :meth:`OnlineSoftmaxState.empty`).
        scores: ``(..., Lq, block_k)`` scaled scores of this block; ``-inf``
            marks a masked query/key pair.
        value: ``(..., block_k, d_v)`` values of this block.
        base2: the scores are in base-2 units, i.e. already multiplied by
            :math:`\log_2 e`, and are exponentiated with ``exp2``:
            :math:`2^{s \log_2 e} = e^s`, so the result is the same, but ``exp2``
            is the cheaper function (FlashAttention does the same). ``row_max``
            is then in base-2 units too; ``row_sum`` and ``acc`` are unchanged.
        dropout_p: dropout on the attention weights of this block (the weights
            are zeroed and rescaled after the row sum is taken, so the
            normalisation is the one without dropout, as in FlashAttention).
        inplace: overwrite ``scores``, ``state.row_sum`` and ``state.acc``
            instead of allocating new tensors (faster, less memory; only when no
            gradient is needed).

    Returns:
        The new state.

    Raises:
        TypeError: if ``state`` is not an :class:`OnlineSoftmaxState` or
            ``scores``/``value`` are not floating tensors.
        ValueError: if the shapes of ``state``, ``scores`` and ``value`` do not
            fit together or ``dropout_p`` is outside ``[0, 1)``.

    Shapes:
        - state: ``row_max``/``row_sum`` ``(..., Lq, 1)``, ``acc`` ``(..., Lq, d_v)``
        - scores: ``(..., Lq, block_k)``
        - value: ``(..., block_k, d_v)``
    """
    check_instance("state", state, OnlineSoftmaxState, "an OnlineSoftmaxState (see .empty)")
    check_tensor("scores", scores), check_tensor("value", value)
    acc, q_rows = tuple(state.acc.shape), tuple(state.acc.shape[:-1])
    shapes = [tuple(t.shape) for t in (state.row_max, state.row_sum, scores, value)]
    want = [(*q_rows, 1), (*q_rows, 1), (*q_rows, value.shape[-2]), (*acc[:-2], *value.shape[-2:])]
    if shapes != want or value.shape[-1] != acc[-1]:
        raise ValueError(f"state, scores, value must fit: {want} for acc {acc}, got {shapes}")
    dropout_p = check_dropout_p(dropout_p)
    return online_softmax_core(
        state, scores, value, base2=base2, dropout_p=dropout_p, inplace=inplace
    )


def online_softmax(x: Tensor, dim: int = -1, *, block_size: int = 4) -> Tensor:
    """Softmax that reads ``x`` in blocks along ``dim`` with a running max and sum.

    One pass over the blocks finds the maximum ``m`` and the normaliser
    ``l = sum exp(x - m)`` together (the ``m``/``l`` half of
    :func:`online_softmax_update`, which rescales ``l`` whenever ``m`` grows); a
    second pass writes ``exp(x - m) / l``. The result equals ``torch.softmax``
    (also its ``NaN`` for a row that is ``-inf`` everywhere).

    Explained in chapter 11, *Efficient attention*.

    The softmax it reproduces is the one of chapter 3.

    Args:
        x: floating tensor.
        dim: the dimension to normalise over.
        block_size: how many entries of ``dim`` to read at a time.

    Returns:
        Tensor of the shape of ``x`` whose slices along ``dim`` sum to 1.

    Raises:
        TypeError: if ``x`` is not a floating tensor or ``block_size`` not an int.
        ValueError: if ``block_size < 1`` or ``dim`` is out of range.
    """
    check_tensor("x", x, min_dim=1)
    if not isinstance(dim, int) or isinstance(dim, bool) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must be an int in [{-x.dim()}, {x.dim() - 1}], got {dim!r}")
    block_size = check_int("block_size", block_size, minimum=1)

    rows = x.movedim(dim, -1)  # (..., n): normalise over the last dim
    row_max = rows.new_full((*rows.shape[:-1], 1), _NEG_INF)  # running maximum m
    row_sum = torch.zeros_like(row_max)  # running sum l of exp(x - m)
    for block in rows.split(block_size, dim=-1):
        row_max, _, row_sum, _ = _fold_max_and_sum(row_max, row_sum, block, torch.exp)
    return (torch.exp(rows - row_max) / row_sum).movedim(-1, dim)


def _fold_max_and_sum(
    row_max: Tensor, row_sum: Tensor, scores: Tensor, exp, *, inplace: bool = False
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The online-softmax recurrence for ``m`` and ``l`` over one block of scores.

    Returns ``(new_max, rescale, new_sum, weights)``: ``rescale = exp(m - m')``
    and the block's un-normalised ``weights = exp(s - m')``. With ``inplace``,
    ``scores`` and ``row_sum`` are overwritten.
    """
    new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))  # (..., Lq, 1)
    # A row that has seen no key yet still has m = -inf; exp(-inf - (-inf)) would
    # be NaN, so shift such rows by 0 instead (their exponentials are all 0).
    shift = new_max.masked_fill(new_max == _NEG_INF, 0.0)  # (..., Lq, 1)
    rescale = exp(row_max - shift)  # (..., Lq, 1); 0 on the first block
    if inplace:
        weights = exp(scores.sub_(shift), out=scores)  # (..., Lq, block_k)
        new_sum = row_sum.mul_(rescale).add_(weights.sum(dim=-1, keepdim=True))
    else:
        weights = exp(scores - shift)  # (..., Lq, block_k), un-normalised
        new_sum = row_sum * rescale + weights.sum(dim=-1, keepdim=True)
    return new_max, rescale, new_sum, weights


def online_softmax_core(
    state: OnlineSoftmaxState,
    scores: Tensor,
    value: Tensor,
    *,
    base2: bool,
    dropout_p: float,
    inplace: bool,
) -> OnlineSoftmaxState:
    """:func:`online_softmax_update` without the checks: the step of the tile
    loops of :func:`~attention_lib.tiled.tiled_attention` (chapter 11), which
    run it thousands of times per call."""
    exp = torch.exp2 if base2 else torch.exp
    new_max, rescale, row_sum, weights = _fold_max_and_sum(
        state.row_max, state.row_sum, scores, exp, inplace=inplace
    )
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    if not inplace:
        return OnlineSoftmaxState(new_max, row_sum, state.acc * rescale + weights @ value)
    acc = state.acc.mul_(rescale)
    if acc.dim() == 3:
        acc = acc.baddbmm_(weights, value)  # (N, Lq, d_v), fused multiply-add
    else:
        acc = acc.add_(weights @ value)  # (..., Lq, d_v)
    return OnlineSoftmaxState(new_max, row_sum, acc)
