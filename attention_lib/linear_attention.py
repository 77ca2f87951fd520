"""Attention without softmax: linear attention and the gated delta rule.

Softmax attention compares every query with every key: its work grows as
``L**2`` and its KV cache by one key and one value per token. Drop the softmax
and replace ``exp(q . k)`` by a product of features ``phi(q) . phi(k)``, and
the sum over the keys can be taken *before* the query arrives:

.. code-block:: text

    o_t = sum_{s <= t} (phi(q_t) . phi(k_s)) v_s = phi(q_t)^T S_t,
    S_t = S_{t-1} + phi(k_t) v_t^T                      (a d_k x d_v state)

Causal linear attention is an RNN with a matrix-valued state
(Katharopoulos et al., 2020). It only ever *adds* to the state, so an old
value stored under a key is never removed. The **delta rule** (DeltaNet)
first reads what the state holds under ``k_t`` and writes only the
difference, with a strength ``beta_t``; **Gated DeltaNet** (Qwen3-Next, Kimi
Linear's KDA is a finer-gated variant) also lets the whole state decay by
``alpha_t = exp(g_t)``:

.. code-block:: text

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t

Each operator has several *schedules* that compute the same numbers:
quadratic (an ``L x L`` masked matrix, like attention), recurrent (one token
at a time through the state, like an RNN) and chunked (quadratic inside
chunks of ``C`` tokens, recurrent across them).

**Half precision.** float16 and bfloat16 inputs are computed in float32 (the
features, the state, the sums and the triangular solve) and the output is
rounded back once, as chapter 11's tiled attention does: a state summed over
hundreds of tokens in float16 loses digits at every step.

Explained in chapter 18, *Attention without softmax*.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .masks import causal_mask
from .validation import (
    check_attention_args,
    check_bool,
    check_choice,
    check_int,
    check_same,
    check_tensor,
)

#: Accepted values of ``linear_attention(feature_map=...)`` (``None`` means ``"identity"``).
FEATURE_MAPS = ("elu+1", "identity")

#: Accepted values of ``linear_attention(schedule=...)``.
SCHEDULES = ("quadratic", "chunked", "recurrent")


def _compute_dtype(*tensors: Tensor) -> torch.dtype:
    """The dtype to compute in: the widest of the inputs', at least float32."""
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _features(x: Tensor, feature_map: str) -> Tensor:
    """phi(x): ``elu(x) + 1`` (positive, Katharopoulos et al.) or ``x`` itself."""
    return F.elu(x) + 1.0 if feature_map == "elu+1" else x


