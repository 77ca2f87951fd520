"""Kimi Delta Attention (KDA): the gated delta rule with a per-channel gate.

Gated DeltaNet (:func:`~attention_lib.linear_attention.gated_delta_rule`)
multiplies the whole ``(d_k, d_v)`` state of a head by one number
``exp(g_t)`` per token. Kimi Linear's KDA (Kimi Team, 2025) gives every key
channel its own forgetting rate: the decay is the diagonal matrix
``diag(exp(g_t))``, ``g_t`` a ``d_k``-vector, applied to the rows of the
state before the delta-rule write:

.. code-block:: text

    S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T
    o_t = S_t^T (scale * q_t)

Some channels can then keep a memory for thousands of tokens while others
forget within a few, in the same head. With every channel of ``g_t`` equal
it is the scalar-gated rule again. The computation is the library's one
delta-rule core (:func:`~attention_lib.linear_attention.gated_delta_core`,
recurrent or chunked), whose gate may be scalar or per channel.

Explained in chapter 18, *Attention without softmax*.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .gated_deltanet import GatedDeltaNet
from .linear_attention import check_delta_args, gated_delta_core


def kimi_delta_attention(
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
    """Kimi Delta Attention: the delta rule with a per-channel (diagonal) decay.

    Per head, with a ``(d_k, d_v)`` state ``S`` (zero, or ``initial_state``),
    ``S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T``
    and ``o_t = S_t^T (scale * q_t)``. ``chunk_size=None`` updates the state
    one token at a time; ``chunk_size=C`` folds the ``C`` updates of a chunk
    into one triangular solve. Both give the same numbers up to rounding.

    Conventions, against 🤗 transformers' ``recurrent_kimi_delta_attention``
    and ``chunk_kimi_delta_attention`` (Kimi Linear): our tensors are
    ``(B, H, L, d)`` (theirs ``(B, L, H, d)``), ``g`` is the same log-decay
    (``KimiLinearForgetGate``'s output), the query is scaled by
    ``1/sqrt(d_k)`` unless ``scale`` says otherwise, and L2 normalisation of
    queries and keys is left to the caller (their
    ``use_qk_l2norm_in_kernel=True``). Dtypes as
    :func:`~attention_lib.linear_attention.gated_delta_rule`: computed in the
    widest input dtype, at least float32.

    Explained in chapter 18, *Attention without softmax*.

    Args:
        query: ``(B, H, L, d_k)``.
        key: ``(B, H, L, d_k)``, ideally of unit norm.
        value: ``(B, H, L, d_v)``.
        g: ``(B, H, L, d_k)`` log-decay per key channel, ``<= 0``.
        beta: ``(B, H, L)`` write strength, usually in ``(0, 1)``.
        scale: multiplies the query; ``None`` means ``1 / sqrt(d_k)``.
        chunk_size: ``None`` for the recurrent form, else tokens per chunk.
        initial_state: ``(B, H, d_k, d_v)`` state before the first token, or
            ``None`` for zeros.
        output_final_state: also return the state after the last token.

    Returns:
        ``output`` ``(B, H, L, d_v)`` in ``query``'s dtype, or ``(output,
        state)`` with ``state`` ``(B, H, d_k, d_v)`` in the computing dtype.

    Raises:
        TypeError: if an argument is not a floating tensor or has the wrong type.
        ValueError: on mismatched shapes or devices, ``g > 0`` anywhere, or
            ``chunk_size < 1``.
    """
    args = (query, key, value, g, beta, initial_state, scale, chunk_size, output_final_state)
    chunk_size = check_delta_args(*args, per_channel=True)
    out, state = gated_delta_core(
        query, key, value, g, beta, initial_state, scale=scale, chunk_size=chunk_size
    )
    return (out, state) if output_final_state else out


class KimiDeltaAttention(GatedDeltaNet):
    """Kimi Linear's KDA layer: a :class:`~attention_lib.gated_deltanet.GatedDeltaNet`
    whose decay is per key channel.

    Three parts differ from Qwen3-Next's layer, the rest (projections, short
    convolution, unit queries and keys, ``beta``, the per-head RMSNorm, the
    fixed-size :class:`~attention_lib.gated_deltanet.LayerStateCache`) is the
    same module:

    .. code-block:: text

        g   = -exp(A_log[h]) * softplus(W_a2 W_a1 x + dt_bias)
                                          # (B, H, L, d_k): per channel
        o   = kimi_delta_attention(q, k, v, g, beta)
        out = W_o( RMSNorm(o) * sigmoid(W_z2 W_z1 x) )  # a low-rank gate

    The decay's and the output gate's projections are low rank (through one
    head's width), as in 🤗 transformers' ``KimiLinearDeltaAttention``, which
    :meth:`from_hf` copies.

    Explained in chapter 18, *Attention without softmax*.

    Args:
        d_model: model width.
        num_heads: heads ``H`` (queries, keys and values alike).
        head_dim: width of a head; defaults to ``d_model // num_heads``.
        conv_size: taps of the causal depthwise convolution (Kimi Linear: 4).
        chunk_size: tokens per chunk of the chunked form (several new tokens).
        eps: epsilon of the output RMSNorm.

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
        conv_size: int | None = 4,
        chunk_size: int = 64,
        eps: float = 1e-6,
    ) -> None:
        super().__init__(
            d_model, num_heads, head_dim, conv_size=conv_size, chunk_size=chunk_size, eps=eps
        )
        d, width = self.head_dim, num_heads * self.head_dim
        self.W_a, self.W_z = (  # low rank, through one head's width
            nn.Sequential(nn.Linear(d_model, d, bias=False), nn.Linear(d, width, bias=False))
            for _ in range(2)
        )
        self.dt_bias = nn.Parameter(torch.ones(width))  # one per key channel
        self.A_log = nn.Parameter(torch.empty(num_heads).uniform_(1, 16).log())  # per head

    @classmethod
    def from_hf(cls, module: nn.Module) -> KimiDeltaAttention:
        """Build the layer that computes what a 🤗 transformers (5.24)
        ``KimiLinearDeltaAttention`` computes, with copied parameters.

        ``q_proj``, ``k_proj``, ``v_proj``, ``b_proj``, ``conv1d`` (with the
        config's activation, which must be SiLU), the forget gate's
        ``f_a_proj``/``f_b_proj``/``dt_bias``/``A_log``, the output gate's
        ``g_a_proj``/``g_b_proj``, ``o_norm`` and ``o_proj`` are copied.

        Explained in chapter 18, *Attention without softmax*.

        Raises:
            TypeError: if ``module`` is not a ``KimiLinearDeltaAttention``-like layer.
            ValueError: a convolution activation other than SiLU, or a bias.
        """
        parts = ("q_proj", "k_proj", "v_proj", "b_proj", "conv1d", "forget_gate", "g_a_proj")
        if not all(hasattr(module, part) for part in parts):
            raise TypeError(
                f"module must be a KimiLinearDeltaAttention, got {type(module).__name__}"
            )
        if module.activation not in ("silu", "swish") or module.conv1d.bias is not None:
            raise ValueError(f"a SiLU convolution without bias only, got {module.activation!r}")
        gate = module.forget_gate
        layer = cls(
            module.hidden_size,
            module.num_heads,
            module.head_dim,
            conv_size=module.conv_kernel_size,
            eps=module.o_norm.variance_epsilon,
        ).to(module.o_proj.weight)
        pairs = {
            layer.W_q: module.q_proj, layer.W_k: module.k_proj, layer.W_v: module.v_proj,
            layer.W_b: module.b_proj, layer.conv: module.conv1d, layer.W_a[0]: gate.f_a_proj,
            layer.W_a[1]: gate.f_b_proj, layer.W_z[0]: module.g_a_proj,
            layer.W_z[1]: module.g_b_proj, layer.norm: module.o_norm, layer.W_o: module.o_proj,
        }  # fmt: skip
        with torch.no_grad():
            for mine, theirs in pairs.items():
                mine.weight.copy_(theirs.weight)
            layer.dt_bias.copy_(gate.dt_bias)
            layer.A_log.copy_(gate.A_log.reshape(-1))
        return layer.train(module.training)

    def _log_decay(self, x: Tensor) -> Tensor:
        """``-exp(A_log[h]) softplus(W_a x + dt_bias)``: ``(B, H, L, d_k)``."""
        B, L, _ = x.shape
        g = F.softplus(self.W_a(x) + self.dt_bias).view(B, L, self.num_heads, -1)
        return (-self.A_log.exp()[:, None] * g).transpose(1, 2)  # (B, H, L, d_k)

    def _gate(self, z: Tensor) -> Tensor:
        """The output gate's activation: a sigmoid (Kimi Linear)."""
        return z.sigmoid()
