"""Tests for attention_lib.rope (oracle: 🤗 transformers' Llama RoPE)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download: tiny configs only

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from attention_lib import (
    apply_rope,
    rope_frequencies,
    rope_permutation,
    sinusoidal_positional_encoding,
)


def hf_rope(q, k, position_ids, base):
    """🤗's rotation of q and k (B, H, L, d) at position_ids (B, L)."""
    d_head = q.shape[-1]
    config = LlamaConfig(
        hidden_size=2 * d_head,
        num_attention_heads=2,
        head_dim=d_head,
        rope_parameters={"rope_type": "default", "rope_theta": base},
    )
    cos, sin = LlamaRotaryEmbedding(config)(q, position_ids)  # (B, L, d) each
    return apply_rotary_pos_emb(q, k, cos, sin)


@pytest.mark.parametrize("base", [10000.0, 500000.0])
@pytest.mark.parametrize("d_head", [2, 8, 64])
def test_matches_transformers(base, d_head):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 40, d_head, generator=g)  # (B, H, L, d)
    k = torch.randn(2, 3, 40, d_head, generator=g)
    positions = torch.arange(40)
    hf_q, hf_k = hf_rope(q, k, positions.expand(2, 40), base)
    torch.testing.assert_close(apply_rope(q, base=base), hf_q, atol=1e-5, rtol=0)
    torch.testing.assert_close(apply_rope(k, positions, base=base), hf_k, atol=1e-5, rtol=0)


def test_matches_transformers_with_per_sequence_offsets():
    """A batch whose sequences start at different positions (B, 1, L)."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 2, 5, 16, generator=g)
    position_ids = torch.tensor([[0], [7], [30]]) + torch.arange(5)  # (B, L)
    hf_q, _ = hf_rope(q, q, position_ids, 10000.0)
    torch.testing.assert_close(apply_rope(q, position_ids[:, None]), hf_q, atol=1e-5, rtol=0)


def test_float64_is_exact_to_float64_precision():
    """The angles are float64, so a float64 input gets float64-accurate rotations."""
    x = torch.randn(1, 100, 32, dtype=torch.float64)
    out = apply_rope(x)
    omega = 10000.0 ** (-torch.arange(0, 32, 2, dtype=torch.float64) / 32)
    angle = torch.arange(100, dtype=torch.float64)[:, None] * omega  # (L, d/2)
    x1, x2 = x[..., :16], x[..., 16:]
    expected = torch.cat(
        [x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()], -1
    )
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
    omega_lib, factor = rope_frequencies(32)
    torch.testing.assert_close(omega_lib, omega, atol=1e-15, rtol=0)
    assert factor == 1.0


@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(0, 2000),
    n=st.integers(0, 2000),
    shift=st.integers(-500, 500),
    interleaved=st.booleans(),
)
def test_scores_depend_only_on_relative_position(m, n, shift, interleaved):
    g = torch.Generator().manual_seed(m * 7919 + n)
    q, k = torch.randn(2, 32, generator=g, dtype=torch.float64)

    def score(pm, pn):
        rq = apply_rope(q[None], torch.tensor([pm]), interleaved=interleaved)[0]
        rk = apply_rope(k[None], torch.tensor([pn]), interleaved=interleaved)[0]
        return float(rq @ rk)

    assert score(m, n) == pytest.approx(score(m + shift, n + shift), abs=1e-9)


@pytest.mark.parametrize("interleaved", [False, True])
def test_norms_are_preserved_and_position_zero_is_identity(interleaved):
    x = torch.randn(4, 50, 16)
    out = apply_rope(x, interleaved=interleaved)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(out[:, 0], x[:, 0])
    assert not torch.allclose(out[:, 1:], x[:, 1:])


def test_interleaved_is_rotate_half_up_to_a_permutation():
    x = torch.randn(2, 3, 20, 12)
    perm = rope_permutation(12)
    assert perm.tolist() == [0, 6, 1, 7, 2, 8, 3, 9, 4, 10, 5, 11]
    torch.testing.assert_close(apply_rope(x[..., perm], interleaved=True), apply_rope(x)[..., perm])
    # and the two layouts are really different functions of the same vector
    assert not torch.allclose(apply_rope(x, interleaved=True), apply_rope(x))


def test_clock_hands_of_chapter_7():
    """Rotating the vector (1, 0, 1, 0, ...) (interleaved) traces chapter 7's
    sinusoidal encoding, each (sin, cos) pair listed as (cos, sin)."""
    d = 16
    unit = torch.tensor([1.0, 0.0]).repeat(d // 2)  # (d,)
    hands = apply_rope(unit.expand(64, d), interleaved=True)  # (L, d)
    swap = torch.arange(d).view(-1, 2).flip(-1).flatten()  # [1, 0, 3, 2, ...]
    torch.testing.assert_close(
        hands, sinusoidal_positional_encoding(64, d)[:, swap], atol=1e-6, rtol=0
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtypes_are_kept(dtype):
    x = torch.randn(3, 10, 8, dtype=dtype)
    out = apply_rope(x, torch.arange(100, 110))
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.isfinite(out).all()
    ref = apply_rope(x.double(), torch.arange(100, 110))
    torch.testing.assert_close(out.double(), ref, atol=0.05, rtol=0.02)


def test_gradient_flows():
    x = torch.randn(2, 5, 8, requires_grad=True)
    apply_rope(x).pow(2).sum().backward()
    # a rotation is orthogonal: d|R x|^2 / dx = 2 x
    torch.testing.assert_close(x.grad, 2 * x.detach())


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: apply_rope([1.0, 2.0]), TypeError, "x must"),
        (lambda: apply_rope(torch.ones(3, 4, dtype=torch.long)), TypeError, "x must"),
        (lambda: apply_rope(torch.ones(4)), ValueError, "x must"),
        (lambda: apply_rope(torch.ones(3, 5)), ValueError, "d_head"),
        (lambda: apply_rope(torch.ones(3, 4), torch.ones(3)), TypeError, "positions"),
        (lambda: apply_rope(torch.ones(3, 4), [0, 1, 2]), TypeError, "positions"),
        (lambda: apply_rope(torch.ones(3, 4), torch.arange(4)), ValueError, "positions"),
        (
            lambda: apply_rope(torch.ones(2, 3, 4), torch.arange(3)[None, None]),
            ValueError,
            "positions",
        ),
        (lambda: apply_rope(torch.ones(3, 4), base=1.0), ValueError, "base"),
        (lambda: apply_rope(torch.ones(3, 4), base="10000"), TypeError, "base"),
        (lambda: apply_rope(torch.ones(3, 4), base=True), TypeError, "base"),
        (lambda: apply_rope(torch.ones(3, 4), interleaved=1), TypeError, "interleaved"),
        (lambda: rope_frequencies(7), ValueError, "d_head"),
        (lambda: rope_frequencies(8.0), TypeError, "d_head"),
        (lambda: rope_permutation(0), ValueError, "d_head"),
    ],
)
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_empty_sequence():
    assert apply_rope(torch.ones(2, 0, 4)).shape == (2, 0, 4)
