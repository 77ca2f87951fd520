"""Kimi Delta Attention (chapter 18) against 🤗 transformers 5.24's Kimi Linear.

Oracle: ``recurrent_kimi_delta_attention`` and ``chunk_kimi_delta_attention``
(the torch paths of ``KimiLinearDeltaAttention``), called as the layer calls
them (``(B, L, H, d)`` tensors, ``use_qk_l2norm_in_kernel=True``, ``g`` from a
random ``KimiLinearForgetGate``), on copies of our tensors. They compute in
float32, so they are matched within 2e-5; our own forms are matched to each
other and to the scalar-gated rule in float64 within 1e-10.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download

import pytest
import torch
from transformers import KimiLinearConfig
from transformers.models.kimi_linear import modeling_kimi_linear as kimi

from attention_lib.kda import kimi_delta_attention
from attention_lib.linear_attention import gated_delta_rule

D_MODEL = 32


def close(a: torch.Tensor, b: torch.Tensor, tol: float) -> None:
    torch.testing.assert_close(a, b, atol=tol, rtol=tol, check_dtype=False)


def inputs(B: int, H: int, L: int, d_k: int, d_v: int, seed: int = 0):
    """Kimi Linear's inputs in our layout (B, H, L, d), float64: L2-normalised
    queries and keys, ``g`` from a random ``KimiLinearForgetGate``, a sigmoid
    ``beta`` and a random initial state."""
    torch.manual_seed(seed)
    cfg = KimiLinearConfig(
        hidden_size=D_MODEL, linear_num_heads=H, linear_head_dim=d_k,
        num_hidden_layers=2, vocab_size=16, num_attention_heads=2,
        num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    gate = kimi.KimiLinearForgetGate(cfg).double()
    with torch.no_grad():
        for p in gate.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
        g = gate(torch.randn(B, L, D_MODEL, dtype=torch.float64)).transpose(1, 2)
    q, k = (kimi.l2norm(torch.randn(B, H, L, d_k, dtype=torch.float64)) for _ in range(2))
    v = torch.randn(B, H, L, d_v, dtype=torch.float64)
    beta = torch.rand(B, H, L, dtype=torch.float64)
    state = torch.randn(B, H, d_k, d_v, dtype=torch.float64)
    return q, k, v, g, beta, state


SHAPES = [(1, 1, 1, 4, 4), (2, 2, 7, 8, 8), (1, 3, 37, 8, 16), (2, 2, 70, 16, 8)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_kda_equals_transformers_kimi_linear(shape) -> None:
    q, k, v, g, beta, state = inputs(*shape)
    theirs = [t.transpose(1, 2).float().clone() for t in (q, k, v, g, beta)]  # (B, L, H, ...)
    with torch.no_grad():
        rec, rec_state = kimi.recurrent_kimi_delta_attention(
            *theirs, initial_state=state.float().clone(), output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        chunk, chunk_state = kimi.chunk_kimi_delta_attention(
            *theirs, chunk_size=16, initial_state=state.float().clone(),
            output_final_state=True, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
    qn, kn = (kimi.l2norm(t) for t in (q, k))  # what their kernel does to q and k
    for chunk_size in (None, 16):
        out, final = kimi_delta_attention(
            qn, kn, v, g, beta, chunk_size=chunk_size, initial_state=state,
            output_final_state=True,
        )  # fmt: skip
        for want, want_state in ((rec, rec_state), (chunk, chunk_state)):
            close(out, want.transpose(1, 2), 2e-5)
            close(final, want_state, 2e-5)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("chunk_size", [1, 4, 16, 64])
def test_chunked_equals_recurrent_in_float64(shape, chunk_size) -> None:
    q, k, v, g, beta, state = inputs(*shape, seed=1)
    want = kimi_delta_attention(q, k, v, g, beta, initial_state=state, output_final_state=True)
    got = kimi_delta_attention(
        q, k, v, g, beta, chunk_size=chunk_size, initial_state=state, output_final_state=True
    )
    for a, b in zip(got, want):
        close(a, b, 1e-10)


@pytest.mark.parametrize("chunk_size", [None, 8])
def test_one_gate_per_head_is_gated_delta_rule(chunk_size) -> None:
    q, k, v, g, beta, state = inputs(2, 3, 21, 8, 8, seed=2)
    scalar = g[..., 0]  # (B, H, L): one gate value per head and token
    got = kimi_delta_attention(
        q, k, v, scalar.unsqueeze(-1).expand_as(g), beta, chunk_size=chunk_size,
        initial_state=state, output_final_state=True,
    )  # fmt: skip
    want = gated_delta_rule(
        q, k, v, scalar, beta, chunk_size=chunk_size, initial_state=state,
        output_final_state=True,
    )  # fmt: skip
    for a, b in zip(got, want):
        close(a, b, 1e-10)
    other = kimi_delta_attention(q, k, v, g, beta, chunk_size=chunk_size)
    assert (other - got[0]).abs().max() > 1e-3  # the per-channel gate matters


def test_half_precision_computes_in_float32() -> None:
    q, k, v, g, beta, _ = inputs(1, 2, 19, 8, 8, seed=3)
    want = kimi_delta_attention(q, k, v, g, beta, chunk_size=8)
    got = kimi_delta_attention(*(t.bfloat16() for t in (q, k, v)), g, beta, chunk_size=8)
    assert got.dtype == torch.bfloat16
    close(got, want, 2e-2)


def test_refuses_bad_input() -> None:
    q, k, v, g, beta, _ = inputs(1, 2, 5, 4, 4)
    with pytest.raises(ValueError, match=r"\(B, H, L, d_k\)"):
        kimi_delta_attention(q, k, v, g[..., 0], beta)  # a scalar gate
    with pytest.raises(ValueError, match="log-decay"):
        kimi_delta_attention(q, k, v, -g, beta)
    with pytest.raises(TypeError, match="beta"):
        kimi_delta_attention(q, k, v, g, beta.long())
    with pytest.raises(ValueError, match="chunk_size"):
        kimi_delta_attention(q, k, v, g, beta, chunk_size=0)


# --- the layer: KimiDeltaAttention.from_hf against KimiLinearDeltaAttention ---------------


def kimi_layer(heads: int = 4, head_dim: int = 8):
    """A random ``KimiLinearDeltaAttention`` (layer 0) and its config."""
    cfg = KimiLinearConfig(
        hidden_size=D_MODEL, num_hidden_layers=2, vocab_size=16,
        linear_attn_config={"head_dim": head_dim, "num_heads": heads},
        layer_types=["linear_attention", "full_attention"], num_attention_heads=2,
        num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    layer = kimi.KimiLinearDeltaAttention(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for p in layer.parameters():  # random, not the init's ones/zeros
            p.copy_(torch.randn_like(p) * 0.3)
        layer.forget_gate.A_log.uniform_(0, 2.7)  # exp(A_log) in [1, 15], the init's range
    return cfg, layer


@pytest.mark.parametrize("length", [1, 5, 70])  # one token, < and > a 64-token chunk
def test_kda_layer_from_hf_equals_kimi_linear_prefill_and_decode(length) -> None:
    """Called as ``KimiLinearDecoderLayer`` calls it, with the model's own
    cache (convolution and recurrent state) for a prefill then 6 tokens."""
    from transformers import DynamicCache

    from attention_lib.gated_deltanet import LayerStateCache
    from attention_lib.kda import KimiDeltaAttention

    torch.manual_seed(length)
    cfg, theirs = kimi_layer()
    ours = KimiDeltaAttention.from_hf(theirs)
    x = torch.randn(2, length + 6, D_MODEL)
    steps = [slice(0, length)] + [slice(t, t + 1) for t in range(length, length + 6)]
    mine, their_cache = LayerStateCache(), DynamicCache(config=cfg)
    with torch.no_grad():
        got = torch.cat([ours(x[:, s], kv_cache=mine) for s in steps], dim=1)
        expected = torch.cat(
            [theirs(hidden_states=x[:, s], cache=their_cache, attention_mask=None) for s in steps],
            dim=1,
        )
        whole = ours(x)
    assert expected.abs().mean() > 0.05  # a real signal
    close(got, expected, 1e-5)
    close(whole, expected, 1e-5)  # prefill + decode == one pass
    assert mine.nbytes == 2 * 4 * 8 * 8 * 4 + 2 * 96 * 3 * 4  # state + the conv's last 3 inputs


def test_kda_layer_per_channel_decay_matters() -> None:
    """One decay per head (each head's channels averaged) changes the output:
    the per-channel gate is what makes the layer equal."""
    from attention_lib.kda import KimiDeltaAttention

    torch.manual_seed(1)
    ours = KimiDeltaAttention.from_hf(kimi_layer()[1])
    x = torch.randn(1, 20, D_MODEL)
    g = ours._log_decay(x)  # (B, H, L, d_k)
    assert g.shape == (1, 4, 20, 8) and bool((g < 0).all())
    scalar = g.mean(-1, keepdim=True).expand_as(g)
    with torch.no_grad():
        per_channel = ours(x)
        ours._log_decay = lambda x: scalar  # this instance only
        assert (ours(x) - per_channel).abs().max() > 1e-3
    with pytest.raises(TypeError, match="KimiLinearDeltaAttention"):
        KimiDeltaAttention.from_hf(torch.nn.Linear(2, 2))
