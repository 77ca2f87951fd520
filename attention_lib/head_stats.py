"""Measuring what the heads of a trained encoder do.

Each statistic reads the attention weights a model returns with
``need_weights=True``, ``(B, num_layers, H, L, L)``, and the ``(B, L)``
keep-mask of the real tokens, and gives one number per head,
``(num_layers, H)``, averaged over the real query tokens of the batch:

* :func:`offset_weight`: the weight on the token ``offset`` places away
  (``-1`` the previous token, ``+1`` the next): previous- and next-token heads;
* :func:`key_share`: the weight on chosen keys, e.g. ``[CLS]`` and ``[SEP]``,
  where an encoder's heads park their attention (its attention sink);
* :func:`attention_entropy`: how spread out each row is (broad heads high,
  sharp heads near 0);

and what the heads do: :func:`similarity_change` zeroes a set of heads
(:meth:`TextEncoder.without_heads <attention_lib.bert.TextEncoder.without_heads>`)
and measures the change of the cosine similarity of sentence embeddings
(:func:`mean_pool`) on sentence pairs.

Explained in chapter 8, *Attention in a trained model*.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from .bert import TextEncoder, check_keep
from .validation import check_instance


def _check_weights(weights: object, keep: object) -> tuple[Tensor, Tensor]:
    """``weights`` ``(B, N, H, L, L)`` floating, ``keep`` bool ``(B, L)`` of its B and L."""
    if not (isinstance(weights, Tensor) and weights.is_floating_point() and weights.dim() == 5):
        raise TypeError(f"weights must be a float (B, layers, H, L, L) tensor, got {weights!r:.50}")
    return weights, check_keep(keep, weights[:, 0, 0, 0, :])


def _mean_over(values: Tensor, rows: Tensor) -> Tensor:
    """Mean of ``values`` ``(B, N, H, L)`` over the ``(B, L)`` rows selected -> ``(N, H)``."""
    rows = rows.to(values.dtype)[:, None, None, :]  # (B, 1, 1, L)
    count = rows.sum(dim=(0, 3))  # (1, 1)
    if not bool(count.all()):
        raise ValueError("no query token to average over")
    return (values * rows).sum(dim=(0, 3)) / count  # (N, H)


def offset_weight(weights: Tensor, keep: Tensor, offset: int) -> Tensor:
    """The mean weight each head puts on the token ``offset`` positions away.

    ``offset=-1``: on the previous token (a previous-token head puts nearly
    all of it there), ``+1`` on the next. Averaged over the query positions
    ``i`` for which ``i`` and ``i + offset`` are both real tokens.

    Explained in chapter 8, *Attention in a trained model*.

    Args:
        weights: ``(B, num_layers, H, L, L)`` attention weights.
        keep: ``(B, L)`` bool, ``True`` for real tokens.
        offset: a non-zero int, ``-L < offset < L``.

    Returns:
        ``(num_layers, H)``, values in ``[0, 1]``.

    Raises:
        TypeError: if ``weights`` is not a tensor or ``keep`` not a bool tensor.
        ValueError: on bad shapes, an ``offset`` that is not a non-zero int
            in range, or no pair of real tokens ``offset`` apart.
    """
    weights, keep = _check_weights(weights, keep)
    length = weights.shape[-1]
    if type(offset) is not int or offset == 0 or abs(offset) >= length:
        raise ValueError(f"offset must be a non-zero int, |offset| < {length}, got {offset!r}")
    on = weights.diagonal(offset=offset, dim1=-2, dim2=-1)  # (B, N, H, L - |offset|)
    if offset > 0:  # query i, key i + offset: queries 0 .. L - offset - 1
        rows = keep[:, :-offset] & keep[:, offset:]
    else:  # query i, key i + offset: queries -offset .. L - 1
        rows = keep[:, -offset:] & keep[:, :offset]
    return _mean_over(on, rows)


def key_share(weights: Tensor, keep: Tensor, keys: Tensor) -> Tensor:
    """The mean share of each head's weight that goes to the chosen keys.

    With ``keys = (tokens == cls_id) | (tokens == sep_id)`` the share on
    ``[CLS]`` and ``[SEP]``: an encoder's attention sink, where heads with
    nothing to look for put their weight. Averaged over the real queries.

    Explained in chapter 8, *Attention in a trained model*.

    Args:
        weights: ``(B, num_layers, H, L, L)`` attention weights.
        keep: ``(B, L)`` bool, ``True`` for real tokens.
        keys: ``(B, L)`` bool, ``True`` for the keys to count (a row may
            have none).

    Returns:
        ``(num_layers, H)``, values in ``[0, 1]``.

    Raises:
        TypeError: if a mask is not a bool tensor.
        ValueError: on shapes that do not match.
    """
    weights, keep = _check_weights(weights, keep)
    keys = check_keep(keys, keep, "keys", every_row=False)
    on = (weights * keys.to(weights.dtype)[:, None, None, None, :]).sum(-1)  # (B, N, H, L)
    return _mean_over(on, keep)


def attention_entropy(weights: Tensor, keep: Tensor) -> Tensor:
    """The mean entropy of each head's rows, in nats: ``-sum_j w_j log w_j``.

    ``0`` for a head that puts all its weight on one key, ``log n`` for one
    spread evenly over ``n`` keys. Averaged over the real queries.

    Explained in chapter 8, *Attention in a trained model*.

    Args:
        weights: ``(B, num_layers, H, L, L)`` attention weights.
        keep: ``(B, L)`` bool, ``True`` for real tokens.

    Returns:
        ``(num_layers, H)``, values ``>= 0``.

    Raises:
        TypeError, ValueError: on bad input, as :func:`key_share`.
    """
    weights, keep = _check_weights(weights, keep)
    terms = torch.special.xlogy(weights, weights)  # 0 log 0 = 0
    return _mean_over(-terms.sum(-1), keep)


def mean_pool(hidden: Tensor, keep: Tensor) -> Tensor:
    """Sentence embeddings: the mean of the hidden states of the real tokens
    (all-MiniLM-L6-v2's pooling).

    Explained in chapter 8, *Attention in a trained model*.

    Args:
        hidden: ``(B, L, d)`` last hidden state.
        keep: ``(B, L)`` bool, ``True`` for real tokens.

    Returns:
        ``(B, d)``.

    Raises:
        TypeError, ValueError: on bad input (see :func:`key_share`).
    """
    keep = check_keep(keep, hidden[..., 0])  # (B, L)
    rows = keep.to(hidden.dtype)[..., None]  # (B, L, 1)
    return (hidden * rows).sum(1) / rows.sum(1)  # (B, d)


def pair_similarity(
    model: TextEncoder, first: tuple[Tensor, Tensor], second: tuple[Tensor, Tensor]
) -> Tensor:
    """The cosine similarity of the :func:`mean_pool` embeddings of sentence
    pairs: ``first[p]`` with ``second[p]``.

    Explained in chapter 8, *Attention in a trained model*.

    Args:
        model: a :class:`~attention_lib.bert.TextEncoder`.
        first, second: ``(tokens, keep)`` batches of ``P`` sentences each
            (two different numbers of sentences: a ``RuntimeError`` of torch).

    Returns:
        ``(P,)`` similarities in ``[-1, 1]``.

    Raises:
        TypeError: if ``model`` is not a ``TextEncoder``.
        ValueError: as :meth:`TextEncoder.forward <attention_lib.bert.TextEncoder.forward>`.
    """
    check_instance("model", model, TextEncoder, "a TextEncoder")
    embeddings = [mean_pool(model(tokens, keep), keep) for tokens, keep in (first, second)]
    return torch.nn.functional.cosine_similarity(*embeddings, dim=-1)  # (P,)


def similarity_change(
    model: TextEncoder,
    heads: Iterable[tuple[int, int]],
    first: tuple[Tensor, Tensor],
    second: tuple[Tensor, Tensor],
) -> Tensor:
    """What a set of heads does: the change of :func:`pair_similarity` when
    their outputs are zeroed
    (:meth:`TextEncoder.without_heads <attention_lib.bert.TextEncoder.without_heads>`),
    ablated minus intact, per pair. Compare a class of heads with as many
    random heads.

    Explained in chapter 8, *Attention in a trained model*.

    Args:
        model: a :class:`~attention_lib.bert.TextEncoder`.
        heads: ``(layer, head)`` pairs to zero.
        first, second: ``(tokens, keep)`` batches of ``P`` sentences each.

    Returns:
        ``(P,)`` changes of cosine similarity.

    Raises:
        TypeError, ValueError: as :func:`pair_similarity` and ``without_heads``.
    """
    intact = pair_similarity(model, first, second)  # checks the model first
    return pair_similarity(model.without_heads(heads), first, second) - intact


def random_heads(
    num_layers: int, num_heads: int, count: int, generator: torch.Generator
) -> list[tuple[int, int]]:
    """``count`` distinct ``(layer, head)`` pairs drawn uniformly: the control
    group of an ablation (:func:`similarity_change`).

    Explained in chapter 8, *Attention in a trained model*.

    Raises:
        TypeError, ValueError: if ``count`` is not an int in
            ``[0, num_layers * num_heads]``.
    """
    if not 0 <= count <= num_layers * num_heads:
        raise ValueError(f"count must be <= {num_layers * num_heads} heads, got {count}")
    picks = torch.randperm(num_layers * num_heads, generator=generator)[:count]
    return [(int(i) // num_heads, int(i) % num_heads) for i in picks]
