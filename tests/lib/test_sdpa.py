"""Tests for attention_lib.scaled_dot_product_attention (oracle: F.scaled_dot_product_attention)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_lib import causal_mask, scaled_dot_product_attention


TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available"),
    ),
]


def reference(q, k, v, keep=None, scale=None):
    """Explicit softmax reference, written without softmax() or masked_fill()."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if keep is None:
        keep = torch.ones(scores.shape, dtype=torch.bool, device=q.device)
    keep = keep.expand(scores.shape)
    row_max = torch.where(
        keep, scores, torch.full_like(scores, -1e300 if q.dtype == torch.float64 else -3e38)
    )
    row_max = row_max.amax(-1, keepdim=True)
    e = torch.exp(scores - row_max) * keep
    denom = e.sum(-1, keepdim=True)
    weights = torch.where(denom > 0, e / torch.where(denom > 0, denom, torch.ones_like(denom)), 0.0)
    return weights @ v, weights


@st.composite
def attention_case(draw):
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    lq, lk = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    d_k, d_v = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    # mask shape: full, or with some leading/query dims broadcast (size 1 or dropped)
    mask_kind = draw(st.sampled_from(["none", "full", "keys_only", "broadcast"]))
    is_causal = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    return batch, lq, lk, d_k, d_v, mask_kind, is_causal, seed


def make_inputs(batch, lq, lk, d_k, d_v, mask_kind, seed, dtype, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, lq, d_k, generator=g, dtype=dtype).to(device)
    k = torch.randn(*batch, lk, d_k, generator=g, dtype=dtype).to(device)
    v = torch.randn(*batch, lk, d_v, generator=g, dtype=dtype).to(device)
    shape = {
        "none": None,
        "full": (*batch, lq, lk),
        "keys_only": (lk,),
        "broadcast": (*(1 for _ in batch), lq, lk),
    }[mask_kind]
    mask = None if shape is None else (torch.rand(shape, generator=g) > 0.3).to(device)
    return q, k, v, mask


@settings(max_examples=60, deadline=None)
@given(case=attention_case(), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_parity_with_torch_sdpa(case, dtype) -> None:
    batch, lq, lk, d_k, d_v, mask_kind, is_causal, seed = case
    q, k, v, mask = make_inputs(batch, lq, lk, d_k, d_v, mask_kind, seed, dtype)
    out, weights = scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal)
    # torch rejects attn_mask together with is_causal for some kernels: combine by hand
    torch_mask = mask if mask is None or mask.dim() >= 2 else mask[None]  # torch needs 2-D
    if is_causal and mask is not None:
        torch_mask = torch_mask & causal_mask(lq, lk)
    expected = F.scaled_dot_product_attention(
        q, k, v, attn_mask=torch_mask, is_causal=is_causal and mask is None
    )
    assert out.shape == expected.shape == (*batch, lq, d_v)
    assert weights.shape == (*batch, lq, lk)
    torch.testing.assert_close(out, expected, atol=TOL[dtype], rtol=TOL[dtype])
    # weights equal the explicit softmax reference
    keep = torch_mask if torch_mask is not None else (causal_mask(lq, lk) if is_causal else None)
    ref_out, ref_weights = reference(q, k, v, keep)
    torch.testing.assert_close(weights, ref_weights, atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(out, ref_out, atol=TOL[dtype], rtol=TOL[dtype])


@settings(max_examples=40, deadline=None)
@given(case=attention_case())
def test_properties(case) -> None:
    batch, lq, lk, d_k, d_v, mask_kind, is_causal, seed = case
    q, k, v, mask = make_inputs(batch, lq, lk, d_k, d_v, mask_kind, seed, torch.float64)
    out, weights = scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal)
    keep = torch.ones(weights.shape, dtype=torch.bool)
    if mask is not None:
        keep = keep & mask
    if is_causal:
        keep = keep & causal_mask(lq, lk)
    assert not torch.isnan(out).any() and not torch.isnan(weights).any()
    # masked positions get exactly zero weight
    assert torch.all(weights[~keep] == 0)
    assert torch.all(weights >= 0)
    # rows sum to 1, or 0 where every key is masked
    torch.testing.assert_close(weights.sum(-1), keep.any(-1).double())
    # fully masked rows give exactly zero output
    assert torch.all(out[~keep.any(-1)] == 0)