def linear_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    feature_map: str | None = "elu+1",
    causal: bool = True,
    normalize: bool | None = None,
    schedule: str = "quadratic",
    chunk_size: int = 64,
) -> Tensor:
    """Linear attention: ``phi(q) . phi(k)`` in place of ``exp(q . k)``, no softmax.

    ``o_i = sum_j (phi(q_i) . phi(k_j)) v_j``, over the keys ``j <= i`` if
    ``causal``, divided by ``sum_j phi(q_i) . phi(k_j)`` if ``normalize``
    (the normaliser that softmax attention gets from the softmax). The three
    schedules compute the same numbers:

    - ``"quadratic"``: the ``(L, L)`` matrix ``phi(Q) phi(K)^T``, masked like
      causal attention, times ``V``: ``O(L^2 d)`` work and memory;
    - ``"recurrent"``: one token at a time, ``S_t = S_{t-1} + phi(k_t) v_t^T``
      and ``o_t = phi(q_t)^T S_t``: ``O(L d^2)`` work, a ``(d_k, d_v)`` state;
    - ``"chunked"``: quadratic inside chunks of ``chunk_size`` tokens, the
      state carried from chunk to chunk: ``O(L (C d + d^2))`` work.

    Without ``causal`` every query reads every key; the schedules then all
    form the state ``phi(K)^T V`` once (the recurrent and chunked ones) or
    the full matrix (the quadratic one).

    Explained in chapter 18, *Attention without softmax*.

    Args:
        query: ``(..., L, d_k)``, e.g. ``(B, H, L, d_k)`` as for
            :func:`~attention_lib.scaled_dot_product_attention`.
        key: ``(..., L, d_k)``.
        value: ``(..., L, d_v)``.
        feature_map: ``"elu+1"`` (``elu(x) + 1``, always positive: the map of
            Katharopoulos et al. 2020) or ``"identity"`` / ``None`` (``phi(x) =
            x``, plain unnormalised linear attention, as inside DeltaNet).
        causal: query ``i`` reads the keys ``0 .. i`` only.
        normalize: divide by ``sum_j phi(q_i) . phi(k_j)``. Defaults to
            ``True`` for ``"elu+1"`` and ``False`` for the identity, whose
            denominator can be zero or negative (so ``normalize=True`` is
            refused with it).
        schedule: ``"quadratic"``, ``"chunked"`` or ``"recurrent"``.
        chunk_size: tokens per chunk of the ``"chunked"`` schedule.

    Returns:
        ``(..., L, d_v)`` in the dtype of ``query`` (computed in float32 when
        that is float16 or bfloat16).

    Raises:
        TypeError: if the tensors are not floating tensors or an option has
            the wrong type.
        ValueError: on mismatched shapes, an unknown feature map or schedule,
            or ``normalize=True`` with the identity map.
    """
    check_attention_args(query, key, value, dropout_p=0.0, scale=None, is_causal=causal)
    check_same("length L (dim -2)", query=query.shape[-2], key=key.shape[-2])
    feature_map = "identity" if feature_map is None else feature_map
    check_choice("feature_map", feature_map, FEATURE_MAPS)
    check_choice("schedule", schedule, SCHEDULES)
    chunk_size = check_int("chunk_size", chunk_size, minimum=1)
    normalize = feature_map == "elu+1" if normalize is None else check_bool("normalize", normalize)
    if normalize and feature_map == "identity":
        raise ValueError("normalize=True needs a positive feature map such as 'elu+1'")
    out_dtype = query.dtype
    dtype = _compute_dtype(query)  # float32 for float16 / bfloat16: one rounding at the end
    query, key, value = (t.to(dtype) for t in (query, key, value))  # no copy if already dtype
    phi_q, phi_k = _features(query, feature_map), _features(key, feature_map)
    if schedule == "quadratic":
        out = _quadratic(phi_q, phi_k, value, causal, normalize)
    elif not causal:  # one state holds every key: S = phi(K)^T V
        out = _read(phi_q, phi_k.transpose(-2, -1) @ value, phi_k.sum(-2), normalize)
    elif schedule == "recurrent":
        out = _recurrent(phi_q, phi_k, value, normalize)
    else:
        out = _chunked(phi_q, phi_k, value, normalize, chunk_size)
    return out.to(out_dtype)


def _read(phi_q: Tensor, state: Tensor, norm: Tensor, normalize: bool) -> Tensor:
    """``phi(q)^T S``, divided by ``phi(q) . z`` if ``normalize`` (z = sum of phi(k))."""
    out = phi_q @ state  # (..., L, d_v)
    return out / (phi_q @ norm.unsqueeze(-1)) if normalize else out


def _quadratic(phi_q: Tensor, phi_k: Tensor, value: Tensor, causal: bool, normalize: bool):
    scores = phi_q @ phi_k.transpose(-2, -1)  # (..., L, L): no softmax
    if causal:
        scores = scores * causal_mask(scores.shape[-1], device=scores.device)
    out = scores @ value  # (..., L, d_v)
    return out / scores.sum(-1, keepdim=True) if normalize else out


def _recurrent(phi_q: Tensor, phi_k: Tensor, value: Tensor, normalize: bool) -> Tensor:
    state = phi_q.new_zeros(*phi_k.shape[:-2], phi_k.shape[-1], value.shape[-1])  # (..., dk, dv)
    norm = phi_q.new_zeros(phi_k.shape[:-2] + phi_k.shape[-1:])  # (..., d_k)
    outputs = []
    for t in range(phi_q.shape[-2]):
        k_t = phi_k[..., t, :]  # (..., d_k)
        state = state + k_t.unsqueeze(-1) * value[..., t, None, :]  # + phi(k_t) v_t^T
        norm = norm + k_t
        outputs.append(_read(phi_q[..., t : t + 1, :], state, norm, normalize))  # (..., 1, dv)
    return torch.cat(outputs, dim=-2)  # (..., L, d_v)


