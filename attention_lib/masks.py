"""Attention masks: causal masks, padding masks and a softmax that respects them.

Every mask in ``attention_lib`` is a **keep-mask**: ``True`` (or ``1``) marks a
(query, key) pair that *may* attend, ``False`` (or ``0``) one that is blocked.
That is the bool convention of ``F.scaled_dot_product_attention``. Beware of the
two other conventions in PyTorch:

* ``F.scaled_dot_product_attention`` reads a *float* ``attn_mask`` as an
  **additive bias** (``0.0`` = keep, ``-inf`` = block), not as 0/1 weights;
* ``nn.MultiheadAttention`` reads a *bool* ``attn_mask`` / ``key_padding_mask``
  the other way round: ``True`` = **blocked**.

Explained in chapter 5, *Masking*.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from .validation import check_bool, check_int, check_integer_tensor, check_mask


class Causal(NamedTuple):
    """A causal mask described, not built: what an entry point passes down.

    Query ``i`` sits at key position ``i + offset`` and may attend to keys
    ``j <= i + offset``; with a ``window``, only to ``i + offset - window < j``;
    with a ``chunk``, only to keys in its own chunk, ``j // chunk == (i +
    offset) // chunk`` (Llama 4's chunked attention; key 0 starts a chunk, as
    it does in a chunked layer's cache, chapter 16).
    ``offset = 0`` is the top-left alignment of
    ``F.scaled_dot_product_attention(is_causal=True)``; ``offset = Lk - Lq``
    the bottom-right one, for queries that are the *last* ``Lq`` of the ``Lk``
    positions (after ``Lk - Lq`` cached keys; chapter 5).
    """

    offset: int = 0
    window: int | None = None
    chunk: int | None = None


def causal_mask(
    q_len: int,
    k_len: int | None = None,
    *,
    offset: int = 0,
    window: int | None = None,
    chunk: int | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Causal keep-mask: query ``i`` may attend to keys ``0 .. i + offset``.

    With the default ``offset=0`` the alignment is the one of
    ``F.scaled_dot_product_attention(is_causal=True)`` (``torch.ones(q_len,
    k_len).tril(0)``, anchored at the top-left corner), also when ``q_len !=
    k_len``: with more queries than keys the last queries see every key, with
    fewer queries they see only the first keys. ``offset = k_len - q_len``
    anchors it at the bottom-right corner instead: the queries are the *last*
    positions, after ``k_len - q_len`` cached keys (a KV cache, chapter 5).

    With a ``window``, query ``i`` sees only itself and the ``window - 1`` keys
    before it, ``i + offset - window < j <= i + offset``: a sliding window, the
    definition of 🤗 transformers' ``sliding_window_causal_mask_function``
    (Mistral-style models).

    With a ``chunk``, the keys are cut into chunks of ``chunk`` positions
    (``0 .. chunk - 1``, ``chunk .. 2 chunk - 1``, ...) and query ``i`` sees
    only the keys of its own chunk that are not in its future, ``j // chunk ==
    (i + offset) // chunk``: 🤗 transformers' ``chunked_causal_mask_function``
    (Llama 4's local layers). Like the window, it is aligned with the cache by
    ``offset``; ``window`` and ``chunk`` together keep what both keep.

    Explained in chapter 5, *Masking*; sliding windows in chapter 10,
    *Attention in today's LLMs*; chunks in chapter 16, *Long contexts*.

    Args:
        q_len: number of queries ``Lq``.
        k_len: number of keys ``Lk``; defaults to ``q_len``.
        offset: key position of query 0 (``k_len - q_len`` for bottom-right);
            may be negative.
        window: sliding-window length ``w >= 1``; ``None`` (default) for the
            plain causal mask.
        chunk: chunk length ``c >= 1``; ``None`` (default) for no chunks.
        device: device of the returned mask.

    Returns:
        Bool keep-mask of shape ``(q_len, k_len)``; ``True`` = may attend.

    Raises:
        TypeError: if a length, ``offset`` or ``window`` is not an int.
        ValueError: if a length is negative, ``window < 1`` or ``chunk < 1``.

    Example:
        >>> causal_mask(3)
        tensor([[ True, False, False],
                [ True,  True, False],
                [ True,  True,  True]])
        >>> causal_mask(4, window=2).int()
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [0, 1, 1, 0],
                [0, 0, 1, 1]], dtype=torch.int32)
        >>> causal_mask(1, 3, offset=2)  # one new query after two cached keys
        tensor([[True, True, True]])
        >>> causal_mask(4, chunk=2).int()
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [0, 0, 1, 0],
                [0, 0, 1, 1]], dtype=torch.int32)
    """
    q_len = check_int("q_len", q_len, minimum=0)
    k_len = q_len if k_len is None else check_int("k_len", k_len, minimum=0)
    offset = check_int("offset", offset, minimum=-(2**62))
    window = None if window is None else check_int("window", window, minimum=1)
    chunk = None if chunk is None else check_int("chunk", chunk, minimum=1)
    return _causal(q_len, k_len, Causal(offset, window, chunk), device)


