"""Mamba-2's state-space layer as linear attention with a scalar decay (SSD).

Mamba-2 (Dao and Gu, 2024) keeps, per head, an ``(N, P)`` state (``N``
the state size, ``P`` the head dimension) and updates it with a scalar,
input-dependent decay ``exp(dt_t A)`` (``dt_t > 0``, ``A < 0``):

.. code-block:: text

    S_t = exp(dt_t A) S_{t-1} + B_t (dt_t x_t)^T,     y_t = S_t^T C_t + D x_t

Rename ``C -> q``, ``B -> k``, ``dt x -> v`` and ``dt A -> g``: it is causal
linear attention whose state decays by ``exp(g_t)`` each token, with no
softmax and no delta correction. Unrolled, ``o_t = sum_{s<=t} exp(c_t - c_s)
(q_t . k_s) v_s`` with ``c_t = g_1 + ... + g_t``: the ``(L, L)`` score
matrix ``Q K^T`` masked by the lower-triangular *semiseparable* matrix
``exp(c_t - c_s)`` (:func:`ssd_mask`). That is the state-space duality
(SSD): one operator, computed as a recurrence (``O(L N P)``), as a masked
quadratic form (``O(L^2)``), or in chunks (quadratic inside, recurrent
across), as Mamba-2's kernel does. It says nothing about softmax attention:
the mask is a product of scalar decays, one per head and token.

Explained in chapter 18, *Attention without softmax*.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .masks import causal_mask
from .validation import (
    check_attention_args,
    check_choice,
    check_int,
    check_same,
    check_tensor,
)

#: Accepted values of ``ssd(schedule=...)``.
SCHEDULES = ("quadratic", "chunked", "recurrent")


def ssd_mask(g: Tensor) -> Tensor:
    """The semiseparable mask of a scalar log-decay ``g``.

    ``M[..., t, s] = exp(g_{s+1} + ... + g_t)`` for ``s <= t`` (``1`` on the
    diagonal), ``0`` above it: how much of token ``s``'s write is left in the
    state at token ``t``. Explained in chapter 18, *Attention without softmax*.

    Args:
        g: ``(..., L)`` log-decay, ``<= 0``.

    Returns:
        ``(..., L, L)`` lower-triangular, in ``g``'s dtype.
    """
    c = g.cumsum(-1)  # (..., L)
    keep = causal_mask(g.shape[-1], device=g.device)  # (L, L): s <= t
    return (c.unsqueeze(-1) - c.unsqueeze(-2)).masked_fill(~keep, -torch.inf).exp()


def ssd(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    g: Tensor,
    *,
    schedule: str = "chunked",
    chunk_size: int = 64,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Linear attention with a scalar decay per head and token: Mamba-2's SSD.

    ``S_t = exp(g_t) S_{t-1} + k_t v_t^T`` and ``o_t = S_t^T q_t`` (no scale,
    no softmax), from ``S_0`` = ``initial_state`` or zeros. The schedules give
    the same numbers up to rounding: ``"quadratic"``, ``(Q K^T * M) V`` with
    the semiseparable mask ``M`` of :func:`ssd_mask`; ``"recurrent"``, one
    token at a time; ``"chunked"``, quadratic inside chunks of
    ``chunk_size`` tokens, the state carried across them.

    Explained in chapter 18, *Attention without softmax*.

    Args:
        query: ``(B, H, L, N)``, Mamba-2's ``C``.
        key: ``(B, H, L, N)``, Mamba-2's ``B``.
        value: ``(B, H, L, P)``, Mamba-2's ``dt * x``.
        g: ``(B, H, L)`` log-decay ``<= 0``, Mamba-2's ``dt * A``.
        schedule: ``"quadratic"``, ``"chunked"`` or ``"recurrent"``.
        chunk_size: tokens per chunk of the ``"chunked"`` schedule.
        initial_state: ``(B, H, N, P)`` or ``None`` for zeros.
        output_final_state: also return the state after the last token.

    Returns:
        ``(B, H, L, P)``, or ``(output, state)`` with ``state`` ``(B, H, N, P)``.

    Raises:
        TypeError: if a tensor is not floating.
        ValueError: on mismatched shapes, ``g > 0``, an unknown schedule or
            ``chunk_size < 1``.
    """
    check_attention_args(query, key, value, dropout_p=0.0, scale=None, is_causal=True)
    B, H, L, N = check_tensor("key", key, min_dim=4).shape
    shapes = {"query": query.shape[:3], "value": value.shape[:3], "key": key.shape[:3]}
    check_same("(B, H, L)", **shapes, g=check_tensor("g", g).shape)
    if bool((g > 0).any()):
        raise ValueError("g is a log-decay and must be <= 0 everywhere, got a positive entry")
    check_choice("schedule", schedule, SCHEDULES)
    chunk_size = check_int("chunk_size", chunk_size, minimum=1)
    state = key.new_zeros(B, H, N, value.shape[-1]) if initial_state is None else initial_state
    check_same("shape", initial_state=tuple(check_tensor("initial_state", state).shape),
               expected=(B, H, N, value.shape[-1]))  # fmt: skip
    size = L if schedule == "quadratic" else 1 if schedule == "recurrent" else chunk_size
    dtype = torch.promote_types(torch.promote_types(query.dtype, g.dtype), torch.float32)
    out, state = _ssd_chunked(*(t.to(dtype) for t in (query, key, value, g, state)), size)
    return (out.to(query.dtype), state) if output_final_state else out.to(query.dtype)


