"""Scaled dot-product attention, written out step by step.

``softmax(Q K^T * scale) V`` with a keep-mask, causal masking and dropout, the
same computation as ``F.scaled_dot_product_attention`` but also returning the
attention weights.

Explained in chapter 4, *The weighted sum* (scores and scaling: chapter 2,
softmax: chapter 3, masks: chapter 5).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .masks import Causal, masked_softmax, with_causal
from .validation import (
    check_attention_args,
    check_broadcast,
    check_mask,
    check_real,
    check_same,
    check_tensor,
)

#: Dtypes whose scores, softmax and weighted sum are computed in float32.
_UPCAST = (torch.float16, torch.bfloat16)


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
    sink: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Scaled dot-product attention that also returns the attention weights.

    .. math::

        \mathrm{weights} &= \mathrm{softmax}\!\left(Q K^\top \cdot \mathrm{scale}\right),

        \mathrm{output} &= \mathrm{weights}\, V

    Explained in chapter 1, *Queries, keys and values* (the whole formula, built
    by hand), and chapter 4, *The weighted sum*; the scores and the scale in
    chapter 2, *Scores and scaling*; the softmax in chapter 3, *Softmax*; the
    masks in chapter 5, *Masking*; ``softcap`` and ``sink`` in chapter 15,
    *Where attention goes*.

    **Mask semantics.** ``mask`` is a *keep-mask*: a bool ``True`` means "this
    query may attend to this key" (the bool convention of
    ``F.scaled_dot_product_attention``); a 0/1 integer or float mask is read the
    same way, ``0`` = masked. This differs from PyTorch in two places:
    ``F.scaled_dot_product_attention`` reads a **float** ``attn_mask`` as an
    **additive bias** added to the scores (so a 0/1 float mask would mask
    nothing there), and ``nn.MultiheadAttention`` reads a **bool** mask the other
    way round (``True`` = blocked). A float mask with values other than 0 and 1
    is rejected rather than silently misread.

    A query row whose keys are all masked gets all-zero weights and a zero
    output, never ``NaN`` (as ``F.scaled_dot_product_attention`` in torch >= 2.5).
    The mask never receives a gradient, so a float mask that requires grad is
    refused.

    **Half precision.** For float16 and bfloat16 inputs the scores, the
    softmax and the weighted sum are computed in float32, and the output and
    the weights are rounded back once. In float16 ``q . k`` overflows (above
    65504) *before* the scale shrinks it, e.g. for ``q = k = 30`` and
    ``d_k = 128``; accumulating in float32 keeps every result finite where
    ``F.scaled_dot_product_attention``'s is (it accumulates in float32 too).

    Args:
        query: ``(..., Lq, d_k)`` floating tensor.
        key: ``(..., Lk, d_k)`` tensor with the dtype and device of ``query``.
        value: ``(..., Lk, d_v)`` tensor with the dtype and device of ``query``.
        mask: optional keep-mask broadcastable to ``(..., Lq, Lk)``: bool
            (``True`` = may attend) or 0/1 integer/float (``0`` = masked).
        dropout_p: probability of zeroing a weight (dropout on the weights,
            rescaled by ``1 / (1 - dropout_p)``); applied only if ``> 0``.
        is_causal: if ``True``, query ``i`` may attend only to keys ``0 .. i``,
            aligned as in ``F.scaled_dot_product_attention(is_causal=True)`` (see
            :func:`~attention_lib.causal_mask`), also for ``Lq != Lk``. Combined
            with ``mask`` (a pair must be kept by both).
        scale: multiplier of the scores; defaults to ``1 / sqrt(d_k)``.
        softcap: soft-capping (Gemma 2): the scaled scores become
            ``softcap * tanh(scores / softcap)``, bounded by ``softcap``, before
            the mask; ``None`` for none.
        sink: attention-sink logits (gpt-oss), broadcastable to the leading
            dims ``...`` (``(H,)`` for ``(B, H, L, d)`` inputs): every row gets
            one more, virtual key with this logit and a zero value, which takes
            a share of the softmax; the returned weights leave it out, so their
            rows sum to less than 1. ``None`` for none.

    Returns:
        ``(output, weights)``: ``output`` of shape ``(..., Lq, d_v)`` and
        ``weights`` of shape ``(..., Lq, Lk)``, the weights that multiplied
        ``value`` (after dropout, if any; without dropout each row sums to 1, or
        to 0 where every key is masked). The leading dims ``...`` are those of
        ``query``, ``key`` and ``value`` broadcast together.

    Raises:
        TypeError: if ``query``/``key``/``value`` are not floating tensors of
            one dtype, ``mask`` has an unsupported type or dtype, ``is_causal``
            is not a bool, or ``dropout_p``/``scale`` are not real numbers.
        ValueError: on ``d_k = 0``, a ``d_k`` mismatch between query and key, an
            ``Lk`` mismatch between key and value, leading dims or a mask that do
            not broadcast, a numeric mask that is not 0/1 or that requires grad,
            tensors on different devices, ``dropout_p`` outside ``[0, 1)`` or a
            ``scale`` that is not finite and > 0.

    Shapes:
        - query: ``(..., Lq, d_k)``
        - key: ``(..., Lk, d_k)``
        - value: ``(..., Lk, d_v)``
        - mask: broadcastable to ``(..., Lq, Lk)``
        - output: ``(..., Lq, d_v)``
        - weights: ``(..., Lq, Lk)``
    """
    batch_shape = check_attention_args(
        query, key, value, dropout_p=dropout_p, scale=scale, is_causal=is_causal
    )  # the broadcast leading dims "..."
    q_len, k_len = query.shape[-2], key.shape[-2]
    keep = (
        None
        if mask is None
        else check_mask(mask, (*batch_shape, q_len, k_len), device=query.device)
    )
    softcap = None if softcap is None else check_real("softcap", softcap, above=0)
    if sink is not None:
        check_same("dtype", sink=check_tensor("sink", sink, min_dim=0).dtype, query=query.dtype)
        check_broadcast("sink (the leading dims ...)", sink.shape, target=batch_shape)
    causal = Causal() if is_causal else None
    return attend(
        query,
        key,
        value,
        keep,
        causal=causal,
        dropout_p=float(dropout_p),
        scale=scale,
        softcap=softcap,
        sink=sink,
    )