def _causal(q_len: int, k_len: int, causal: Causal, device: torch.device | str | None) -> Tensor:
    """:func:`causal_mask` without the checks."""
    offset, window, chunk = causal
    keep = torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(offset)  # (Lq, Lk)
    if window is not None:
        keep = keep.triu(offset - window + 1)  # ... and j > i + o - w
    if chunk is not None:  # ... and j in the chunk of i + o
        rows = torch.arange(offset, offset + q_len, device=device)[:, None] // chunk  # (Lq, 1)
        keep &= torch.arange(k_len, device=device) // chunk == rows  # (Lq, Lk)
    return keep


def padding_mask(lengths: Tensor | Sequence[int], max_len: int | None = None) -> Tensor:
    """Keep-mask over keys from per-sequence lengths: key ``j`` of sequence ``b`` is
    kept iff ``j < lengths[b]``.

    The result has shape ``(B, 1, 1, max_len)`` so that it broadcasts against
    attention scores ``(B, H, Lq, Lk)`` (and ``(B, 1, Lq, Lk)``). Note the
    opposite convention of ``nn.MultiheadAttention``'s ``key_padding_mask``
    ``(B, Lk)``, where ``True`` marks the *padding* (``~padding_mask(...)[:, 0, 0]``
    converts ours to theirs).

    Explained in chapter 5, *Masking*.

    Args:
        lengths: ``(B,)`` integer tensor or sequence of ints, each in ``[0, max_len]``.
        max_len: the padded length ``Lk``; defaults to ``max(lengths)``.

    Returns:
        Bool keep-mask of shape ``(B, 1, 1, max_len)`` on the device of ``lengths``.

    Raises:
        TypeError: if ``lengths`` is not integer or ``max_len`` not an int.
        ValueError: if ``lengths`` is not 1-D or a length is negative or > ``max_len``.
    """
    if isinstance(lengths, Sequence) and all(type(n) is int for n in lengths):
        lengths = torch.tensor(list(lengths), dtype=torch.long)  # ints: a (B,) tensor
    check_integer_tensor("lengths", lengths, what=" (B,) or a sequence of ints")
    longest = int(lengths.max()) if lengths.numel() else 0
    max_len = check_int("max_len", longest if max_len is None else max_len, minimum=0)
    if lengths.dim() != 1 or (
        lengths.numel() and not 0 <= int(lengths.min()) <= longest <= max_len
    ):
        raise ValueError(f"lengths must be 1-D, each in [0, max_len={max_len}], got {lengths}")
    positions = torch.arange(max_len, device=lengths.device)  # (Lk,)
    keep = positions < lengths[:, None]  # (B, Lk)
    return keep[:, None, None, :]  # (B, 1, 1, Lk)


