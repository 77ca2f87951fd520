"""Rotary position embeddings (RoPE): positions as rotations of queries and keys.

Chapter 7 *added* clock hands to the token embeddings: pair ``i`` of the
sinusoidal encoding turns by the angle ``p * omega_i`` at position ``p``. RoPE
(Su et al., *RoFormer*) uses the same clock speeds
``omega_i = base ** (-2 i / d_head)`` but *turns* each pair of coordinates of a
query or key by ``p * omega_i`` instead. A rotation keeps lengths, and the dot
product of a query turned by ``m * omega_i`` with a key turned by
``n * omega_i`` only sees the difference of the angles, ``(m - n) * omega_i``:
attention scores depend on the relative position ``m - n`` alone.

Two layouts pair the coordinates differently:

* **rotate-half** (🤗 transformers' Llama, GPT-NeoX; the default): coordinate ``j`` is
  paired with ``j + d_head / 2``;
* **interleaved** (RoFormer, GPT-J, Meta's original Llama code): coordinate
  ``2 i`` is paired with ``2 i + 1``.

They are the same function up to a fixed permutation of the coordinates
(see :func:`~attention_lib.rope_permutation`).

Explained in chapter 9, *Attention in today's LLMs*.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from .validation import check_base, check_bool, check_int, check_positions, check_tensor


def rope_frequencies(
    d_head: int,
    *,
    base: float = 10000.0,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""The angular speed of every coordinate pair: :math:`\omega_i = \mathrm{base}^{-2i/d}`.

    The clock speeds of chapter 7's sinusoidal encoding, with ``d = d_head``:
    pair 0 turns by one radian per position, the last pair almost not at all.
    Computed in float64.

    Explained in chapter 9, *Attention in today's LLMs*.

    Args:
        d_head: width of one head (even).
        base: the wavelength scale (10000 in RoFormer and Llama 2, 500000 in
            Llama 3).
        device: device of the result.

    Returns:
        float64 tensor of shape ``(d_head // 2,)``.

    Raises:
        TypeError: if ``d_head`` is not an int or ``base`` not a number.
        ValueError: if ``d_head`` is not a positive even number or ``base <= 1``.
    """
    return inverse_frequencies(check_d_head(d_head), check_base(base), device)


def apply_rope(
    x: Tensor,
    positions: Tensor | None = None,
    *,
    base: float = 10000.0,
    interleaved: bool = False,
) -> Tensor:
    r"""Rotate every coordinate pair of ``x`` by its position times its clock speed.

    For each pair :math:`(x_1, x_2)` with speed :math:`\omega_i` at position
    :math:`p`:

    .. math::

        \begin{pmatrix} x_1' \\ x_2' \end{pmatrix} =
        \begin{pmatrix} \cos p\omega_i & -\sin p\omega_i \\
                        \sin p\omega_i & \cos p\omega_i \end{pmatrix}
        \begin{pmatrix} x_1 \\ x_2 \end{pmatrix}

    Apply it to queries and keys (never to values), after splitting heads. The
    default rotate-half layout equals 🤗 transformers'
    ``apply_rotary_pos_emb`` with ``LlamaRotaryEmbedding``. The angles are
    computed in float64 and rounded once to ``x.dtype``.

    Explained in chapter 9, *Attention in today's LLMs*.

    Args:
        x: queries or keys, ``(..., L, d_head)`` with an even ``d_head``.
        positions: integer positions; ``None`` means ``0 .. L-1``. Shape
            ``(L,)`` or any shape broadcastable to ``x.shape[:-1]`` (e.g.
            ``(B, 1, L)`` for per-sequence offsets). With a KV cache, the new
            tokens' positions are ``arange(t, t + L)``.
        base: the wavelength scale of :func:`rope_frequencies`.
        interleaved: pair coordinates ``(2i, 2i+1)`` instead of
            ``(i, i + d_head/2)``.

    Returns:
        A tensor like ``x`` (same shape, dtype and device).

    Raises:
        TypeError: if ``x`` is not a floating tensor, ``positions`` not an
            integer tensor, ``base`` not a number or ``interleaved`` not a bool.
        ValueError: if ``d_head`` is odd, ``base <= 1``, or ``positions`` is on
            another device or does not broadcast to ``x.shape[:-1]``.

    Shapes:
        - x: ``(..., L, d_head)``
        - positions: ``(L,)`` or broadcastable to ``(..., L)``
        - output: ``(..., L, d_head)``

    Example:
        >>> q = torch.randn(2, 4, 10, 8)  # (B, H, L, d_head)
        >>> apply_rope(q).shape
        torch.Size([2, 4, 10, 8])
    """
    check_d_head(check_tensor("x", x).shape[-1], name="x.shape[-1] (d_head)")
    base = check_base(base)
    check_bool("interleaved", interleaved)
    if positions is None:
        positions = torch.arange(x.shape[-2], device=x.device)  # (L,)
    check_positions(positions, x.shape[:-1], x.device)
    cos, sin = rope_cos_sin(positions, x.shape[-1], base=base, dtype=x.dtype)
    return rotate_pairs(x, cos, sin, interleaved=interleaved)


