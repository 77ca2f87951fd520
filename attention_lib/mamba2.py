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
from torch import Tensor, nn

from .gated_deltanet import LayerStateCache, RecurrentMixer
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


class Mamba2(RecurrentMixer):
    """Mamba-2's mixer: a token mixer with a fixed-size state, on :func:`ssd`.

    The layer of Mamba-2 and of the Mamba-2 hybrids (Bamba, Nemotron-H,
    Granite 4.0, Falcon-H1), 🤗 transformers' ``Mamba2Mixer``:

    .. code-block:: text

        z, xBC, dt = W_in x                      # gate, conv input, steps
        x, B, C    = SiLU(causal depthwise conv(xBC))  # a short conv, 4 taps
        dt         = clamp(softplus(dt + dt_bias), time_step_limit)
        y          = mamba2_scan(x, dt, -exp(A_log), B, C, D)
                                         # B, C shared by a group of heads
        out        = W_out( GroupRMSNorm(y * SiLU(z)) )

    Its :class:`~attention_lib.gated_deltanet.LayerStateCache` keeps the
    ``(B, H, N, P)`` state and the convolution's last inputs: its size does
    not grow with the tokens.

    Explained in chapter 18, *Attention without softmax*.

    Args:
        d_model: model width.
        num_heads: heads ``H``; ``H * head_dim`` is the inner width
            (Mamba-2: ``2 * d_model``).
        head_dim: ``P``, width of a head's input; defaults to
            ``2 * d_model // num_heads``.
        state_size: ``N``, the width of ``B`` and ``C``.
        groups: ``G``, dividing ``H``: ``B`` and ``C`` are shared by the
            ``H // G`` heads of a group, and the output norm is per group.
        conv_size: taps of the causal depthwise convolution.
        chunk_size: tokens per chunk of :func:`ssd` for several new tokens.
        bias: biases in ``W_in`` and ``W_out``.
        conv_bias: a bias in the convolution.
        time_step_limit: ``(min, max)`` clamp of ``dt``.
        eps: epsilon of the output norm.

    Shapes:
        - x: ``(B, L, d_model)``
        - output: ``(B, L, d_model)``
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        head_dim: int | None = None,
        *,
        state_size: int = 16,
        groups: int = 1,
        conv_size: int = 4,
        chunk_size: int = 64,
        bias: bool = False,
        conv_bias: bool = True,
        time_step_limit: tuple[float, float] = (0.0, float("inf")),
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.d_model, self.num_heads = d_model, check_int("num_heads", num_heads, minimum=1)
        self.head_dim = check_int("head_dim", head_dim or 2 * d_model // num_heads, minimum=1)
        self.state_size = check_int("state_size", state_size, minimum=1)
        self.groups = check_int("groups", groups, minimum=1)
        if num_heads % groups:
            raise ValueError(f"groups must divide num_heads, got {groups} and {num_heads}")
        self.chunk_size = check_int("chunk_size", chunk_size, minimum=1)
        self.time_step_limit = tuple(time_step_limit)
        self.eps = eps
        inner = num_heads * self.head_dim
        channels = inner + 2 * groups * state_size  # x, B, C
        self.W_in = nn.Linear(d_model, inner + channels + num_heads, bias=bias)
        self.conv = nn.Conv1d(channels, channels, conv_size, groups=channels, bias=conv_bias)
        self.dt_bias = nn.Parameter(torch.zeros(num_heads))
        self.A_log = nn.Parameter(torch.arange(1, num_heads + 1, dtype=torch.float32).log())
        self.D = nn.Parameter(torch.ones(num_heads))
        self.norm_weight = nn.Parameter(torch.ones(inner))
        self.W_out = nn.Linear(inner, d_model, bias=bias)

    @classmethod
    def from_hf(cls, module: nn.Module) -> Mamba2:
        """Build the layer that computes what a 🤗 transformers (5.24)
        ``Mamba2Mixer`` (or a hybrid's copy of it, Bamba's ``BambaMixer``)
        computes, with copied parameters: ``in_proj``, ``conv1d``,
        ``dt_bias``, ``A_log``, ``D``, the gated norm's weight, ``out_proj``.

        Explained in chapter 18, *Attention without softmax*.

        Raises:
            TypeError: if ``module`` is not a ``Mamba2Mixer``-like layer.
            ValueError: a convolution activation other than SiLU.
        """
        parts = ("in_proj", "conv1d", "dt_bias", "A_log", "D", "norm", "out_proj")
        if not all(hasattr(module, part) for part in parts):
            raise TypeError(f"module must be a Mamba2Mixer, got {type(module).__name__}")
        if module.activation not in ("silu", "swish"):
            raise ValueError(f"a SiLU convolution only, got activation {module.activation!r}")
        layer = cls(
            module.hidden_size,
            module.num_heads,
            module.head_dim,
            state_size=module.ssm_state_size,
            groups=module.n_groups,
            conv_size=module.conv_kernel_size,
            chunk_size=module.chunk_size,
            bias=module.in_proj.bias is not None,
            conv_bias=module.conv1d.bias is not None,
            time_step_limit=tuple(module.time_step_limit),
            eps=module.norm.variance_epsilon,
        ).to(module.out_proj.weight)
        with torch.no_grad():
            layer.W_in.load_state_dict(module.in_proj.state_dict())
            layer.conv.load_state_dict(module.conv1d.state_dict())
            layer.W_out.load_state_dict(module.out_proj.state_dict())
            for name in ("dt_bias", "A_log", "D"):
                getattr(layer, name).copy_(getattr(module, name))
            layer.norm_weight.copy_(module.norm.weight)
        return layer.train(module.training)

    def _mix(self, x: Tensor, cache: LayerStateCache | None, keep: Tensor | None) -> Tensor:
        """The computation of :meth:`forward` on checked input."""
        B, L, _ = x.shape
        H, P, N, G = self.num_heads, self.head_dim, self.state_size, self.groups
        z, xBC, dt = self.W_in(x).split([H * P, H * P + 2 * G * N, H], dim=-1)
        xBC = self._short_conv(xBC, cache)  # (B, L, H P + 2 G N)
        if keep is not None:  # the padded tokens write nothing (the conv's bias)
            xBC = xBC * keep
        u, b, c = xBC.split([H * P, G * N, G * N], dim=-1)
        dt = F.softplus(dt + self.dt_bias).clamp(*self.time_step_limit)  # (B, L, H)
        dt = dt.transpose(1, 2)  # (B, H, L)
        r = H // G  # heads per group
        b, c = (t.view(B, L, G, N).transpose(1, 2).repeat_interleave(r, 1) for t in (b, c))
        u = u.view(B, L, H, P).transpose(1, 2)  # (B, H, L, P)
        dtype = torch.promote_types(x.dtype, torch.float32)
        state = None if cache is None else cache.state
        if state is None:
            state = x.new_zeros(B, H, N, P, dtype=dtype)
        g = dt * -self.A_log.exp()[:, None]  # (B, H, L) log-decay
        size = min(L, self.chunk_size)
        y, state = _ssd_chunked(
            *(t.to(dtype) for t in (c, b, u * dt.unsqueeze(-1), g, state)), size
        )  # (B, H, L, P), (B, H, N, P)
        if cache is not None:
            cache.state, cache.position = state, cache.position + L
        y = y + self.D[:, None, None] * u  # the skip connection
        y = y.transpose(1, 2).reshape(B, L, H * P) * F.silu(z.to(dtype))  # gated
        y = y.view(B, L, G, -1)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)  # per group
        y = self.norm_weight * y.view(B, L, H * P).to(x.dtype)
        return self.W_out(y)  # (B, L, d_model)
