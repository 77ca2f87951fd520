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

import torch
from torch import Tensor

from ._checks import check_int, check_integer_tensor, check_mask


def causal_mask(
    q_len: int,
    k_len: int | None = None,
    *,
    window: int | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Causal keep-mask: query ``i`` may attend to keys ``0 .. i``.

    The alignment is the one of ``F.scaled_dot_product_attention(is_causal=True)``
    (``torch.ones(q_len, k_len).tril(0)``, anchored at the top-left corner), also
    when ``q_len != k_len``: with more queries than keys the last queries see every
    key, with fewer queries they see only the first keys.

    With a ``window``, query ``i`` sees only itself and the ``window - 1`` keys
    before it, ``i - window < j <= i``: a sliding window, the definition of
    🤗 transformers' ``sliding_window_causal_mask_function`` (Mistral-style
    models).

    Explained in chapter 5, *Masking*; sliding windows in chapter 10,
    *Attention in today's LLMs*.

    Args:
        q_len: number of queries ``Lq``.
        k_len: number of keys ``Lk``; defaults to ``q_len``.
        window: sliding-window length ``w >= 1``; ``None`` (default) for the
            plain causal mask.
        device: device of the returned mask.

    Returns:
        Bool keep-mask of shape ``(q_len, k_len)``; ``True`` = may attend.

    Raises:
        TypeError: if a length or ``window`` is not an int.
        ValueError: if a length is negative or ``window < 1``.

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
    """
    q_len = check_int("q_len", q_len, minimum=0)
    k_len = q_len if k_len is None else check_int("k_len", k_len, minimum=0)
    if window is not None:
        check_int("window", window, minimum=1)
    return _causal(q_len, k_len, device, window)


def _causal(
    q_len: int, k_len: int, device: torch.device | str | None, window: int | None = None
) -> Tensor:
    """:func:`causal_mask` without the checks."""
    keep = torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril()  # (Lq, Lk)
    return keep if window is None else keep.triu(1 - window)  # ... and j > i - window


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
    if not isinstance(lengths, Tensor):
        if not isinstance(lengths, Sequence) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in lengths
        ):
            raise TypeError(
                f"lengths must be a 1-D integer tensor or a sequence of ints, got {lengths!r}"
            )
        lengths = torch.tensor(list(lengths), dtype=torch.long)
    check_integer_tensor("lengths", lengths)
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D (B,), got shape {tuple(lengths.shape)}")
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(f"lengths must be >= 0, got {lengths.tolist()}")
    longest = int(lengths.max()) if lengths.numel() else 0
    if max_len is None:
        max_len = longest
    max_len = check_int("max_len", max_len, minimum=0)
    if longest > max_len:
        raise ValueError(f"lengths must be <= max_len={max_len}, got {lengths.tolist()}")
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

    The attention functions read their ``mask`` argument with it; the
    keep-mask convention is chapter 5's, *Masking*.

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
    if mask is not None:
        check_mask(mask, (*batch_shape, q_len, k_len), device=device)
    return with_causal(to_bool(mask), q_len, k_len, is_causal, device)


def to_bool(mask: Tensor | None) -> Tensor | None:
    """A checked keep-mask as bool: ``0`` = masked (no checks)."""
    return mask if mask is None or mask.dtype == torch.bool else mask != 0


def with_causal(
    keep: Tensor | None, q_len: int, k_len: int, is_causal: bool, device: torch.device | None
) -> Tensor | None:
    """``keep`` (bool or ``None``) combined with the causal mask if ``is_causal``
    (no checks: the callers validated their arguments)."""
    if not is_causal:
        return keep
    causal = _causal(q_len, k_len, device if keep is None else keep.device)  # (Lq, Lk)
    return causal if keep is None else keep & causal  # (..., Lq, Lk)


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
