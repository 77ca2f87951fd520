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

from torch import Tensor

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
