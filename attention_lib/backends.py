"""Attention backends: a table from a name to the function that computes attention.

:class:`~attention_lib.MultiHeadAttention` validates its inputs, does its
projections, then hands the per-head ``q, k, v`` to ``BACKENDS[backend]``.
Every backend is called the same way and checks nothing::

    fn(q, k, v, keep, *, causal, dropout_p, scale, **options) -> output

with ``q (B, H, Lq, d_k)``, ``k (B, H_kv, Lk, d_k)``, ``v (B, H_kv, Lk, d_k)``
(``H_kv`` divides ``H``: query head ``h`` reads key/value head
``h // (H // H_kv)``, grouped-query attention), ``keep`` ``None`` or a **bool**
keep-mask (``True`` = may attend) broadcastable to ``(B, H, Lq, Lk)``,
``causal`` ``None`` or a :class:`~attention_lib.masks.Causal` (its offset and
window) to combine with ``keep``, and ``output (B, H, Lq, d_k)``.

* ``"lib"``: this package's :func:`~attention_lib.scaled_dot_product_attention`
  (readable; chapter 4);
* ``"torch"``: PyTorch's fused ``F.scaled_dot_product_attention`` (fast;
  chapter 6);
* ``"tiled"``: :func:`~attention_lib.tiled.tiled_attention`, tiled attention with an
  online softmax (chapter 11); its option ``block_size`` comes from
  ``MultiHeadAttention(..., block_size=...)``.

Explained in chapter 6, *Multi-head attention*, and chapter 11, *Efficient attention*.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor

from .masks import Causal, with_causal
from .sdpa import attend
from .tiled import tiled_core


def lib_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Tensor | None,
    *,
    causal: Causal | None,
    dropout_p: float,
    scale: float | None,
    softcap: float | None = None,
    sink: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """This package's attention for grouped heads: ``(output, weights)``, with
    ``weights (B, H, Lq, Lk)``. The ``G = H // H_kv`` query heads of a group are
    attended as one extra dim against their shared key/value head, never copied.
    The only backend that computes ``softcap`` and ``sink`` (per query head, ``(H,)``)."""
    kv_heads, group = k.shape[1], q.shape[1] // k.shape[1]
    if group > 1:
        sink = None if sink is None else sink.view(kv_heads, group)  # (H_kv, G)
        q = q.unflatten(1, (kv_heads, group))  # (B, H_kv, G, Lq, d_k)
        k, v = k.unsqueeze(2), v.unsqueeze(2)  # (B, H_kv, 1, Lk, d_k)
        if keep is not None and keep.dim() == 4:  # (B, 1 or H, Lq, Lk) -> 5 dims
            keep = keep.unsqueeze(2) if keep.shape[1] == 1 else keep.unflatten(1, (kv_heads, group))
    options = {"causal": causal, "dropout_p": dropout_p, "scale": scale}
    output, weights = attend(q, k, v, keep, **options, softcap=softcap, sink=sink)
    if group > 1:
        output, weights = output.flatten(1, 2), weights.flatten(1, 2)  # (B, H, Lq, ...)
    return output, weights


def lib_backend(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, **kwargs) -> Tensor:
    """The ``"lib"`` backend: :func:`lib_attention`, output only."""
    return lib_attention(q, k, v, keep, **kwargs)[0]  # (B, H, Lq, d_k)


_TOP_LEFT = Causal()
"""The causal mask ``F.scaled_dot_product_attention(is_causal=True)`` builds itself."""


def torch_backend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Tensor | None,
    *,
    causal: Causal | None,
    dropout_p: float,
    scale: float | None,
) -> Tensor:
    """The ``"torch"`` backend: PyTorch's fused ``F.scaled_dot_product_attention``.

    ``keep`` is already bool (``F.scaled_dot_product_attention`` would read a
    float mask as an *additive bias*). A plain top-left causal mask is passed as
    ``is_causal=True``; any other (an offset after a cache, a window, or a mask
    besides) is combined into one bool mask. Grouped key/value heads stay
    4-D and are read with ``enable_gqa=True``: PyTorch's fused kernels then
    share each key/value head among its query heads without a copy (5-D
    inputs would send it to a slow path that builds the scores, N^2 memory).
    """
    fast_causal = causal == _TOP_LEFT and keep is None
    if not fast_causal:
        keep = with_causal(keep, q.shape[-2], k.shape[-2], causal, q.device)
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=keep,
        dropout_p=dropout_p,
        is_causal=fast_causal,
        scale=scale,
        enable_gqa=k.shape[1] != q.shape[1],
    )  # (B, H, Lq, d_k)


def tiled_backend(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, **kwargs) -> Tensor:
    """The ``"tiled"`` backend: :func:`~attention_lib.tiled.tiled_core` (chapter 11).

    With grouped heads, the ``G`` query heads of each group are attended one
    after the other against their shared key/value heads, so K and V are
    never copied (gradients reach them through each call)."""
    kv_heads, group = k.shape[1], q.shape[1] // k.shape[1]
    if group == 1:
        return tiled_core(q, k, v, keep, **kwargs)  # (B, H, Lq, d_k)
    q = q.unflatten(1, (kv_heads, group))  # (B, H_kv, G, Lq, d_k)
    per_head = keep is not None and keep.dim() == 4 and keep.shape[1] > 1
    if per_head:
        keep = keep.unflatten(1, (kv_heads, group))  # (B, H_kv, G, Lq, Lk)
    out = q.new_empty(q.shape[:-1] + v.shape[-1:])  # (B, H_kv, G, Lq, d_v)
    for g in range(group):  # query heads g, G + g, 2G + g, ... read K/V heads 0, 1, 2, ...
        keep_g = keep[:, :, g] if per_head else keep  # (B, H_kv, Lq, Lk) or broadcastable
        out[:, :, g] = tiled_core(q[:, :, g], k, v, keep_g, **kwargs)  # (B, H_kv, Lq, d_v)
    return out.flatten(1, 2)  # (B, H, Lq, d_v)


#: The attention backends of :class:`~attention_lib.MultiHeadAttention`, by name.
BACKENDS: dict[str, Callable[..., Tensor]] = {
    "lib": lib_backend,
    "torch": torch_backend,
    "tiled": tiled_backend,
}


def available_backends() -> tuple[str, ...]:
    """The names of the attention backends: ``("lib", "torch", "tiled")``.

    Explained in chapter 6, *Multi-head attention*.
    """
    return tuple(BACKENDS)