@settings(max_examples=25, deadline=None)
@given(lq=st.integers(1, 6), lk=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_permutation_equivariance(lq: int, lk: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, lq, 4, generator=g, dtype=torch.float64)
    k = torch.randn(2, lk, 4, generator=g, dtype=torch.float64)
    v = torch.randn(2, lk, 3, generator=g, dtype=torch.float64)
    pq, pk = torch.randperm(lq, generator=g), torch.randperm(lk, generator=g)
    out, w = scaled_dot_product_attention(q, k, v)
    # permuting the queries permutes the output rows
    out_q, _ = scaled_dot_product_attention(q[:, pq], k, v)
    torch.testing.assert_close(out_q, out[:, pq])
    # permuting keys and values together leaves the output unchanged
    out_k, w_k = scaled_dot_product_attention(q, k[:, pk], v[:, pk])
    torch.testing.assert_close(out_k, out)
    torch.testing.assert_close(w_k, w[:, :, pk])
    # self-attention: permuting the tokens permutes the output
    x = q
    out_x, _ = scaled_dot_product_attention(x, x, x)
    out_px, _ = scaled_dot_product_attention(x[:, pq], x[:, pq], x[:, pq])
    torch.testing.assert_close(out_px, out_x[:, pq])


def test_numeric_masks_equal_bool_mask() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 4)
    keep = torch.rand(2, 1, 5, 6) > 0.5
    expected = scaled_dot_product_attention(q, k, v, keep)
    for numeric in (keep.float(), keep.long(), keep.to(torch.uint8), keep.double()):
        got = scaled_dot_product_attention(q, k, v, numeric)
        torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)
        torch.testing.assert_close(got[1], expected[1], rtol=0, atol=0)


def test_scale_default_and_explicit() -> None:
    torch.manual_seed(1)
    q, k, v = torch.randn(3, 5, 16), torch.randn(3, 4, 16), torch.randn(3, 4, 2)
    out_default, _ = scaled_dot_product_attention(q, k, v)
    out_explicit, _ = scaled_dot_product_attention(q, k, v, scale=0.25)
    torch.testing.assert_close(out_default, out_explicit, rtol=0, atol=0)  # 1/sqrt(16)
    out, w = scaled_dot_product_attention(q, k, v, scale=0.7)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.7))
    torch.testing.assert_close(w, reference(q, k, v, scale=0.7)[1])
    assert not torch.allclose(out, out_default)


def test_broadcasting_leading_dims() -> None:
    torch.manual_seed(2)
    q = torch.randn(2, 1, 5, 4)
    k = torch.randn(1, 3, 6, 4)
    v = torch.randn(6, 7)  # no leading dims at all
    mask = torch.rand(3, 1, 6) > 0.3  # (H, 1, Lk)
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert out.shape == (2, 3, 5, 7) and w.shape == (2, 3, 5, 6)
    qe, ke, ve = q.expand(2, 3, 5, 4), k.expand(2, 3, 6, 4), v.expand(2, 3, 6, 7)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(qe, ke, ve, attn_mask=mask))


def test_fully_masked_rows_zero_output_and_finite_gradients() -> None:
    torch.manual_seed(3)
    q = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 5, 2, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 4, 5, dtype=torch.bool)
    mask[0, 2] = False
    mask[1, :, :] = False  # a whole sequence with nothing to attend to
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(out[0, 2], torch.zeros(2, dtype=torch.float64))
    assert torch.equal(out[1], torch.zeros(4, 2, dtype=torch.float64))
    assert torch.equal(w[0, 2], torch.zeros(5, dtype=torch.float64))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    (out.sum() + w.sum()).backward()
    for t in (q, k, v):
        assert t.grad is not None and torch.isfinite(t.grad).all()
    assert torch.all(q.grad[1] == 0) and torch.all(q.grad[0, 2] == 0)