def rope_permutation(d_head: int) -> Tensor:
    """The coordinate order that turns the rotate-half layout into the interleaved one.

    ``x[..., perm]`` moves the pair ``(j, j + d_head/2)`` of the rotate-half
    layout to the places ``(2j, 2j+1)`` of the interleaved layout, so that

    ``apply_rope(x[..., perm], interleaved=True) == apply_rope(x)[..., perm]``.

    This is how 🤗 transformers converts Meta's interleaved Llama checkpoints: it
    permutes the rows of ``W_q`` and ``W_k`` once, and attention scores do not
    change (a permutation of coordinates keeps every dot product).

    Explained in chapter 9, *Attention in today's LLMs*.

    Args:
        d_head: width of one head (even).

    Returns:
        long tensor ``[0, d/2, 1, d/2 + 1, ...]`` of shape ``(d_head,)``.
    """
    half = check_d_head(d_head) // 2
    return torch.stack([torch.arange(half), torch.arange(half, d_head)], dim=-1).flatten()


# --- unchecked cores, shared with MultiHeadAttention and the sinusoidal encoding ------


@functools.lru_cache(maxsize=64)
def inverse_frequencies(width: int, base: float, device: torch.device | str | None) -> Tensor:
    """``omega_i = base ** (-2 i / width)`` for ``i = 0 .. ceil(width / 2) - 1``, in
    float64: the clock speeds of chapter 7's sinusoidal encoding and of RoPE.
    Cached (every layer asks again at every step); callers never modify it."""
    two_i = torch.arange(0, width, 2, dtype=torch.float64, device=device)  # (ceil(d/2),)
    return torch.exp(-math.log(base) * two_i / width)  # (ceil(d/2),)


def rope_cos_sin(
    positions: Tensor, d_head: int, *, base: float, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """``cos`` and ``sin`` of the angles ``p * omega_i``, each ``(..., L, d/2)``."""
    omega = inverse_frequencies(d_head, base, positions.device)  # (d/2,)
    angle = positions.to(torch.float64)[..., None] * omega  # (..., L, d/2)
    return angle.cos().to(dtype), angle.sin().to(dtype)


def rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False) -> Tensor:
    """Turn the pairs of ``x (..., L, d)`` by the angles of ``cos``/``sin`` ``(..., L, d/2)``."""
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., L, d/2) each
    else:
        x1, x2 = x.chunk(2, dim=-1)  # (..., L, d/2) each
    turned = (x1 * cos - x2 * sin, x1 * sin + x2 * cos)
    if interleaved:
        return torch.stack(turned, dim=-1).flatten(-2)  # (..., L, d/2, 2) -> (..., L, d)
    return torch.cat(turned, dim=-1)  # (..., L, d)


def check_d_head(d_head: object, *, name: str = "d_head") -> int:
    """A head width for RoPE: a positive even int (RoPE turns coordinate pairs)."""
    if check_int(name, d_head, minimum=0) < 2 or d_head % 2:
        raise ValueError(f"{name} must be a positive even int (RoPE turns pairs), got {d_head}")
    return int(d_head)
