"""Pluggable attention backends: one name -> one function that computes attention.

:class:`~attention_lib.MultiHeadAttention` does its projections itself and hands
the per-head ``q, k, v`` to a backend. Every backend has the same signature::

    fn(q, k, v, mask, *, dropout_p, is_causal, scale) -> output

with ``q (B, H, Lq, d_head)``, ``k (B, H, Lk, d_head)``, ``v (B, H, Lk, d_head)``,
``mask`` a keep-mask (bool ``True`` = may attend, or 0/1 with ``0`` = masked)
broadcastable to ``(B, H, Lq, Lk)`` or ``None``, and ``output (B, H, Lq, d_head)``.

Registered backends:

* ``"lib"`` -- this package's :func:`~attention_lib.scaled_dot_product_attention`
  (readable, returns weights; chapter 4);
* ``"torch"`` -- PyTorch's fused ``F.scaled_dot_product_attention`` (fast; chapter 6
  and chapter 8);
* ``"tiled"`` -- tiled attention with an online softmax (chapter 8), registered
  by the efficient-attention module.

Explained in chapter 6, *Multi-head attention*, and chapter 8, *Efficient attention*.
"""

from __future__ import annotations

from typing import Protocol

import torch.nn.functional as F
from torch import Tensor

from ._checks import check_attention_args
from .masks import as_keep_mask
from .sdpa import scaled_dot_product_attention

__all__ = [
    "AttentionBackend",
    "available_backends",
    "get_backend",
    "lib_backend",
    "register_backend",
    "torch_backend",
]


class AttentionBackend(Protocol):
    """Signature of an attention backend (see the module docstring).

    Explained in chapter 6, *Multi-head attention*.
    """

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        *,
        dropout_p: float,
        is_causal: bool,
        scale: float | None,
    ) -> Tensor: ...


_BACKENDS: dict[str, AttentionBackend] = {}


def register_backend(name: str, fn: AttentionBackend, *, overwrite: bool = False) -> None:
    """Make ``fn`` available as ``MultiHeadAttention(..., backend=name)``.

    Explained in chapter 8, *Efficient attention*.

    Args:
        name: the backend's name.
        fn: a function with the :class:`~attention_lib.backends.AttentionBackend`
            signature.
        overwrite: allow replacing an existing backend of that name.

    Raises:
        TypeError: if ``name`` is not a non-empty str or ``fn`` is not callable.
        ValueError: if ``name`` is taken and ``overwrite`` is ``False``.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if name in _BACKENDS and not overwrite:
        raise ValueError(f"backend {name!r} is already registered (pass overwrite=True)")
    _BACKENDS[name] = fn


def available_backends() -> tuple[str, ...]:
    """Names of the registered backends, e.g. ``("lib", "torch", "tiled")``.

    Explained in chapter 6, *Multi-head attention*.
    """
    return tuple(_BACKENDS)


def get_backend(name: str) -> AttentionBackend:
    """Look up a backend by name.

    Explained in chapter 6, *Multi-head attention*.

    Args:
        name: one of :func:`~attention_lib.available_backends`.

    Returns:
        The backend function.

    Raises:
        ValueError: if no backend has that name (the message lists the valid names).
    """
    if not isinstance(name, str) or name not in _BACKENDS:
        valid = ", ".join(repr(n) for n in _BACKENDS)
        raise ValueError(f"backend must be one of {valid}, got {name!r}")
    return _BACKENDS[name]


def lib_backend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    *,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    """The ``"lib"`` backend: :func:`~attention_lib.scaled_dot_product_attention`,
    output only.

    Explained in chapter 4, *The weighted sum*, and chapter 6, *Multi-head attention*.

    Args:
        q: ``(..., Lq, d_k)`` queries.
        k: ``(..., Lk, d_k)`` keys.
        v: ``(..., Lk, d_v)`` values.
        mask: keep-mask broadcastable to ``(..., Lq, Lk)`` or ``None``.
        dropout_p: dropout on the weights.
        is_causal: apply the causal mask.
        scale: score multiplier, default ``1 / sqrt(d_k)``.

    Returns:
        ``(..., Lq, d_v)`` output.
    """
    output, _ = scaled_dot_product_attention(
        q, k, v, mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
    )
    return output


def torch_backend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    *,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    """The ``"torch"`` backend: PyTorch's fused ``F.scaled_dot_product_attention``.

    Takes the same keep-mask as the lib backend: a 0/1 numeric mask is turned
    into a bool mask first (``F.scaled_dot_product_attention`` would read a float
    mask as an *additive bias*), and ``is_causal`` together with a mask is
    combined into one bool mask (some torch kernels reject both at once). It
    cannot return the attention weights.

    Explained in chapter 6, *Multi-head attention*, and chapter 8, *Efficient attention*.

    Args:
        q: ``(..., Lq, d_k)`` queries.
        k: ``(..., Lk, d_k)`` keys.
        v: ``(..., Lk, d_v)`` values.
        mask: keep-mask broadcastable to ``(..., Lq, Lk)`` or ``None``.
        dropout_p: dropout on the weights.
        is_causal: apply the causal mask.
        scale: score multiplier, default ``1 / sqrt(d_k)``.

    Returns:
        ``(..., Lq, d_v)`` output.

    Raises:
        TypeError: on non-floating or mixed-dtype inputs, or a mask of bad type.
        ValueError: on mismatched shapes or devices, a mask that does not
            broadcast or is not 0/1, or a bad ``dropout_p``/``scale`` (as
            :func:`~attention_lib.scaled_dot_product_attention`).
    """
    batch_shape = check_attention_args(
        q, k, v, dropout_p=dropout_p, scale=scale, is_causal=is_causal
    )
    keep = None
    if mask is not None:
        keep = as_keep_mask(
            mask, q.shape[-2], k.shape[-2], is_causal=is_causal,
            batch_shape=batch_shape, device=q.device,
        )
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=keep, dropout_p=dropout_p,
        is_causal=is_causal and keep is None, scale=scale,
    )


register_backend("lib", lib_backend)
register_backend("torch", torch_backend)
from .tiled import tiled_backend  # noqa: E402  (chapter 8)

register_backend("tiled", tiled_backend)