def _chunked(phi_q: Tensor, phi_k: Tensor, value: Tensor, normalize: bool, size: int) -> Tensor:
    state = phi_q.new_zeros(*phi_k.shape[:-2], phi_k.shape[-1], value.shape[-1])  # (..., dk, dv)
    norm = phi_q.new_zeros(phi_k.shape[:-2] + phi_k.shape[-1:])  # (..., d_k)
    outputs = []
    for start in range(0, phi_q.shape[-2], size):
        q, k, v = (t[..., start : start + size, :] for t in (phi_q, phi_k, value))  # (..., C, d)
        scores = q @ k.transpose(-2, -1)  # (..., C, C): inside the chunk
        scores = scores * causal_mask(scores.shape[-1], device=scores.device)
        out = q @ state + scores @ v  # the earlier chunks through the state, this one directly
        if normalize:
            out = out / (q @ norm.unsqueeze(-1) + scores.sum(-1, keepdim=True))
        outputs.append(out)
        state = state + k.transpose(-2, -1) @ v  # (..., d_k, d_v)
        norm = norm + k.sum(-2)
    return torch.cat(outputs, dim=-2)  # (..., L, d_v)


def gated_delta_rule(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    scale: float | None = None,
    chunk_size: int | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """The gated delta rule, Gated DeltaNet's token mixer, recurrent or chunked.

    Per head, with a ``(d_k, d_v)`` state ``S`` (zero, or ``initial_state``):

    .. code-block:: text

        S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
        o_t = S_t^T (scale * q_t)

    ``exp(g_t)`` decays the whole state (``g_t = 0``: no decay, plain
    DeltaNet); ``beta_t`` is how far the value stored under ``k_t`` moves
    towards ``v_t`` (``1`` replaces it when ``||k_t|| = 1``). Keys should have
    unit norm for the update to be stable: Qwen3-Next L2-normalises queries and
    keys before calling it (:class:`~attention_lib.gated_deltanet.GatedDeltaNet`
    does too); this function takes them as they are.

    With ``chunk_size=None`` the state is updated one token at a time (the
    recurrent form, ``O(L d_k d_v)`` work). With ``chunk_size=C`` the tokens
    of a chunk are computed together: the ``C`` delta-rule updates of a chunk
    are folded into one lower-triangular solve (the WY/UT representation of
    DeltaNet), the state then carries the chunk to the next one. A
    ``chunk_size`` of at least ``L`` is the quadratic form: one chunk, an
    ``(L, L)`` system. All give the same numbers up to rounding.

    Conventions, against 🤗 transformers' ``torch_chunk_gated_delta_rule``
    and ``torch_recurrent_gated_delta_rule`` (Qwen3-Next): our tensors are
    ``(B, H, L, d)`` (theirs ``(B, L, H, d)``), ``g`` is the same log-decay,
    the query is scaled by ``1/sqrt(d_k)`` as theirs is (``scale`` changes
    that), L2 normalisation is left to the caller (their
    ``use_qk_l2norm_in_kernel=True``), and the query and key heads equal the
    value heads (repeat them for Qwen3-Next's grouped value heads).

    **Precision and dtypes.** Everything is computed in the widest dtype of
    the inputs, at least float32: float16 or bfloat16 ``q, k, v`` are
    computed in float32 (the decay, the state, the triangular solve) and the
    output is rounded back to ``query``'s dtype once. ``g``, ``beta`` and
    ``initial_state`` may have another floating dtype than ``q, k, v``:
    flash-linear-attention passes float32 ones with float16 ``q, k, v``, and
    so may you. The final state stays in the computing dtype (float32 for
    half-precision inputs, as fla's does), so a state carried from call to
    call does not lose digits at every call.

    Explained in chapter 18, *Attention without softmax*.

    Args:
        query: ``(B, H, L, d_k)``.
        key: ``(B, H, L, d_k)``, ideally of unit norm.
        value: ``(B, H, L, d_v)``.
        g: ``(B, H, L)`` log-decay, ``<= 0`` (the state is multiplied by ``exp(g)``).
        beta: ``(B, H, L)`` write strength, usually in ``(0, 1)`` (a sigmoid).
        scale: multiplies the query; ``None`` means ``1 / sqrt(d_k)``.
        chunk_size: ``None`` for the recurrent form, else the tokens per chunk.
        initial_state: ``(B, H, d_k, d_v)`` state before the first token (a
            cache's), or ``None`` for zeros.
        output_final_state: also return the state after the last token.

    Returns:
        ``output`` ``(B, H, L, d_v)`` in ``query``'s dtype, or ``(output,
        state)`` with ``state`` ``(B, H, d_k, d_v)`` if ``output_final_state``,
        in the computing dtype (float32 for float16 / bfloat16 inputs).

    Raises:
        TypeError: if an argument is not a floating tensor or has the wrong type.
        ValueError: on mismatched shapes or devices, ``g > 0`` anywhere, or
            ``chunk_size < 1``.
    """
    chunk_size = check_delta_args(
        query, key, value, g, beta, initial_state, scale, chunk_size, output_final_state
    )
    out, state = gated_delta_core(
        query, key, value, g, beta, initial_state, scale=scale, chunk_size=chunk_size
    )
    return (out, state) if output_final_state else out


def check_delta_args(
    query: Tensor, key: Tensor, value: Tensor, g: Tensor, beta: Tensor,
    initial_state: Tensor | None, scale: float | None, chunk_size: int | None,
    output_final_state: bool, *, per_channel: bool = False,
) -> int | None:  # fmt: skip
    """Validate the arguments of :func:`gated_delta_rule` (chapter 18) or,
    with ``per_channel``, of :func:`~attention_lib.kda.kimi_delta_attention`
    (whose ``g`` is ``(B, H, L, d_k)``); returns the checked ``chunk_size``."""
    check_attention_args(query, key, value, dropout_p=0.0, scale=scale, is_causal=True)
    check_tensor("g", g, min_dim=3), check_tensor("beta", beta, min_dim=3)
    B, H, L, d_k = key.shape
    shapes = {n: t.shape[:3] for n, t in zip(("query", "key", "value"), (query, key, value))}
    check_same("(B, H, L)", **shapes, beta=beta.shape)
    what = "shape (B, H, L, d_k)" if per_channel else "shape (B, H, L)"
    check_same(what, g=tuple(g.shape), expected=(B, H, L, d_k)[: 3 + per_channel])
    check_same("device", query=query.device, g=g.device, beta=beta.device)
    if bool((g > 0).any()):
        raise ValueError("g is a log-decay and must be <= 0 everywhere, got a positive entry")
    chunk_size = None if chunk_size is None else check_int("chunk_size", chunk_size, minimum=1)
    check_bool("output_final_state", output_final_state)
    if initial_state is not None:
        shape = check_tensor("initial_state", initial_state, min_dim=4).shape
        check_same("shape", initial_state=shape, expected=(B, H, d_k, value.shape[-1]))
        check_same("device", query=query.device, initial_state=initial_state.device)
    return chunk_size


def gated_delta_core(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    g: Tensor,
    beta: Tensor,
    initial_state: Tensor | None,
    *,
    scale: float | None,
    chunk_size: int | None,
) -> tuple[Tensor, Tensor]:
    """The core of :func:`gated_delta_rule`, without checks.

    The arguments are those of :func:`gated_delta_rule` (chapter 18), already
    validated by the caller (a model's layer, whose model checked its input
    once). Returns ``(output, final_state)``: the output in ``query``'s dtype,
    the state in the computing dtype (the widest of the inputs', at least
    float32).

    Grouped heads (Qwen3-Next's layout): ``query`` and ``key`` may have
    ``H_k`` heads where ``value``, ``g``, ``beta`` and the state have ``H``,
    ``H_k`` dividing ``H``; query/key head ``j`` then serves the ``H // H_k``
    consecutive value heads ``j * H // H_k, ...`` (as 🤗 transformers'
    ``repeat_interleave``). ``H_k = H`` is the ungrouped rule.

    Per-channel gate (Kimi Delta Attention, :mod:`attention_lib.kda`): ``g``
    may be ``(B, H, L, d_k)`` instead of ``(B, H, L)``; the decay is then the
    diagonal matrix ``diag(exp(g_t))`` applied to the rows of the state,
    ``S_t = diag(exp(g_t)) S_{t-1}`` before the delta update. A scalar gate
    is the per-channel one with every channel equal.
    """
    groups = value.shape[1] // key.shape[1]
    if groups > 1:  # each query/key head serves `groups` consecutive value heads
        query, key = (t.repeat_interleave(groups, dim=1) for t in (query, key))
    B, H, _, d_k = key.shape
    given = (g, beta) if initial_state is None else (g, beta, initial_state)
    out_dtype, dtype = query.dtype, _compute_dtype(query, *given)
    query, key, value, g, beta = (t.to(dtype) for t in (query, key, value, g, beta))
    if initial_state is None:
        initial_state = key.new_zeros(B, H, d_k, value.shape[-1])
    initial_state = initial_state.to(dtype)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    query = query * scale
    g = g.unsqueeze(-1) if g.dim() == 3 else g  # (B, H, L, D): D = 1 (scalar) or d_k
    if chunk_size is None:
        out, state = _delta_recurrent(query, key, value, g, beta, initial_state)
    else:
        size = min(chunk_size, key.shape[-2])  # no padding past the last token
        out, state = _delta_chunked(query, key, value, g, beta, initial_state, size)
    return out.to(out_dtype), state


def _delta_recurrent(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor
) -> tuple[Tensor, Tensor]:
    """The recurrent form of :func:`gated_delta_core` (``q``
    already scaled). Returns ``(output, final_state)``."""
    outputs = []
    for t in range(q.shape[-2]):
        k_t = k[..., t, :].unsqueeze(-1)  # (B, H, d_k, 1)
        state = state * g[..., t, :, None].exp()  # decay: (B, H, D, 1), D = 1 or d_k
        stored = (k_t * state).sum(-2, keepdim=True)  # (B, H, 1, d_v): what S holds under k_t
        delta = beta[..., t, None, None] * (v[..., t : t + 1, :] - stored)  # (B, H, 1, d_v)
        state = state + k_t * delta  # write the correction: S += k_t delta^T
        outputs.append(q[..., t : t + 1, :] @ state)  # (B, H, 1, d_v): o_t = S^T q_t
    return torch.cat(outputs, dim=-2), state  # (B, H, L, d_v), (B, H, d_k, d_v)


def _delta_chunked(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, size: int
) -> tuple[Tensor, Tensor]:
    """The chunked form of :func:`gated_delta_core` (``q``
    already scaled). Returns ``(output, final_state)``.

    Inside a chunk with state ``S_0`` at its start and cumulative log-decay
    ``c_t = g_1 + ... + g_t``, the state after token ``t`` is
    ``exp(c_t) S_0 + sum_{s<=t} exp(c_t - c_s) k_s u_s^T``, where the *new
    values* ``u_t = beta_t (v_t - (what that state held under k_t))`` solve the
    unit lower-triangular system ``(I + A) U = beta V - beta exp(c) K S_0``
    with ``A[t, s] = beta_t exp(c_t - c_s) k_t . k_s`` for ``s < t``. With a
    per-channel gate ``g`` is ``(B, H, L, d_k)``, ``c`` too, and every
    ``exp(c_t - c_s) x . y`` becomes ``sum_i exp(c_ti - c_si) x_i y_i``.
    """
    B, H, L, _ = k.shape
    pad = -L % size  # zero padding: k = 0 and beta = 0 write nothing, g = 0 decays nothing
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = F.pad(g, (0, 0, 0, pad)), F.pad(beta, (0, pad))
    n = (L + pad) // size
    q, k, v, g = (t.reshape(B, H, n, size, t.shape[-1]) for t in (q, k, v, g))  # (B, H, n, C, d)
    c = g.cumsum(-2)  # (B, H, n, C, D): log-decay since the chunk began, D = 1 or d_k
    beta = beta.reshape(B, H, n, size, 1)
    lower = causal_mask(size, device=k.device).unsqueeze(-1)  # (C, C, 1): s <= t
    decay = (c.unsqueeze(-2) - c.unsqueeze(-3)).masked_fill(~lower, -torch.inf).exp()  # (C, C, D)

    def pairs(x: Tensor, y: Tensor) -> Tensor:  # (..., C, C): sum_i exp(c_ti - c_si) x_ti y_si
        if decay.shape[-1] == 1:  # a scalar gate: a matmul
            return x @ y.transpose(-2, -1) * decay[..., 0]
        return (x.unsqueeze(-2) * y.unsqueeze(-3) * decay).sum(-1)

    system = pairs(beta * k, k)  # A below the diagonal (diagonal unused)
    solve = torch.linalg.solve_triangular
    new_v = solve(system, beta * v, upper=False, unitriangular=True)  # (B, H, n, C, d_v)
    new_k = solve(system, beta * k * c.exp(), upper=False, unitriangular=True)
    within = pairs(q, k)  # (B, H, n, C, C): reads inside the chunk
    q_decayed = q * c.exp()  # reads S_0, decayed to each t
    k_decayed = k * (c[..., -1:, :] - c).exp()  # writes, decayed to the chunk's end
    outputs = []
    for i in range(n):  # across chunks: through the state
        u = new_v[:, :, i] - new_k[:, :, i] @ state  # (B, H, C, d_v)
        outputs.append(q_decayed[:, :, i] @ state + within[:, :, i] @ u)
        end = c[:, :, i, -1].exp().unsqueeze(-1)  # (B, H, D, 1)
        state = state * end + k_decayed[:, :, i].transpose(-2, -1) @ u  # (B, H, d_k, d_v)
    out = torch.stack(outputs, dim=2).reshape(B, H, n * size, -1)[:, :, :L]
    return out, state  # (B, H, L, d_v), (B, H, d_k, d_v)