def _ssd_chunked(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, state: Tensor, size: int
) -> tuple[Tensor, Tensor]:
    """Chunks of ``size`` tokens: masked quadratic inside, the state across.
    ``size = L`` is the quadratic form, ``size = 1`` the recurrence."""
    B, H, L, _ = k.shape
    pad = -L % size  # k = 0 writes nothing, g = 0 decays nothing
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g = F.pad(g, (0, pad))
    n = (L + pad) // size
    q, k, v = (t.reshape(B, H, n, size, t.shape[-1]) for t in (q, k, v))  # (B, H, n, C, d)
    g = g.reshape(B, H, n, size)
    c = g.cumsum(-1).unsqueeze(-1)  # (B, H, n, C, 1): log-decay since the chunk began
    within = (q @ k.transpose(-2, -1)) * ssd_mask(g) @ v  # (B, H, n, C, P): inside the chunk
    k_decayed = k * (c[..., -1:, :] - c).exp()  # writes, decayed to the chunk's end
    outputs = []
    for i in range(n):  # across chunks: through the state
        outputs.append(within[:, :, i] + (q[:, :, i] * c[:, :, i].exp()) @ state)
        end = c[:, :, i, -1:].exp()  # (B, H, 1, 1)
        state = state * end + k_decayed[:, :, i].transpose(-2, -1) @ v[:, :, i]  # (B, H, N, P)
    out = torch.stack(outputs, dim=2).reshape(B, H, n * size, -1)[:, :, :L]
    return out, state  # (B, H, L, P), (B, H, N, P)


def mamba2_scan(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    **kwargs,
) -> Tensor | tuple[Tensor, Tensor]:
    """Mamba-2's selective scan in its own names, computed by :func:`ssd`.

    ``y = ssd(C, B, dt * x, dt * A) + D * x``, with ``B`` and ``C`` shared by
    the ``H // G`` consecutive heads of a group (Mamba-2's ``n_groups``).
    ``dt`` is the step *after* ``softplus(dt + dt_bias)`` and the clamp to
    ``time_step_limit``, which the layer applies.

    Explained in chapter 18, *Attention without softmax*.

    Args:
        x: ``(batch, H, L, P)`` the heads' inputs.
        dt: ``(batch, H, L)`` positive steps.
        A: ``(H,)`` negative rates (``-exp(A_log)``).
        B: ``(batch, G, L, N)``, ``G`` dividing ``H``: what is written.
        C: ``(batch, G, L, N)``: what is read.
        D: ``(H,)`` skip connection, or ``None``.
        **kwargs: ``schedule``, ``chunk_size``, ``initial_state``
            ``(batch, H, N, P)``, ``output_final_state``, as in :func:`ssd`.

    Returns:
        ``(batch, H, L, P)``, or ``(y, state)`` as :func:`ssd`.

    Raises:
        ValueError: if ``dt <= 0`` or ``A >= 0`` somewhere, ``G`` does not
            divide ``H``, or as :func:`ssd`.
    """
    H = check_tensor("x", x, min_dim=4).shape[1]
    check_tensor("dt", dt), check_tensor("A", A, min_dim=1)
    if bool((dt <= 0).any()) or bool((A >= 0).any()):
        raise ValueError("Mamba-2 needs dt > 0 and A < 0 (a decay exp(dt A) below 1)")
    if check_tensor("B", B, min_dim=4).shape[1] == 0 or H % B.shape[1]:
        raise ValueError(f"the groups of B and C must divide the {H} heads, got {B.shape[1]}")
    check_same("shape", B=tuple(B.shape), C=tuple(check_tensor("C", C, min_dim=4).shape))
    q, k = (t.repeat_interleave(H // B.shape[1], dim=1) for t in (C, B))  # (batch, H, L, N)
    result = ssd(q, k, x * dt.unsqueeze(-1), dt * A[:, None], **kwargs)
    if D is None:
        return result
    out, *state = result if isinstance(result, tuple) else (result,)
    out = out + D[:, None, None] * x
    return (out, *state) if state else out