def test_dropout_only_when_positive() -> None:
    torch.manual_seed(4)
    q, k, v = torch.randn(2, 8, 4), torch.randn(2, 8, 4), torch.randn(2, 8, 3)
    state = torch.get_rng_state()
    out0, w0 = scaled_dot_product_attention(q, k, v, dropout_p=0.0)
    assert torch.equal(torch.get_rng_state(), state), "dropout_p=0 must not draw random numbers"
    torch.testing.assert_close(out0, F.scaled_dot_product_attention(q, k, v))

    torch.manual_seed(5)
    out, w = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(5)
    expected_w = F.dropout(w0, p=0.5, training=True)
    torch.testing.assert_close(w, expected_w)
    assert (w == 0).sum() > (w0 == 0).sum()  # some weights were dropped
    torch.testing.assert_close(out, w @ v)  # the returned weights are the ones used


def test_gradcheck_fp64() -> None:
    torch.manual_seed(6)
    q = torch.randn(1, 3, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 4, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 4, 2, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor(
        [[1, 0, 1, 1], [0, 0, 0, 0], [1, 1, 0, 1]], dtype=torch.bool
    )  # row 1 fully masked

    def fn(q, k, v):
        return scaled_dot_product_attention(q, k, v, mask, is_causal=True, scale=0.4)

    assert torch.autograd.gradcheck(fn, (q, k, v))
    assert torch.autograd.gradgradcheck(lambda q, k, v: fn(q, k, v)[0], (q, k, v), fast_mode=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_dtypes_and_devices(dtype: torch.dtype, device: str) -> None:
    torch.manual_seed(7)
    q64, k64, v64 = (torch.randn(2, 3, 6, 8, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(6, 6) > 0.3
    q, k, v = (t.to(device=device, dtype=dtype) for t in (q64, k64, v64))
    out, w = scaled_dot_product_attention(q, k, v, mask.to(device), is_causal=True)
    assert out.dtype == w.dtype == dtype and out.device.type == device
    ref_out, ref_w = reference(q64, k64, v64, mask & causal_mask(6))
    tol = 3e-2 if dtype == torch.bfloat16 else TOL[dtype] * 10
    torch.testing.assert_close(out.double().cpu(), ref_out, atol=tol, rtol=tol)
    torch.testing.assert_close(w.double().cpu(), ref_w, atol=tol, rtol=tol)


Q = torch.randn(2, 5, 4)
K = torch.randn(2, 6, 4)
V = torch.randn(2, 6, 3)


@pytest.mark.parametrize(
    "args,kwargs,exc,match",
    [
        (
            (Q.long(), K, V),
            {},
            TypeError,
            "query",
        ),
        (
            (Q, K.int(), V),
            {},
            TypeError,
            "key",
        ),
        ((Q, K, V.bool()), {}, TypeError, "value"),
        (([1.0], K, V), {}, TypeError, "query"),
        ((Q, K, V.double()), {}, TypeError, "dtype"),
        (
            (Q, torch.randn(2, 6, 5), V),
            {},
            ValueError,
            "d_k",
        ),
        ((Q, K, torch.randn(2, 7, 3)), {}, ValueError, "Lk"),
        (
            (Q, torch.randn(3, 6, 4), torch.randn(3, 6, 3)),
            {},
            ValueError,
            "broadcast",
        ),
        (
            (Q, K, V, torch.ones(5, 7, dtype=torch.bool)),
            {},
            ValueError,
            "broadcast",
        ),
        (
            (Q, K, V, torch.ones(3, 5, 6, dtype=torch.bool)),
            {},
            ValueError,
            "broadcast",
        ),
        (
            (Q, K, V, torch.full((5, 6), float("-inf"))),
            {},
            ValueError,
            r"0/1 values .* additive bias",
        ),
        (
            (Q, K, V, torch.full((5, 6), 2)),
            {},
            ValueError,
            "keep-mask",
        ),
        ((Q, K, V, [[True]]), {}, TypeError, "mask"),
        (
            (Q, K, V, torch.ones(5, 6, dtype=torch.complex64)),
            {},
            TypeError,
            "mask",
        ),
        (
            (Q, K, V),
            {"dropout_p": 1.0},
            ValueError,
            "dropout_p",
        ),
        (
            (Q, K, V),
            {"dropout_p": -0.1},
            ValueError,
            "dropout_p",
        ),
        (
            (Q, K, V),
            {"dropout_p": False},
            TypeError,
            "dropout_p",
        ),
        ((Q, K, V), {"dropout_p": "0.1"}, TypeError, "dropout_p"),
        ((Q, K, V), {"scale": 0.0}, ValueError, "scale"),
        (
            (Q, K, V),
            {"scale": float("inf")},
            ValueError,
            "scale",
        ),
        ((Q, K, V), {"scale": True}, TypeError, "scale"),
        (
            (Q, K, V),
            {"scale": torch.tensor(0.5)},
            TypeError,
            "scale",
        ),
        # defect 4: d_k = 0 used to raise ZeroDivisionError
        (
            (Q[..., :0], K[..., :0], V),
            {},
            ValueError,
            "d_k",
        ),
        # defect 5: a float mask that requires grad would silently get no gradient
        (
            (Q, K, V, torch.ones(5, 6, requires_grad=True)),
            {},
            ValueError,
            "requires grad",
        ),
        ((Q, K, V), {"is_causal": "yes"}, TypeError, "is_causal"),
        ((torch.randn(5), K, V), {}, ValueError, "query"),
    ],
)
def test_bad_input(args, kwargs, exc, match) -> None:
    with pytest.raises(exc, match=match):
        scaled_dot_product_attention(*args, **kwargs)


def test_mismatched_devices() -> None:
    meta = torch.randn(2, 6, 4, device="meta")
    with pytest.raises(ValueError, match="device"):
        scaled_dot_product_attention(Q, meta, V)
    with pytest.raises(
        ValueError,
        match="device",
    ):
        scaled_dot_product_attention(Q, K, V, torch.ones(5, 6, dtype=torch.bool, device="meta"))


@pytest.mark.parametrize("scale", [np.float32(0.5), np.float64(0.5), np.int64(2), 0.5, 2])
def test_scale_accepts_any_real_number(scale) -> None:
    # defect 5: np.float32(0.5) was refused while np.float64(0.5) was accepted
    out, w = scaled_dot_product_attention(Q, K, V, scale=scale)
    expected = F.scaled_dot_product_attention(Q, K, V, scale=float(scale))
    torch.testing.assert_close(out, expected)
    assert out.dtype == w.dtype == torch.float32


def test_dropout_p_accepts_numpy_floats() -> None:
    torch.manual_seed(0)
    out, _ = scaled_dot_product_attention(Q, K, V, dropout_p=np.float32(0.25))
    assert out.shape == (2, 5, 3) and out.isfinite().all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_overflow_before_scale_stays_finite(dtype) -> None:
    # defect 2: q . k = 128 * 900 = 115200 overflows float16 (max 65504) before the
    # scale 1/sqrt(128) brings it back; torch's result is finite, so ours must be too.
    q = k = v = torch.full((1, 1, 4, 128), 30.0, dtype=dtype)
    out, w = scaled_dot_product_attention(q, k, v)
    expected = F.scaled_dot_product_attention(q, k, v)
    assert expected.isfinite().all()
    assert out.isfinite().all() and w.isfinite().all()
    assert out.dtype == w.dtype == dtype
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(w, torch.full_like(w, 0.25))


def test_half_precision_matches_float32_rounded_once() -> None:
    torch.manual_seed(8)
    q, k, v = (torch.randn(2, 3, 5, 16) * 4 for _ in range(3))
    mask = torch.rand(5, 5) > 0.3
    out32, w32 = scaled_dot_product_attention(q, k, v, mask, is_causal=True)
    out16, w16 = scaled_dot_product_attention(q.half(), k.half(), v.half(), mask, is_causal=True)
    ref_out, ref_w = scaled_dot_product_attention(
        q.half().float(), k.half().float(), v.half().float(), mask, is_causal=True
    )
    assert torch.equal(out16, ref_out.half()) and torch.equal(w16, ref_w.half())
    torch.testing.assert_close(out16.float(), out32, atol=2e-2, rtol=2e-2)
