"""DeepSeek Sparse Attention (DSA): a lightning indexer picks the keys each query reads.

DeepSeek-V3.2 keeps multi-head latent attention (:mod:`attention_lib.mla`) but
lets every query attend to only ``k`` of the keys before it. A small, cheap
*lightning indexer* scores every (query, key) pair,

.. math::

    I_{s,t} = \\sum_h w_{s,h}\\, \\mathrm{ReLU}(q_{s,h} \\cdot k_t),

and the query keeps the ``k`` keys of highest score. The indexer still looks at
all ``N`` keys, but with fewer, narrower heads than the attention (64 of width
128 in DeepSeek-V3.2, against 128 of width 576); the attention itself, the costly
part, reads ``k`` keys instead of ``N``.

**Ties.** ReLU gives exact zeros, so many keys can share the ``k``-th score and
"the top ``k``" is not unique (``torch.topk`` then picks arbitrarily, and a
cached decode step may pick differently from a full pass). :func:`~attention_lib.top_k_keys`
breaks every tie in favour of the **earlier key** (a stable sort), so the same
scores always select the same keys.

**Training.** Top-``k`` has no gradient, so the indexer learns by
distillation: :func:`indexer_kl_loss` pulls the softmax of its scores towards
the attention's own weights, summed over the heads and L1-normalised
(:func:`attention_target`), first over every visible key (DeepSeek-V3.2's
dense warm-up), then over the keys it selects (the sparse stage).
:func:`top_k_recall` measures how many of the attention's ``k`` heaviest keys
the indexer picks.

Explained in chapter 17, *Latent and sparse attention*.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .rope import rotate_pairs
from .validation import (
    check_instance,
    check_int,
    check_mask,
    check_real,
    check_same,
    check_tensor,
)


def lightning_indexer(
    query: Tensor,
    key: Tensor,
    weights: Tensor,
    mask: Tensor | None = None,
    *,
    scale: float = 1.0,
) -> Tensor:
    r"""The lightning indexer's scores, :math:`I_{s,t} = \sum_h w_{s,h}\,
    \mathrm{ReLU}(\mathrm{scale} \cdot q_{s,h} \cdot k_t)`.

    The indexer has ``H_I`` query heads per token but a single key per token
    (shared by the heads, as in multi-query attention), and it mixes its heads
    with per-query weights ``w`` instead of a softmax. Computed in float32 (or
    float64 for float64 inputs), as DeepSeek-V3.2 (in 🤗 transformers,
    ``DeepseekV32Indexer``) does.

    Explained in chapter 17, *Latent and sparse attention*.

    Args:
        query: the indexer's queries, ``(B, Lq, H_I, d_I)``.
        key: the indexer's keys, ``(B, Lk, d_I)``.
        weights: the heads' weights ``w``, ``(B, Lq, H_I)``.
        mask: keep-mask (bool ``True`` / 1 = may be chosen) broadcastable to
            ``(B, Lq, Lk)``; blocked pairs score ``-inf``. ``None`` for none.
        scale: multiplier of the dot products (``> 0``, so that it commutes
            with ReLU); DeepSeek uses ``1 / sqrt(d_I)``.

    Returns:
        scores ``(B, Lq, Lk)`` in float32 or float64, ``-inf`` where ``mask``
        blocks.

    Raises:
        TypeError: on non-tensor or non-floating inputs or a bad mask dtype.
        ValueError: on shapes that do not fit together, a mask that does not
            broadcast or ``scale <= 0``.
    """
    check_tensor("query", query, min_dim=4)
    check_tensor("key", key, min_dim=3)
    check_tensor("weights", weights, min_dim=3)
    batch, q_len, heads, width = query.shape
    if (key.dim(), weights.dim(), query.dim()) != (3, 3, 4) or (
        (key.shape[0], key.shape[2], *weights.shape) != (batch, width, batch, q_len, heads)
    ):
        shapes = [tuple(t.shape) for t in (query, key, weights)]
        raise ValueError(
            f"need query (B, Lq, H_I, d_I), key (B, Lk, d_I), weights (B, Lq, H_I); got {shapes}"
        )
    keep = None if mask is None else check_mask(mask, (batch, q_len, key.shape[1]))
    return index_scores(query, key, weights, keep, check_real("scale", scale, above=0))


def index_scores(
    query: Tensor, key: Tensor, weights: Tensor, keep: Tensor | None, scale: float
) -> Tensor:
    """:func:`lightning_indexer` without the checks (``keep`` is bool or ``None``)."""
    dtype = torch.promote_types(query.dtype, torch.float32)  # low precision: float32
    scores = query.to(dtype) @ key.to(dtype).transpose(-1, -2)[:, None] * scale  # (B, Lq, H_I, Lk)
    scores = F.relu(scores)
    index = (weights.to(dtype)[..., None, :] @ scores).squeeze(-2)  # (B, Lq, 1, Lk) -> (B, Lq, Lk)
    return index if keep is None else index.masked_fill(~keep, float("-inf"))


def top_k_keys(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` keys of highest score in every row; a tie goes to the earlier key.

    Equal scores are common (the indexer's ReLU gives exact zeros), so the
    selection is made deterministic: a stable descending sort, so that of two
    keys with the same score the one with the smaller index ranks first. A
    cached decode step and a full pass then choose the same keys.

    Explained in chapter 17, *Latent and sparse attention*.

    Args:
        scores: ``(..., Lq, Lk)``, ``-inf`` for keys that may not be chosen.
        k: how many keys per query; rows with fewer than ``k`` keys keep
            ``min(k, Lk)`` indices, and ``valid`` says which are real.

    Returns:
        ``(indices, valid)``: long ``(..., Lq, min(k, Lk))``, best first, and
        bool ``(..., Lq, min(k, Lk))``, ``False`` where the chosen score is
        ``-inf`` (a key the row may not read).

    Raises:
        TypeError: if ``scores`` is not a floating tensor or ``k`` not an int.
        ValueError: if ``k < 1``.

    Example:
        >>> top_k_keys(torch.tensor([[0.0, 2.0, 0.0, 0.0]]), 2)[0]
        tensor([[1, 0]])
    """
    check_tensor("scores", scores, min_dim=1)
    return select_top_k(scores, check_int("k", k, minimum=1))


def select_top_k(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """:func:`~attention_lib.top_k_keys` without the checks."""
    order = scores.sort(dim=-1, descending=True, stable=True).indices[..., :k]  # (..., Lq, k)
    return order, scores.gather(-1, order) > float("-inf")


def top_k_mask(indices: Tensor, valid: Tensor, k_len: int) -> Tensor:
    """The keep-mask ``(..., Lq, k_len)`` of the keys :func:`~attention_lib.top_k_keys` chose
    (``True`` at the valid chosen keys): sparse attention written as dense
    attention with a mask.

    Explained in chapter 17, *Latent and sparse attention*.
    """
    keep = torch.zeros(*indices.shape[:-1], k_len, dtype=torch.bool, device=indices.device)
    return keep.scatter(-1, indices, valid)  # (..., Lq, Lk)


def attention_target(weights: Tensor) -> Tensor:
    """What the indexer learns to predict: the attention's weights summed over
    the heads and L1-normalised, ``p_{t,:}`` of DeepSeek-V3.2's warm-up.

    Explained in chapter 17, *Latent and sparse attention*.

    Args:
        weights: softmax weights ``(..., H, Lq, Lk)`` (0 at masked keys), e.g.
            one layer of ``CausalLM(..., need_weights=True)``'s.

    Returns:
        ``(..., Lq, Lk)``, each row summing to 1.

    Raises:
        TypeError: if ``weights`` is not a floating tensor.
        ValueError: if it has fewer than 3 dims.
    """
    total = check_tensor("weights", weights, min_dim=3).sum(-3)  # (..., Lq, Lk)
    return total / total.sum(-1, keepdim=True)


def indexer_kl_loss(scores: Tensor, target: Tensor, keep: Tensor | None = None) -> Tensor:
    r"""DeepSeek-V3.2's indexer loss, :math:`\mathrm{D_{KL}}(p_{t,:} \,\|\,
    \mathrm{Softmax}(I_{t,:}))`, averaged over the query rows ``t``.

    The target is a constant (detached): the loss trains the indexer only.
    With ``keep`` (the sparse stage: the keys the indexer selected), both
    distributions are restricted to the kept keys and ``p`` renormalised
    over them. The paper sums over ``t``; the mean only rescales it.

    Explained in chapter 17, *Latent and sparse attention*.

    Args:
        scores: the indexer's scores ``(..., Lq, Lk)``, ``-inf`` at keys a
            row may not choose (every row must have one it may).
        target: ``p`` of :func:`attention_target`, the shape of ``scores``.
        keep: bool ``(..., Lq, Lk)`` (``True`` = in the loss), or ``None``.

    Returns:
        a scalar tensor.

    Raises:
        TypeError: on non-floating ``scores``/``target`` or a non-bool ``keep``.
        ValueError: on shapes that differ or a row with no key to choose.
    """
    check_tensor("scores", scores)
    check_tensor("target", target)
    allowed = scores > float("-inf")  # (..., Lq, Lk)
    if keep is not None:
        check_instance("keep", keep, Tensor, "a bool tensor")
        check_same("dtype", keep=keep.dtype, bool=torch.bool)
        allowed = allowed & keep
    check_same("shape", scores=scores.shape, target=target.shape, keep=allowed.shape)
    if not allowed.any(-1).all():
        raise ValueError("every query row needs a key it may choose, got a row with none")
    p = target.detach().to(scores.dtype).masked_fill(~allowed, 0.0)
    p = p / p.sum(-1, keepdim=True)
    log_q = scores.masked_fill(~allowed, float("-inf")).log_softmax(-1)  # (..., Lq, Lk)
    kl = torch.xlogy(p, p) - p * log_q.masked_fill(~allowed, 0.0)
    return kl.sum(-1).mean()


def top_k_recall(scores: Tensor, target: Tensor, k: int) -> float:
    """The share of the target's ``k`` heaviest keys that the indexer's top
    ``k`` also holds, over the query rows with more than ``k`` keys to choose
    from (the others keep every key). Ties go to the earlier key, on both
    sides (:func:`~attention_lib.top_k_keys`).

    Explained in chapter 17, *Latent and sparse attention*.

    Args:
        scores: the indexer's scores ``(..., Lq, Lk)``, ``-inf`` where blocked.
        target: the attention's weights ``p`` (:func:`attention_target`), the
            shape of ``scores``.
        k: keys per query.

    Returns:
        the recall in ``[0, 1]``.

    Raises:
        TypeError: on non-floating tensors or a non-int ``k``.
        ValueError: on shapes that differ, ``k < 1`` or no row with more
            than ``k`` keys.
    """
    check_tensor("scores", scores)
    check_tensor("target", target)
    check_same("shape", scores=scores.shape, target=target.shape)
    k = check_int("k", k, minimum=1)
    allowed = scores > float("-inf")
    rows = allowed.sum(-1) > k  # (..., Lq)
    if not rows.any():
        raise ValueError(f"no query row has more than k = {k} keys to choose from")
    theirs = target.detach().to(scores.dtype).masked_fill(~allowed, float("-inf"))
    hits = top_k_mask(*select_top_k(scores, k), scores.shape[-1])
    hits &= top_k_mask(*select_top_k(theirs, k), scores.shape[-1])  # (..., Lq, Lk)
    return hits.sum(-1)[rows].double().mean().item() / k


class LightningIndexer(nn.Module):
    """DeepSeek-V3.2's lightning indexer: cheap ReLU heads and one shared key score every key.

    Its queries come from the attention's query latent (or from ``x`` when
    the attention has no query compression), its single key per token from
    ``x`` through a LayerNorm, and per-query head weights from ``x``. The first
    ``rope_dim`` coordinates of queries and keys are turned by RoPE in the
    rotate-half layout (unlike MLA's interleaved pairs). A building block of
    :class:`~attention_lib.MultiHeadLatentAttention` (``index_topk``), which
    validates the input: its methods check nothing.

    Explained in chapter 17, *Latent and sparse attention*.

    Args:
        d_model: model width.
        q_dim: width of the queries' source (``q_lora_rank`` or ``d_model``).
        num_heads: indexer heads ``H_I`` (64 in DeepSeek-V3.2).
        head_dim: indexer head width ``d_I`` (128 in DeepSeek-V3.2).
        rope_dim: coordinates turned by RoPE (the attention's
            ``qk_rope_head_dim``).

    Attributes:
        W_q: ``nn.Linear(q_dim, H_I * d_I, bias=False)``.
        W_k: ``nn.Linear(d_model, d_I, bias=False)``, then ``k_norm``
            (``nn.LayerNorm(d_I)``).
        W_w: ``nn.Linear(d_model, H_I, bias=False)``, the head weights.
    """

    def __init__(
        self,
        d_model: int,
        q_dim: int,
        num_heads: int,
        head_dim: int,
        rope_dim: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.num_heads, self.head_dim, self.rope_dim = num_heads, head_dim, rope_dim
        self.W_q = nn.Linear(q_dim, num_heads * head_dim, bias=False, **factory)
        self.W_k = nn.Linear(d_model, head_dim, bias=False, **factory)
        self.k_norm = nn.LayerNorm(head_dim, eps=1e-6, **factory)
        self.W_w = nn.Linear(d_model, num_heads, bias=False, **factory)

    def keys(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """The indexer keys of ``x (B, L, d_model)``: ``(B, L, d_I)``, RoPE at
        the angles ``cos``/``sin`` ``(L or B, L, rope_dim / 2)``."""
        return self._rotate(self.k_norm(self.W_k(x)), cos, sin)  # (B, L, d_I)

    def forward(
        self,
        x: Tensor,
        q_source: Tensor,
        keys: Tensor,
        keep: Tensor | None,
        cos: Tensor,
        sin: Tensor,
    ) -> Tensor:
        """Scores ``(B, Lq, Lk)`` of the new tokens ``x`` against ``keys``
        ``(B, Lk, d_I)`` (cached ones included); ``-inf`` where ``keep`` blocks."""
        batch, q_len, _ = x.shape
        q = self.W_q(q_source).view(batch, q_len, self.num_heads, self.head_dim)  # (B, L, H_I, d_I)
        q = self._rotate(q, cos[..., None, :], sin[..., None, :])  # angles (..., L, 1, r / 2)
        weights = self.W_w(x) * self.num_heads**-0.5  # (B, L, H_I)
        return index_scores(q, keys, weights, keep, self.head_dim**-0.5)

    def _rotate(self, t: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        turned = rotate_pairs(t[..., : self.rope_dim], cos, sin)  # rotate-half layout
        return torch.cat([turned, t[..., self.rope_dim :]], dim=-1)

    @classmethod
    def from_hf(cls, indexer: nn.Module) -> LightningIndexer:
        """The indexer of a 🤗 transformers ``DeepseekV32Indexer``, weights copied.

        Explained in chapter 17, *Latent and sparse attention*.
        """
        weight = indexer.wq_b.weight
        new = cls(
            indexer.hidden_size,
            weight.shape[1],
            indexer.n_heads,
            indexer.head_dim,
            indexer.qk_rope_head_dim,
            device=weight.device,
            dtype=weight.dtype,
        )
        new.k_norm.eps = indexer.k_norm.eps
        with torch.no_grad():
            for mine, theirs in (("W_q", "wq_b"), ("W_k", "wk"), ("W_w", "weights_proj")):
                getattr(new, mine).weight.copy_(getattr(indexer, theirs).weight)
            new.k_norm.load_state_dict(indexer.k_norm.state_dict())
        return new
