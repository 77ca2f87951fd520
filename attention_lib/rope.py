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

**Scaling** (long contexts). A model trained on ``L`` positions has never seen
the slowest pairs turn further than ``L * omega_i``. A ``scaling`` dict in 🤗
transformers' ``rope_parameters`` format stretches the clocks so that a longer
context stays inside the angles seen in training: ``"linear"`` (position
interpolation: every speed divided by ``factor``), ``"dynamic"`` (NTK-aware:
a larger base, from the length of the sequence), ``"yarn"`` (fast pairs kept,
slow pairs interpolated, a ramp between, and an *attention factor* that
multiplies ``cos`` and ``sin``) and ``"llama3"`` (Llama 3.1's band-wise rule).

Explained in chapter 10, *Attention in today's LLMs*; scaling in chapter 16,
*Long contexts*.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from .validation import (
    check_base,
    check_bool,
    check_choice,
    check_instance,
    check_int,
    check_positions,
    check_tensor,
)


def rope_frequencies(
    d_head: int,
    *,
    base: float = 10000.0,
    scaling: dict | None = None,
    seq_len: int | None = None,
    device: torch.device | str | None = None,
) -> tuple[Tensor, float]:
    r"""The angular speed of every coordinate pair, :math:`\omega_i = \mathrm{base}^{-2i/d}`,
    and the attention factor.

    The clock speeds of chapter 7's sinusoidal encoding, with ``d = d_head``:
    pair 0 turns by one radian per position, the last pair almost not at all.
    Computed in float64. A ``scaling`` changes the speeds (and, for YaRN, the
    attention factor that multiplies ``cos`` and ``sin``), as
    ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type]`` does.

    Explained in chapter 10, *Attention in today's LLMs*; scaling in chapter
    16, *Long contexts*.

    Args:
        d_head: width of one head (even).
        base: the wavelength scale (10000 in RoFormer and Llama 2, 500000 in
            Llama 3).
        scaling: ``None`` or a dict in transformers' ``rope_parameters`` format:
            ``{"rope_type": "default"}``; ``"linear"`` with ``factor``;
            ``"dynamic"`` with ``factor`` and ``original_max_position_embeddings``
            (transformers reads the config's ``max_position_embeddings``);
            ``"yarn"`` with ``factor``, ``original_max_position_embeddings`` and
            optionally ``attention_factor``, ``beta_fast`` (32), ``beta_slow``
            (1), ``mscale``, ``mscale_all_dim``, ``truncate`` (True);
            ``"llama3"`` with ``factor``, ``low_freq_factor``,
            ``high_freq_factor``, ``original_max_position_embeddings``. A
            ``rope_theta`` key must equal ``base``.
        seq_len: the sequence length, for ``"dynamic"`` only (its base grows
            with it; ``None`` = the original length).
        device: device of the result.

    Returns:
        The pair ``(omega, attention_factor)``, a float64 tensor of shape
        ``(d_head // 2,)`` and a float (1.0 except for YaRN).

    Raises:
        TypeError: if ``d_head`` is not an int, ``base`` not a number or
            ``scaling`` not a dict.
        ValueError: if ``d_head`` is not a positive even number, ``base <= 1``,
            or ``scaling`` has an unknown ``rope_type``, misses a field or has
            one its type does not use.
    """
    scaling = check_rope_scaling(scaling, check_base(base))
    seq_len = None if seq_len is None else check_int("seq_len", seq_len, minimum=1)
    return scaled_frequencies(check_d_head(d_head), base, scaling, seq_len, device)


def apply_rope(
    x: Tensor,
    positions: Tensor | None = None,
    *,
    base: float = 10000.0,
    scaling: dict | None = None,
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
    computed in float64 and rounded once to ``x.dtype``. With a ``scaling``,
    the speeds are :func:`rope_frequencies`' and ``cos`` and ``sin`` are
    multiplied by its attention factor, as ``LlamaRotaryEmbedding`` does
    (``"dynamic"`` takes ``seq_len = max(positions) + 1``, as transformers
    does in one pass).

    Explained in chapter 10, *Attention in today's LLMs*; scaling in chapter
    16, *Long contexts*.

    Args:
        x: queries or keys, ``(..., L, d_head)`` with an even ``d_head``.
        positions: integer positions; ``None`` means ``0 .. L-1``. Shape
            ``(L,)`` or any shape broadcastable to ``x.shape[:-1]`` (e.g.
            ``(B, 1, L)`` for per-sequence offsets). With a KV cache, the new
            tokens' positions are ``arange(t, t + L)``.
        base: the wavelength scale of :func:`rope_frequencies`.
        scaling: a ``scaling`` dict of :func:`rope_frequencies`, or ``None``.
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
    scaling = check_rope_scaling(scaling, base)
    check_bool("interleaved", interleaved)
    if positions is None:
        positions = torch.arange(x.shape[-2], device=x.device)  # (L,)
    check_positions(positions, x.shape[:-1], x.device)
    cos, sin = rope_cos_sin(positions, x.shape[-1], base=base, dtype=x.dtype, scaling=scaling)
    return rotate_pairs(x, cos, sin, interleaved=interleaved)


def rope_permutation(d_head: int) -> Tensor:
    """The coordinate order that turns the rotate-half layout into the interleaved one.

    ``x[..., perm]`` moves the pair ``(j, j + d_head/2)`` of the rotate-half
    layout to the places ``(2j, 2j+1)`` of the interleaved layout, so that

    ``apply_rope(x[..., perm], interleaved=True) == apply_rope(x)[..., perm]``.

    This is how 🤗 transformers converts Meta's interleaved Llama checkpoints: it
    permutes the rows of ``W_q`` and ``W_k`` once, and attention scores do not
    change (a permutation of coordinates keeps every dot product).

    Explained in chapter 10, *Attention in today's LLMs*.

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
    positions: Tensor,
    d_head: int,
    *,
    base: float,
    dtype: torch.dtype,
    scaling: tuple | None = None,
) -> tuple[Tensor, Tensor]:
    """``cos`` and ``sin`` of the angles ``p * omega_i``, each ``(..., L, d/2)``, times
    the attention factor of a ``scaling`` (as :func:`check_rope_scaling` returns it)."""
    seq_len = None
    if scaling is not None and dict(scaling)["rope_type"] == "dynamic" and positions.numel():
        seq_len = int(positions.max()) + 1  # transformers: the longest position of the call
    omega, factor = scaled_frequencies(d_head, base, scaling, seq_len, positions.device)
    angle = positions.to(torch.float64)[..., None] * omega  # (..., L, d/2)
    return (angle.cos() * factor).to(dtype), (angle.sin() * factor).to(dtype)


#: The fields of each ``rope_type`` (required, optional) of a ``scaling`` dict.
ROPE_SCALING_FIELDS = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "dynamic": (("factor", "original_max_position_embeddings"), ()),
    "yarn": (
        ("factor", "original_max_position_embeddings"),
        ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"),
    ),
    "llama3": (
        ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
        (),
    ),
}


@functools.lru_cache(maxsize=64)
def scaled_frequencies(
    d_head: int,
    base: float,
    scaling: tuple | None,
    seq_len: int | None,
    device: torch.device | str | None,
) -> tuple[Tensor, float]:
    """:func:`rope_frequencies` without the checks; ``scaling`` is the sorted tuple
    of the dict's items (hashable, so that the result is cached)."""
    omega = inverse_frequencies(d_head, base, device)  # (d/2,), float64
    options = dict(scaling or {"rope_type": "default"})
    kind, factor = options["rope_type"], options.get("factor", 1.0)
    if kind == "linear":  # position interpolation: every clock slowed down by `factor`
        return omega / factor, 1.0
    if kind == "dynamic":  # NTK-aware: a larger base, from the sequence length
        original = options["original_max_position_embeddings"]
        ratio = factor * max(seq_len or original, original) / original - (factor - 1)
        return inverse_frequencies(d_head, base * ratio ** (d_head / (d_head - 2)), device), 1.0
    if kind == "llama3":  # band-wise: fast pairs kept, slow ones / factor, a ramp between
        original = options["original_max_position_embeddings"]
        low, high = options["low_freq_factor"], options["high_freq_factor"]
        wavelength = 2 * math.pi / omega  # (d/2,)
        smooth = ((original / wavelength - low) / (high - low)).clamp(0, 1)  # 0: slow, 1: fast
        return (1 - smooth) * omega / factor + smooth * omega, 1.0
    if kind == "yarn":  # ramp over the pairs by turns in training, and an attention factor
        return _yarn(omega, d_head, base, options)
    return omega, 1.0


def _yarn(omega: Tensor, d_head: int, base: float, options: dict) -> tuple[Tensor, float]:
    """YaRN's speeds and attention factor (Peng et al. 2023), as transformers computes them."""
    factor, original = options["factor"], options["original_max_position_embeddings"]

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = options.get("attention_factor")
    if attention_factor is None:
        m, m_all = options.get("mscale"), options.get("mscale_all_dim")
        attention_factor = (
            mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
        )

    def pair_turning(turns: float) -> float:  # the pair that turns `turns` times in training
        return d_head * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = (
        pair_turning(options.get("beta_fast") or 32),
        pair_turning(options.get("beta_slow") or 1),
    )
    if options.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d_head - 1)
    high = high + 0.001 if low == high else high
    ramp = (
        (torch.arange(d_head // 2, dtype=torch.float64, device=omega.device) - low) / (high - low)
    ).clamp(0, 1)
    keep = 1 - ramp  # 1: the fast pairs, extrapolated (kept); 0: the slow ones, interpolated
    return omega / factor * (1 - keep) + omega * keep, float(attention_factor)


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


def check_rope_scaling(scaling: object, base: float) -> tuple | None:
    """A ``scaling`` dict of :func:`rope_frequencies`: a known ``rope_type`` with its
    fields (and a ``rope_theta``, if any, equal to ``base``), as a sorted tuple of items."""
    if scaling is None:
        return None
    check_instance("scaling", scaling, dict, "a dict like transformers' rope_parameters")
    kind = scaling.get("rope_type", "default")
    check_choice("scaling['rope_type']", kind, tuple(ROPE_SCALING_FIELDS))
    required, optional = ROPE_SCALING_FIELDS[kind]
    fields = set(scaling) - {"rope_type", "rope_theta"}
    theta = scaling.get("rope_theta", base)
    if fields - {*required, *optional} or set(required) - fields or theta != base:
        raise ValueError(f"scaling {kind!r} takes {required} + {optional}, base={base}: {scaling}")
    return tuple(sorted({**scaling, "rope_type": kind}.items()))


def check_d_head(d_head: object, *, name: str = "d_head") -> int:
    """A head width for RoPE: a positive even int (RoPE turns coordinate pairs)."""
    if check_int(name, d_head, minimum=0) < 2 or d_head % 2:
        raise ValueError(f"{name} must be a positive even int (RoPE turns pairs), got {d_head}")
    return int(d_head)