def as_keep_mask(
    mask: Tensor | None,
    q_len: int,
    k_len: int,
    *,
    is_causal: bool = False,
    batch_shape: Sequence[int] = (),
    device: torch.device | None = None,
) -> Tensor | None:
    """Validate a keep-mask and turn it into a bool tensor, adding the causal mask.

    ``mask`` may be bool (``True`` = may attend) or a 0/1 integer or float tensor
    (``0`` = masked); anything else (e.g. a float *additive bias* as read by
    ``F.scaled_dot_product_attention``) is rejected.

    It reads a mask the way the attention functions do (their entry points
    check it with ``validation.check_mask``); the keep-mask
    convention is chapter 5's, *Masking*.

    Args:
        mask: keep-mask broadcastable to ``(*batch_shape, q_len, k_len)``, or ``None``.
        q_len: number of queries ``Lq``.
        k_len: number of keys ``Lk``.
        is_causal: also block key ``j > i`` for query ``i`` (see
            :func:`~attention_lib.causal_mask`).
        batch_shape: leading (batch/head) dims of the attention scores.
        device: the device of the attention scores (the mask must be on it).

    Returns:
        ``None`` if nothing is masked, else a bool keep-mask broadcastable to
        ``(*batch_shape, q_len, k_len)``.

    Raises:
        TypeError: if ``mask`` is not a tensor or has an unsupported dtype.
        ValueError: if ``mask`` does not broadcast, is on another device, or is a
            numeric mask with values other than 0 and 1.
    """
    keep = None if mask is None else check_mask(mask, (*batch_shape, q_len, k_len), device=device)
    check_bool("is_causal", is_causal)
    return with_causal(keep, q_len, k_len, Causal() if is_causal else None, device)


def with_causal(
    keep: Tensor | None,
    q_len: int,
    k_len: int,
    causal: Causal | None,
    device: torch.device | str | None,
) -> Tensor | None:
    """``keep`` (bool or ``None``) combined with the ``causal`` mask, if any; ``None``
    when nothing is masked (no checks: the entry points validated everything)."""
    if causal is None:
        return keep
    offset, window, chunk = causal
    last = q_len - 1 + offset  # key position of the last query
    if (
        offset >= k_len - 1
        and (window is None or last < window)
        and (chunk is None or last < chunk)
    ):
        return keep  # every query sees every key: e.g. one new token after its cache
    mask = _causal(q_len, k_len, causal, device if keep is None else keep.device)  # (Lq, Lk)
    return mask if keep is None else keep & mask  # (..., Lq, Lk)


def masked_softmax(scores: Tensor, keep: Tensor | None, dim: int = -1) -> Tensor:
    """Softmax over ``dim`` that gives blocked positions exactly zero weight.

    A row in which *every* position is blocked gets all-zero weights, not the
    ``NaN`` that the naive ``scores.masked_fill(~keep, -inf).softmax(-1)`` gives
    (``exp(-inf) / sum(exp(-inf)) = 0 / 0``); its gradient is zero, not ``NaN``.

    Chapter 5, *Masking*, derives this softmax step by step and names it in
    its prose; softmax itself is chapter 3's, *Softmax*.

    Args:
        scores: ``(..., Lq, Lk)`` attention scores.
        keep: bool keep-mask broadcastable to ``scores`` (``True`` = keep), or
            ``None`` for a plain softmax.
        dim: the dimension to normalise over (the key dimension).

    Returns:
        Weights with the shape of ``scores``; every row sums to 1, or to 0 if
        all of its positions are blocked.
    """
    if keep is None:
        return scores.softmax(dim)
    scores = scores.masked_fill(~keep, float("-inf"))  # (..., Lq, Lk)
    # A row with nothing left to attend to would be softmax(-inf, ..., -inf) = NaN.
    # Give such rows finite scores (0) so that softmax and its gradient stay finite,
    # then zero their weights.
    empty_row = ~keep.any(dim, keepdim=True)  # (..., Lq, 1)
    scores = scores.masked_fill(empty_row, 0.0)
    return scores.softmax(dim).masked_fill(empty_row, 0.0)