def attend(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    keep: Tensor | None,
    *,
    causal: Causal | None,
    dropout_p: float,
    scale: float | None,
    softcap: float | None = None,
    sink: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The core of :func:`~attention_lib.scaled_dot_product_attention`, without checks.

    ``keep`` is a bool keep-mask or ``None`` and ``causal`` a
    :class:`~attention_lib.masks.Causal` or ``None``, prepared by the entry
    point that validated them. Returns ``(output, weights)``.
    """
    q_len, k_len, d_k = query.shape[-2], key.shape[-2], query.shape[-1]
    keep = with_causal(keep, q_len, k_len, causal, query.device)
    scale = 1.0 / math.sqrt(d_k) if scale is None else float(scale)
    dtype = query.dtype
    if dtype in _UPCAST:  # q . k can overflow float16 before it is scaled
        query, key, value = query.float(), key.float(), value.float()

    scores = query @ key.transpose(-2, -1) * scale  # (..., Lq, Lk)
    if softcap is not None:  # Gemma 2: bounded scores, before the mask
        scores = softcap * torch.tanh(scores / softcap)
    if sink is None:
        weights = masked_softmax(scores, keep, dim=-1)  # (..., Lq, Lk)
    else:  # one virtual key per row, logit `sink`, value 0: it takes a share of the softmax
        column = sink.to(scores.dtype)[..., None, None].expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, column], dim=-1)  # (..., Lq, Lk + 1)
        if keep is not None:
            always = torch.ones_like(column, dtype=torch.bool)  # the sink is never masked
            keep = torch.cat([keep.expand(*column.shape[:-1], keep.shape[-1]), always], -1)
        weights = masked_softmax(scores, keep, dim=-1)[..., :-1]  # (..., Lq, Lk): sum < 1
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    output = weights @ value  # (..., Lq, d_v)
    return output.to(dtype), weights.to(dtype)
