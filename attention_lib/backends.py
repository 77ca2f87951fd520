"""Attention backends: a table from a name to the function that computes attention.

:class:`~attention_lib.MultiHeadAttention` does its projections itself, then
hands the per-head ``q, k, v`` to ``BACKENDS[backend]``. Every backend is
called the same way::

    fn(q, k, v, keep, *, dropout_p, is_causal, scale, **options) -> output

with ``q (B, H, Lq, d_k)``, ``k (B, H, Lk, d_k)``, ``v (B, H, Lk, d_k)``,
``keep`` ``None`` or a **bool** keep-mask (``True`` = may attend) broadcastable
to ``(B, H, Lq, Lk)`` and not yet combined with ``is_causal``, and ``output
(B, H, Lq, d_k)``. The module has validated every argument before the call, so
the ``"lib"`` and ``"torch"`` backends check nothing (``"tiled"`` is the public
:func:`~attention_lib.tiled.tiled_attention`, which checks its arguments once more).

* ``"lib"``: this package's :func:`~attention_lib.scaled_dot_product_attention`
  (readable; chapter 4);
* ``"torch"``: PyTorch's fused ``F.scaled_dot_product_attention`` (fast;
  chapter 6);
* ``"tiled"``: :func:`~attention_lib.tiled.tiled_attention`, tiled attention with an
  online softmax (chapter 8); its option ``block_size`` comes from
  ``MultiHeadAttention(..., block_size=...)``.

Explained in chapter 6, *Multi-head attention*, and chapter 8, *Efficient attention*.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor

from .masks import with_causal
from .sdpa import _attention
from .tiled import tiled_attention


def lib_backend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Tensor | None,
    *,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
) -> Tensor:
    """The ``"lib"`` backend: :func:`~attention_lib.scaled_dot_product_attention`
    without its checks, output only (see the module docstring for the arguments)."""
    output, _ = _attention(q, k, v, keep, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
    return output  # (B, H, Lq, d_k)


def torch_backend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Tensor | None,
    *,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
) -> Tensor:
    """The ``"torch"`` backend: PyTorch's fused ``F.scaled_dot_product_attention``.

    ``keep`` is already bool (``F.scaled_dot_product_attention`` would read a
    float mask as an *additive bias*); a mask together with ``is_causal`` is
    combined into one bool mask, because some torch kernels refuse both at once.
    It cannot return the attention weights.
    """
    if keep is not None:
        keep = with_causal(keep, q.shape[-2], k.shape[-2], is_causal, q.device)
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=keep,
        dropout_p=dropout_p,
        is_causal=is_causal and keep is None,
        scale=scale,
    )  # (B, H, Lq, d_k)


#: The attention backends of :class:`~attention_lib.MultiHeadAttention`, by name.
BACKENDS: dict[str, Callable[..., Tensor]] = {
    "lib": lib_backend,
    "torch": torch_backend,
    "tiled": tiled_attention,
}


def available_backends() -> tuple[str, ...]:
    """The names of the attention backends: ``("lib", "torch", "tiled")``.

    Explained in chapter 6, *Multi-head attention*.
    """
    return tuple(BACKENDS)
