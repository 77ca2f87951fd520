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

Explained in chapter 17, *Latent and sparse attention*.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .rope import rotate_pairs
from .validation import check_int, check_mask, check_real, check_tensor


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
    with per-query weights ``w`` instead of a softmax. Computed in float32,
    as DeepSeek-V3.2 (in 🤗 transformers, ``DeepseekV32Indexer``) does.

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
        float32 scores ``(B, Lq, Lk)``, ``-inf`` where ``mask`` blocks.

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
    scores = query.float() @ key.float().transpose(-1, -2)[:, None] * scale  # (B, Lq, H_I, Lk)
    scores = F.relu(scores)
    index = (weights.float()[..., None, :] @ scores).squeeze(-2)  # (B, Lq, 1, Lk) -> (B, Lq, Lk)
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
