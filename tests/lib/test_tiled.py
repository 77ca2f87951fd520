"""Tests for attention_lib.tiled: online softmax, tiled_attention and the "tiled" backend.

Oracles: ``torch.softmax``, ``F.scaled_dot_product_attention`` and this package's
``scaled_dot_product_attention``. Speed and memory targets are measured in
``benchmarks/bench_tiled.py``, not here.
"""

from __future__ import annotations

import collections
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode

from attention_lib import (
    MultiHeadAttention,
    OnlineSoftmaxState,
    TokenClassifier,
    available_backends,
    make_task_data,
    online_softmax,
    online_softmax_update,
    scaled_dot_product_attention,
    tiled_attention,
    train_token_classifier,
)
from attention_lib.backends import BACKENDS, tiled_backend
from attention_lib.tiled import DEFAULT_BLOCK_SIZE, block_backward

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def qkv(batch, lq, lk, d_k, d_v, dtype=torch.float32, seed=0, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, lq, d_k, generator=gen, dtype=dtype)
    k = torch.randn(*batch, lk, d_k, generator=gen, dtype=dtype)
    v = torch.randn(*batch, lk, d_v, generator=gen, dtype=dtype)
    return tuple(t.requires_grad_(requires_grad) for t in (q, k, v))


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item() if a.numel() else 0.0


# --------------------------------------------------------------------------- online softmax


@pytest.mark.parametrize("block_size", [1, 2, 3, 7, 100])
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_online_softmax_equals_torch_softmax(block_size, dim) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 9, 5, dtype=torch.float64) * 10  # large spread: the max moves often
    torch.testing.assert_close(
        online_softmax(x, dim, block_size=block_size), torch.softmax(x, dim), atol=1e-12, rtol=0
    )


def test_online_softmax_extreme_values_and_inf() -> None:
    x = torch.tensor([[1000.0, -1000.0, 999.0, 0.0], [-5.0, float("-inf"), 3.0, float("-inf")]])
    torch.testing.assert_close(online_softmax(x, block_size=1), torch.softmax(x, -1))
    assert torch.isfinite(online_softmax(x, block_size=1)).all()
    # A row that is -inf everywhere: torch.softmax gives NaN, and so does online_softmax.
    row = torch.full((1, 4), float("-inf"))
    assert torch.isnan(torch.softmax(row, -1)).all() and torch.isnan(online_softmax(row)).all()


@pytest.mark.parametrize(
    "args,kwargs,exc,match",
    [
        (([1.0, 2.0],), {}, TypeError, "x must"),
        (
            (torch.arange(3),),
            {},
            TypeError,
            "x must",
        ),
        ((torch.tensor(1.0),), {}, ValueError, "x must"),
        ((torch.randn(2, 3), 2), {}, ValueError, "dim"),
        (
            (torch.randn(2, 3),),
            {"block_size": 0},
            ValueError,
            "block_size",
        ),
        (
            (torch.randn(2, 3),),
            {"block_size": 2.0},
            TypeError,
            "block_size",
        ),
    ],
)
def test_online_softmax_bad_input(args, kwargs, exc, match) -> None:
    with pytest.raises(exc, match=match):
        online_softmax(*args, **kwargs)


@pytest.mark.parametrize("inplace", [False, True])
def test_online_softmax_update_by_hand(inplace) -> None:
    """Folding key blocks one at a time gives softmax(scores) @ value."""
    torch.manual_seed(1)
    scores = torch.randn(3, 6, 10, dtype=torch.float64) * 5
    value = torch.randn(3, 10, 4, dtype=torch.float64)
    state = OnlineSoftmaxState.empty((3,), 6, 4, dtype=torch.float64)
    assert state.row_max.shape == (3, 6, 1) and torch.isinf(state.row_max).all()
    assert state.row_sum.shape == (3, 6, 1) and state.acc.shape == (3, 6, 4)
    for start in range(0, 10, 4):  # blocks of 4, 4, 2 keys
        block = scores[..., start : start + 4].clone()
        state = online_softmax_update(state, block, value[:, start : start + 4], inplace=inplace)
    expected = torch.softmax(scores, -1) @ value
    torch.testing.assert_close(state.output(), expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(state.row_max, scores.amax(-1, keepdim=True))
    torch.testing.assert_close(
        state.row_sum, torch.exp(scores - scores.amax(-1, keepdim=True)).sum(-1, keepdim=True)
    )


def test_online_softmax_update_unseen_rows_stay_zero() -> None:
    """A row whose scores are all -inf so far: no NaN in the state, zero output."""
    scores = torch.tensor([[[float("-inf"), float("-inf")], [0.5, float("-inf")]]])  # (1, 2, 2)
    value = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])
    state = online_softmax_update(
        OnlineSoftmaxState.empty((1,), 2, 2, dtype=torch.float32), scores, value
    )
    assert not torch.isnan(state.row_sum).any() and not torch.isnan(state.acc).any()
    torch.testing.assert_close(state.output(), torch.tensor([[[0.0, 0.0], [1.0, 2.0]]]))


def test_online_softmax_update_bad_input() -> None:
    state = OnlineSoftmaxState.empty((2,), 3, 4, dtype=torch.float32)
    scores, value = torch.randn(2, 3, 5), torch.randn(2, 5, 4)
    with pytest.raises(TypeError, match="state"):
        online_softmax_update(tuple(state), scores, value)
    with pytest.raises(TypeError, match="scores"):
        online_softmax_update(state, scores.long(), value)
    with pytest.raises(ValueError, match="scores"):
        online_softmax_update(state, torch.randn(2, 3, 6), value)
    with pytest.raises(ValueError, match="value"):
        online_softmax_update(state, scores, torch.randn(2, 5, 7))
    with pytest.raises(ValueError, match="dropout_p"):
        online_softmax_update(state, scores, value, dropout_p=2)


# --------------------------------------------------------------------------- tiled attention


@st.composite
def tiled_case(draw):
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    lq, lk = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    d_k, d_v = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    block = draw(
        st.one_of(
            st.integers(1, 48),
            st.tuples(st.integers(1, 48), st.integers(1, 48)),
        )
    )
    return batch, lq, lk, d_k, d_v, block, draw(st.booleans()), draw(st.integers(0, 2**16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@settings(max_examples=60, deadline=None)
@given(case=tiled_case())
def test_parity_with_torch_sdpa_random_shapes(case, dtype) -> None:
    batch, lq, lk, d_k, d_v, block, is_causal, seed = case
    q, k, v = qkv(batch, lq, lk, d_k, d_v, dtype, seed)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    out = tiled_attention(q, k, v, is_causal=is_causal, block_size=block)
    assert out.shape == expected.shape and out.dtype == dtype
    assert max_err(out, expected) <= TOL[dtype], (case, max_err(out, expected))


LENGTHS = [(1, 1), (97, 97), (97, 31), (31, 97), (128, 128), (130, 257)]
BLOCKS = [16, (32, 8), (8, 64), 1000, DEFAULT_BLOCK_SIZE]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize(
    "lq,lk,block_size",
    [(lq, lk, b) for lq, lk in LENGTHS for b in BLOCKS] + [(1, 1, 1), (13, 7, 1), (7, 13, 1)],
)
def test_parity_odd_lengths_and_block_sizes(dtype, is_causal, lq, lk, block_size) -> None:
    q, k, v = qkv((2, 3), lq, lk, 16, 8, dtype, seed=lq * 1000 + lk)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    out = tiled_attention(q, k, v, is_causal=is_causal, block_size=block_size)
    assert max_err(out, expected) <= TOL[dtype]


def test_scale_is_used() -> None:
    q, k, v = qkv((2,), 9, 11, 4, 3, torch.float64)
    for scale in (0.05, 1.0, 3.0):
        torch.testing.assert_close(
            tiled_attention(q, k, v, scale=scale, block_size=4),
            F.scaled_dot_product_attention(q, k, v, scale=scale),
            atol=1e-10,
            rtol=0,
        )
    # default = 1 / sqrt(d_k)
    torch.testing.assert_close(
        tiled_attention(q, k, v, block_size=4), tiled_attention(q, k, v, scale=0.5, block_size=4)
    )


@pytest.mark.parametrize(
    "q_batch,k_batch,v_batch",
    [((2, 3), (1, 3), (3,)), ((), (), ()), ((4,), (), (4,)), ((2, 1, 3), (1, 2, 1), (2, 2, 3))],
)
def test_leading_dims_broadcast_like_sdpa(q_batch, k_batch, v_batch) -> None:
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(*q_batch, 7, 5, generator=gen, dtype=torch.float64)
    k = torch.randn(*k_batch, 9, 5, generator=gen, dtype=torch.float64)
    v = torch.randn(*v_batch, 9, 2, generator=gen, dtype=torch.float64)
    for is_causal in (False, True):
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        out = tiled_attention(q, k, v, is_causal=is_causal, block_size=(3, 4))
        assert out.shape == expected.shape
        assert max_err(out, expected) <= 1e-10


def test_non_contiguous_inputs() -> None:
    q, k, v = qkv((2, 9), 3, 3, 4, 4, torch.float64)  # (2, 9, 3, 4): L in dim 1
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (2, 3, 9, 4), non-contiguous
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert max_err(tiled_attention(q, k, v, is_causal=True, block_size=4), expected) <= 1e-10


def test_empty_lengths_follow_torch() -> None:
    q, k, v = qkv((2, 3), 5, 0, 4, 6)
    for is_causal in (False, True):
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        out = tiled_attention(q, k, v, is_causal=is_causal, block_size=2)
        assert out.shape == expected.shape == (2, 3, 5, 6)
        torch.testing.assert_close(out, expected)  # zeros, as torch: no key -> zero output
    q, k, v = qkv((2, 3), 0, 5, 4, 6)
    assert tiled_attention(q, k, v, is_causal=True).shape == (2, 3, 0, 6)


@pytest.mark.parametrize("lq,lk", [(12, 5), (5, 12), (8, 8)])
def test_causal_alignment_top_left(lq, lk) -> None:
    """Query i sees keys j <= i, as torch.ones(Lq, Lk).tril(): the same as an explicit mask."""
    q, k, v = qkv((2,), lq, lk, 4, 3, torch.float64, seed=5)
    explicit = torch.ones(lq, lk, dtype=torch.bool).tril()
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=explicit)
    out = tiled_attention(q, k, v, is_causal=True, block_size=(4, 3))
    assert max_err(out, expected) <= 1e-10
    assert torch.isfinite(out).all()  # every query sees key 0: no empty causal row


class _RecordOps(TorchFunctionMode):
    """Records the shape of every tensor a torch function returns, and the bmm calls."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []
        self.bmm_calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.bmm:
            self.bmm_calls += 1
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


@pytest.mark.parametrize("is_causal", [False, True])
def test_never_materializes_the_score_matrix(is_causal) -> None:
    lq, lk, block = 64, 80, (16, 8)
    q, k, v = qkv((2, 3), lq, lk, 4, 4)
    with _RecordOps() as rec:
        tiled_attention(q, k, v, is_causal=is_causal, block_size=block)
    biggest = max(math.prod(s) for s in rec.shapes)
    # Largest tensors: the (B*H, L, 4) queries/keys/values/output; a tile is (B*H, 16, 8).
    assert biggest <= 6 * max(lq, lk) * 4 < 6 * lq * lk, rec.shapes
    assert all(s[-2:] != (lq, lk) for s in rec.shapes if len(s) >= 2)
    # and the naive computation does make it (the recorder can see it)
    with _RecordOps() as rec_naive:
        scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    assert any(s[-2:] == (lq, lk) for s in rec_naive.shapes if len(s) >= 2)


@pytest.mark.parametrize(
    "lq,lk,block,causal_tiles",
    [
        (64, 64, 16, 4 + 3 + 2 + 1),  # square: the lower triangle of a 4x4 tile grid
        (64, 64, (16, 32), 1 + 1 + 2 + 2),
        (10, 30, (4, 4), 1 + 2 + 3),  # Lq < Lk: keys from Lq on are never visible
        (30, 10, (8, 4), 2 + 3 + 3 + 3),  # Lq > Lk: late queries see all keys
    ],
)
def test_causal_skips_tiles_above_the_diagonal(lq, lk, block, causal_tiles) -> None:
    q, k, v = qkv((2,), lq, lk, 4, 4)
    block_q, block_k = (block, block) if isinstance(block, int) else block
    with _RecordOps() as rec:
        tiled_attention(q, k, v, block_size=block)
    assert rec.bmm_calls == math.ceil(lq / block_q) * math.ceil(lk / block_k)
    with _RecordOps() as rec:
        out = tiled_attention(q, k, v, is_causal=True, block_size=block)
    assert rec.bmm_calls == causal_tiles
    assert max_err(out, F.scaled_dot_product_attention(q, k, v, is_causal=True)) <= 1e-5


@pytest.mark.parametrize("mask_kind", ["full", "padding", "row_broadcast", "float01", "int01"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_keep_mask_matches_lib_sdpa(mask_kind, is_causal) -> None:
    gen = torch.Generator().manual_seed(11)
    q, k, v = qkv((2, 3), 13, 17, 5, 4, torch.float64, seed=11)
    if mask_kind == "padding":
        mask = torch.arange(17) < torch.tensor([17, 6]).view(2, 1, 1, 1)  # (2, 1, 1, 17)
    elif mask_kind == "row_broadcast":
        mask = torch.rand(13, 1, generator=gen) > 0.3  # (13, 1): some rows fully masked
    else:
        mask = torch.rand(2, 1, 13, 17, generator=gen) > 0.5
        mask[0, 0, 4] = False  # a fully masked row
        if mask_kind == "float01":
            mask = mask.double()
        elif mask_kind == "int01":
            mask = mask.long()
    expected, _ = scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal)
    out = tiled_attention(q, k, v, mask, is_causal=is_causal, block_size=(4, 5))
    assert torch.isfinite(out).all()
    assert max_err(out, expected) <= 1e-10


def test_fully_masked_rows_give_zeros_not_nan() -> None:
    q, k, v = qkv((1,), 4, 6, 3, 2, torch.float64)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[2] = False
    out = tiled_attention(q, k, v, mask, block_size=2)
    torch.testing.assert_close(out[:, 2], torch.zeros(1, 2, dtype=torch.float64))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_inputs_not_modified_and_inference_mode() -> None:
    q, k, v = qkv((2, 2), 19, 23, 4, 4)
    copies = [t.clone() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with torch.inference_mode():
        out = tiled_attention(q, k, v, is_causal=True, block_size=5)
    for t, c in zip((q, k, v), copies):
        assert torch.equal(t, c)
    assert max_err(out, expected) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_computed_in_float32(dtype) -> None:
    q, k, v = qkv((2, 2), 33, 33, 16, 8)
    out = tiled_attention(q.to(dtype), k.to(dtype), v.to(dtype), is_causal=True, block_size=8)
    assert out.dtype == dtype
    expected = F.scaled_dot_product_attention(
        q.to(dtype).float(), k.to(dtype).float(), v.to(dtype).float(), is_causal=True
    )
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-3
    assert max_err(out.float(), expected) <= tol


def test_dropout() -> None:
    q, k, v = qkv((1,), 4, 6, 3, 1, torch.float64, seed=9)
    v = v.abs() + 1.0  # positive values: dropping a weight always lowers the output
    exact = tiled_attention(q, k, v, block_size=2)
    torch.manual_seed(0)
    first = tiled_attention(q, k, v, dropout_p=0.5, block_size=2)
    torch.manual_seed(0)
    again = tiled_attention(q, k, v, dropout_p=0.5, block_size=2)
    assert torch.equal(first, again)  # reproducible under a seed
    assert not torch.allclose(first, exact)
    # Dropout is unbiased: zeroed weights, survivors scaled by 1 / (1 - p).
    torch.manual_seed(1)
    mean = torch.stack(
        [tiled_attention(q, k, v, dropout_p=0.5, block_size=2) for _ in range(4000)]
    ).mean(0)
    torch.testing.assert_close(mean, exact, atol=0.05, rtol=0.05)


# --------------------------------------------------------------------------- backward pass

# (name, batch, Lq, Lk, mask kind, is_causal): the cases issue 14 lists, and more.
GRAD_CASES = [
    ("no mask", (2, 3), 37, 37, None, False),
    ("mask", (2, 3), 37, 29, "random", False),
    ("causal", (2, 3), 37, 37, None, True),
    ("Lq > Lk causal", (2, 3), 41, 23, None, True),
    ("Lq < Lk causal", (2, 3), 23, 41, None, True),
    ("mask + causal", (2, 3), 37, 37, "random", True),
    ("fully masked row", (2, 3), 37, 29, "empty rows", False),
    ("padding", (2, 3), 37, 37, "padding", True),
]
GRAD_IDS = [case[0] for case in GRAD_CASES]


def grad_mask(kind, batch, lq, lk, seed=7):
    gen = torch.Generator().manual_seed(seed)
    if kind is None:
        return None
    if kind == "padding":
        return torch.arange(lk) < torch.tensor([lk, 9]).view(2, 1, 1, 1)  # (2, 1, 1, Lk)
    mask = torch.rand(*batch[:1], 1, lq, lk, generator=gen) > 0.4  # (B, 1, Lq, Lk)
    if kind == "empty rows":
        mask[0, 0, 3] = False
        mask[1, 0, -1] = False
    return mask


def torch_sdpa(q, k, v, mask, is_causal):
    """F.scaled_dot_product_attention, which refuses a mask together with is_causal."""
    if mask is not None and is_causal:
        mask = mask & torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        is_causal = False
    return F.scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal)


def block_pair(block):
    return block if isinstance(block, tuple) else (block, block)


def grads(fn, inputs, grad_out):
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*inputs)
    out.backward(grad_out)
    return out, [t.grad for t in inputs]


@pytest.mark.parametrize("name,batch,lq,lk,mask_kind,is_causal", GRAD_CASES, ids=GRAD_IDS)
@pytest.mark.parametrize("block_size", [(8, 8), (16, 5), DEFAULT_BLOCK_SIZE])
def test_gradients_equal_torch_sdpa_fp32(name, batch, lq, lk, mask_kind, is_causal, block_size):
    """fp32, unit-scale inputs: every gradient within 1e-5 of F.scaled_dot_product_attention."""
    q, k, v = qkv(batch, lq, lk, 16, 8, seed=lq + lk)
    mask = grad_mask(mask_kind, batch, lq, lk)
    grad_out = torch.randn(*batch, lq, 8, generator=torch.Generator().manual_seed(1))
    out, mine = grads(
        lambda q, k, v: tiled_attention(q, k, v, mask, is_causal=is_causal, block_size=block_size),
        (q, k, v),
        grad_out,
    )
    expected, theirs = grads(
        lambda q, k, v: torch_sdpa(q, k, v, mask, is_causal),
        (q, k, v),
        grad_out,
    )
    assert max_err(out, expected) <= 1e-5
    for label, a, b in zip("qkv", mine, theirs):
        assert torch.isfinite(a).all()
        assert max_err(a, b) <= 1e-5, (label, max_err(a, b))
    if mask_kind == "empty rows":  # a row that sees no key: zero gradient, never NaN
        assert (mine[0][0, :, 3] == 0).all() and (mine[0][1, :, -1] == 0).all()


@pytest.mark.parametrize("name,batch,lq,lk,mask_kind,is_causal", GRAD_CASES, ids=GRAD_IDS)
def test_gradcheck_fp64(name, batch, lq, lk, mask_kind, is_causal) -> None:
    """Small shapes, several tiles per side: torch.autograd.gradcheck in fp64."""
    batch, lq, lk = (2, 1), max(lq // 4, 3), max(lk // 4, 3)
    q, k, v = qkv(batch, lq, lk, 3, 2, torch.float64, seed=lq * lk, requires_grad=True)
    mask = grad_mask(mask_kind, batch, lq, lk)
    assert torch.autograd.gradcheck(
        lambda q, k, v: tiled_attention(q, k, v, mask, is_causal=is_causal, block_size=(3, 2)),
        (q, k, v),
    )


def test_gradients_through_broadcast_leading_dims() -> None:
    """Shared keys/values (e.g. one head for all queries) get their gradients summed."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 11, 6, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 1, 13, 6, generator=gen, dtype=torch.float64)
    v = torch.randn(4, 13, 5, generator=gen, dtype=torch.float64)
    grad_out = torch.randn(2, 4, 11, 5, generator=gen, dtype=torch.float64)
    _, mine = grads(
        lambda *t: tiled_attention(*t, is_causal=True, block_size=4), (q, k, v), grad_out
    )
    _, theirs = grads(
        lambda *t: F.scaled_dot_product_attention(*t, is_causal=True), (q, k, v), grad_out
    )
    for a, b, t in zip(mine, theirs, (q, k, v)):
        assert a.shape == t.shape
        assert max_err(a, b) <= 1e-10
    q, k, v = (t.requires_grad_() for t in (q[:1, :2, :5], k[..., :4, :], v[:2, :4]))
    assert torch.autograd.gradcheck(lambda *t: tiled_attention(*t, block_size=2), (q, k, v))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_gradients_computed_in_float32(dtype) -> None:
    q, k, v = (t.to(dtype) for t in qkv((2, 2), 33, 40, 16, 8))
    grad_out = torch.randn(2, 2, 33, 8).to(dtype)
    _, mine = grads(
        lambda *t: tiled_attention(*t, is_causal=True, block_size=8), (q, k, v), grad_out
    )
    # the reference: float32 SDPA on the same (rounded) numbers
    _, ref = grads(
        lambda *t: F.scaled_dot_product_attention(*(x.float() for x in t), is_causal=True),
        (q, k, v),
        grad_out.float(),
    )
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    for a, b in zip(mine, ref):
        assert a.dtype == dtype and torch.isfinite(a).all()
        assert max_err(a.float(), b) <= tol


def test_dropout_with_gradients_is_refused() -> None:
    q, k, v = qkv((2,), 6, 6, 4, 4, requires_grad=True)
    with pytest.raises(ValueError, match="dropout_p"):
        tiled_attention(q, k, v, dropout_p=0.1)
    with torch.no_grad():  # without gradients, dropout is fine
        assert tiled_attention(q, k, v, dropout_p=0.1).shape == (2, 6, 4)
    mha = MultiHeadAttention(8, 2, dropout=0.1, backend="tiled").train()
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match="dropout_p"):
        mha(x, x, x)
    mha.eval()(x, x, x).sum().backward()  # eval: no dropout, gradients flow


@pytest.mark.parametrize("is_causal", [False, True])
def test_backward_saves_no_score_matrix(is_causal) -> None:
    """Autograd keeps only q, k, v, the output and one log-sum-exp per row."""
    lq, lk = 96, 80
    q, k, v = qkv((2, 3), lq, lk, 4, 5, requires_grad=True)
    mask = torch.rand(lq, lk, generator=torch.Generator().manual_seed(0)) > 0.2
    saved = {}  # shape -> the tensor autograd keeps

    def pack(t):
        saved[tuple(t.shape)] = t
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = tiled_attention(q, k, v, mask, is_causal=is_causal, block_size=16)
    # q, k, v, out, lse, and the caller's own mask (a view of it, expanded: no copy)
    assert sorted(saved) == sorted(
        [(6, lq, 4), (6, lk, 4), (6, lk, 5), (6, lq, 5), (6, lq, 1), (2, 3, lq, lk)]
    )
    assert saved[(2, 3, lq, lk)].data_ptr() == mask.data_ptr()
    assert saved[(2, 3, lq, lk)].untyped_storage().nbytes() == lq * lk  # one bool each
    # the naive version keeps (Lq, Lk) weights per batch and head
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal)
    assert saved[(2, 3, lq, lk)].untyped_storage().nbytes() == 6 * lq * lk * 4
    out.sum().backward()


@pytest.mark.parametrize("lq,lk,block", [(64, 64, 16), (30, 10, (8, 4)), (10, 30, (4, 4))])
def test_backward_skips_causal_tiles_and_never_builds_scores(lq, lk, block) -> None:
    """The backward pass recomputes exactly the tiles that the forward pass computed."""
    q, k, v = qkv((2,), lq, lk, 4, 4, requires_grad=True)
    with _RecordOps() as rec:
        tiled_attention(q, k, v, is_causal=True, block_size=block)
    forward_tiles = rec.bmm_calls  # one bmm of scores per tile
    all_tiles = math.ceil(lq / block_pair(block)[0]) * math.ceil(lk / block_pair(block)[1])
    assert forward_tiles < all_tiles  # the forward pass skipped the tiles above the diagonal
    out = tiled_attention(q, k, v, is_causal=True, block_size=block)
    grad_out = torch.randn_like(out)
    # The autograd engine runs the backward pass outside a TorchFunctionMode; the
    # profiler sees its aten ops. Per tile: the scores, dV and dK are one baddbmm_
    # each, dP = dO V^T and dS K one bmm each.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out.backward(grad_out)
    ops = collections.Counter(event.name for event in prof.events())
    assert (ops["aten::baddbmm_"], ops["aten::bmm"]) == (3 * forward_tiles, 2 * forward_tiles)
    _, ref = grads(
        lambda *t: F.scaled_dot_product_attention(*t, is_causal=True), (q, k, v), grad_out
    )
    for a, b in zip((q.grad, k.grad, v.grad), ref):
        assert max_err(a, b) <= 1e-5


# --------------------------------------------------------------------------- block backward


def _sdpa_case(is_causal, lq=10, lk=10):
    """float64 q, k, v, dO; autograd's gradients of F.sdpa; the global lse (natural
    log), D = rowsum(dO * O) and the keep-mask, for block_backward."""
    q, k, v = qkv((2, 3), lq, lk, 5, 4, dtype=torch.float64, seed=3, requires_grad=True)
    grad_out = torch.randn(
        2, 3, lq, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(4)
    )
    out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    want = torch.autograd.grad(out, (q, k, v), grad_out)
    q, k, v, out = q.detach(), k.detach(), v.detach(), out.detach()
    keep = torch.ones(lq, lk, dtype=torch.bool)
    keep = keep.tril() if is_causal else keep
    scores = (q @ k.transpose(-2, -1) / math.sqrt(5)).masked_fill(~keep, float("-inf"))
    lse = scores.logsumexp(-1, keepdim=True)  # (2, 3, Lq, 1), over all the keys
    delta = (grad_out * out).sum(-1, keepdim=True)  # (2, 3, Lq, 1)
    return (q, k, v, grad_out, lse, delta, keep), want


@pytest.mark.parametrize("is_causal", [False, True])
def test_block_backward_of_the_whole_equals_autograd_of_sdpa(is_causal) -> None:
    (q, k, v, grad_out, lse, delta, keep), want = _sdpa_case(is_causal)
    got = block_backward(q, k, v, grad_out, lse, delta, scale=5**-0.5, keep=keep)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


@pytest.mark.parametrize("base2", [False, True])
@pytest.mark.parametrize("is_causal", [False, True])
def test_block_backward_shares_add_up_to_autograd_of_sdpa(is_causal, base2) -> None:
    """Uneven blocks, each pair with the *global* lse: dQ summed over the key blocks,
    dK and dV over the query blocks, give the gradients of the whole (float64)."""
    (q, k, v, grad_out, lse, delta, keep), want = _sdpa_case(is_causal)
    if base2:  # tiled_attention's units: log2 sum 2^(s log2 e)
        lse = lse * math.log2(math.e)
    got = [torch.zeros_like(t) for t in (q, k, v)]
    for rows in (slice(0, 4), slice(4, 10)):
        for cols in (slice(0, 3), slice(3, 7), slice(7, 10)):  # (0:4, 7:10): all masked
            dq, dk, dv = block_backward(
                q[..., rows, :], k[..., cols, :], v[..., cols, :], grad_out[..., rows, :],
                lse[..., rows, :], delta[..., rows, :], scale=5**-0.5,
                keep=keep[rows, cols], base2=base2,
            )  # fmt: skip
            got[0][..., rows, :] += dq
            got[1][..., cols, :] += dk
            got[2][..., cols, :] += dv
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_block_backward_gives_zero_gradients_to_a_row_without_keys() -> None:
    q, k, v = qkv((2,), 3, 4, 5, 2, dtype=torch.float64)
    keep = torch.tensor([[True] * 4, [False] * 4, [True, False, True, False]])
    lse = (q @ k.transpose(1, 2)).masked_fill(~keep, float("-inf")).logsumexp(-1, keepdim=True)
    assert torch.isinf(lse[:, 1]).all()  # the middle row saw no key
    grad_out, delta = torch.randn(2, 3, 2, dtype=torch.float64), torch.zeros(2, 3, 1)
    dq, dk, dv = block_backward(q, k, v, grad_out, lse, delta.double(), scale=1.0, keep=keep)
    assert all(torch.isfinite(t).all() for t in (dq, dk, dv))
    assert (dq[:, 1] == 0).all()


# --------------------------------------------------------------------------- validate once


def test_empty_batch_with_mask_gives_empty_output() -> None:
    """Regression (issue 11, defect 3): B = 0 with a mask crashed with a reshape error."""
    q, k, v = qkv((0, 4), 5, 7, 8, 3)
    mask = torch.ones(5, 7, dtype=torch.bool)
    for is_causal in (False, True):
        out = tiled_attention(q, k, v, mask, is_causal=is_causal, block_size=2)
        assert out.shape == (0, 4, 5, 3)
    padding = torch.ones(0, 1, 1, 7, dtype=torch.bool)  # a (B, 1, 1, Lk) padding mask
    assert tiled_attention(q, k, v, padding, block_size=2).shape == (0, 4, 5, 3)
    mha = MultiHeadAttention(16, 4, backend="tiled")
    x = torch.randn(0, 5, 16)
    assert mha(x, x, x, torch.ones(0, 1, 1, 5, dtype=torch.bool)).shape == (0, 5, 16)
    q.requires_grad_()
    tiled_attention(q, k, v, mask, block_size=2).sum().backward()
    assert q.grad.shape == q.shape


def test_tile_loop_calls_no_public_validation(validation_calls) -> None:
    """Regression (issue 11, item 6): the tile loop used the validated public
    online_softmax_update (thousands of shape checks per call); it must check
    the arguments once, at the door: as many checks for 55 tiles as for one."""
    q, k, v = qkv((2,), 40, 40, 4, 4, requires_grad=True)

    def forward_and_backward(block_size: int) -> None:
        out = tiled_attention(q, k, v, torch.ones(40, 40), is_causal=True, block_size=block_size)
        out.sum().backward()  # the backward pass checks nothing either

    many, one = (
        validation_calls(lambda: forward_and_backward(4)),
        validation_calls(lambda: forward_and_backward(64)),
    )  # 55 tiles, 1 tile
    assert 0 < many == one
    # the public update still checks its own arguments
    state = OnlineSoftmaxState.empty((1,), 2, 3, dtype=torch.float32)
    assert (
        validation_calls(
            lambda: online_softmax_update(state, torch.randn(1, 2, 4), torch.randn(1, 4, 3))
        )
        > 0
    )


class _RecordRowMaxima(TorchFunctionMode):
    """Records the shape of every tensor whose row maxima (``amax``) are taken."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.amax:
            self.shapes.append(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))


def test_online_softmax_reads_one_block_at_a_time_like_the_update() -> None:
    """Regression (issue 11, item 9): online_softmax had its own copy of the
    recurrence; it folds its blocks with the update's m/l step, which takes the
    maximum of one block at a time (never of the whole row)."""
    x = torch.randn(3, 10, 4, dtype=torch.float64)
    with _RecordRowMaxima() as rec:
        result = online_softmax(x, 1, block_size=4)
    torch.testing.assert_close(result, x.softmax(1))
    assert rec.shapes == [(3, 4, 4), (3, 4, 4), (3, 4, 2)]  # blocks of 4, 4, 2 along dim 1
    state = OnlineSoftmaxState.empty((1,), 2, 3, dtype=torch.float32)
    with _RecordRowMaxima() as rec:
        online_softmax_update(state, torch.randn(1, 2, 4), torch.randn(1, 4, 3))
    assert rec.shapes == [(1, 2, 4)]  # the update: the same step, on its one block


# --------------------------------------------------------------------------- bad input

Q = torch.randn(2, 5, 4)
K = torch.randn(2, 6, 4)
V = torch.randn(2, 6, 3)

SHARED_BAD_INPUT = [
    ((Q.long(), K, V), {}),
    ((Q, K.int(), V), {}),
    ((Q, K, V.bool()), {}),
    (([1.0], K, V), {}),
    ((Q, K, V.double()), {}),
    ((Q, torch.randn(2, 6, 5), V), {}),
    ((Q, K, torch.randn(2, 7, 3)), {}),
    ((Q, torch.randn(3, 6, 4), torch.randn(3, 6, 3)), {}),
    ((Q, K, V, torch.ones(5, 7, dtype=torch.bool)), {}),
    ((Q, K, V, torch.full((5, 6), float("-inf"))), {}),
    ((Q, K, V, [[True]]), {}),
    ((Q, K, V), {"dropout_p": 1.0}),
    ((Q, K, V), {"scale": 0.0}),
    ((Q, K, V), {"scale": -1.0}),
    ((Q, K, V), {"is_causal": "yes"}),
    ((Q, K, V), {"is_causal": 1}),
    ((torch.randn(5), K, V), {}),
]


@pytest.mark.parametrize("args,kwargs", SHARED_BAD_INPUT)
def test_bad_input_same_errors_as_core_sdpa(args, kwargs) -> None:
    with pytest.raises((TypeError, ValueError)) as core:
        scaled_dot_product_attention(*args, **kwargs)
    with pytest.raises(core.type) as tiled:
        tiled_attention(*args, **kwargs)
    assert str(tiled.value) == str(core.value)


@pytest.mark.parametrize(
    "block_size,exc,match",
    [
        (0, ValueError, "block_size"),
        ((4, 0), ValueError, "block_size"),
        ((-1, 4), ValueError, "block_size"),
        (
            2.5,
            TypeError,
            "block_size",
        ),
        (
            (4, 4, 4),
            TypeError,
            "block_size",
        ),
        ((4, 2.0), TypeError, "block_size"),
        (True, TypeError, "block_size"),
        ([4, 4], TypeError, "block_size"),
    ],
)
def test_bad_block_size(block_size, exc, match) -> None:
    with pytest.raises(exc, match=match):
        tiled_attention(Q, K, V, block_size=block_size)


# --------------------------------------------------------------------------- backend / MHA


def test_tiled_backend_registered() -> None:
    assert "tiled" in available_backends()
    assert BACKENDS["tiled"] is tiled_backend


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("use_mask", [False, True])
def test_multi_head_attention_tiled_backend_equals_lib_and_torch(is_causal, use_mask) -> None:
    torch.manual_seed(0)
    lib = MultiHeadAttention(32, 4, backend="lib", dtype=torch.float64).eval()
    tiled = MultiHeadAttention(32, 4, backend="tiled", dtype=torch.float64).eval()
    fused = MultiHeadAttention(32, 4, backend="torch", dtype=torch.float64).eval()
    tiled.load_state_dict(lib.state_dict())
    fused.load_state_dict(lib.state_dict())
    x = torch.randn(3, 300, 32, dtype=torch.float64)  # 300 > the default block: several tiles
    mask = (torch.arange(300) < torch.tensor([300, 120, 7]).view(3, 1, 1, 1)) if use_mask else None
    expected = lib(x, x, x, mask, is_causal=is_causal)
    out = tiled(x, x, x, mask, is_causal=is_causal)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=0)
    torch.testing.assert_close(out, fused(x, x, x, mask, is_causal=is_causal), atol=1e-10, rtol=0)


def test_multi_head_attention_tiled_backend_trains() -> None:
    torch.manual_seed(0)
    lib = MultiHeadAttention(16, 2, backend="lib", dtype=torch.float64)
    tiled = MultiHeadAttention(16, 2, backend="tiled", dtype=torch.float64)
    tiled.load_state_dict(lib.state_dict())
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    lib(x, x, x, is_causal=True).square().sum().backward()
    tiled(x, x, x, is_causal=True).square().sum().backward()
    for (name, a), (_, b) in zip(lib.named_parameters(), tiled.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-10, rtol=0, msg=name)


#: How far the "tiled" loss curve may stray from the "lib" one (float32 sums in
#: another order; measured: 2.4e-7 over these 25 steps).
LOSS_CURVE_TOLERANCE = 1e-4


def test_token_classifier_trains_on_tiled_backend_along_the_lib_loss_curve(monkeypatch) -> None:
    """Chapter 7's model (smaller) trained with backend="tiled" follows the "lib"
    loss curve step by step; 4 x 4 tiles, so the sequences of 10 make 3 x 3 tiles."""
    monkeypatch.setitem(tiled_attention.__kwdefaults__, "block_size", (4, 4))
    gen = torch.Generator().manual_seed(1)
    inputs, targets = make_task_data("reverse", 256, 10, 10, generator=gen)
    losses = {}
    for backend in ("lib", "tiled"):
        torch.manual_seed(0)
        model = TokenClassifier(
            10, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_len=10, backend=backend
        )
        history = train_token_classifier(
            model,
            inputs,
            targets,
            steps=25,
            batch_size=16,
            lr=1e-2,
            generator=torch.Generator().manual_seed(3),
            log_every=1,
        )
        losses[backend] = torch.tensor(history.loss)
    assert len(losses["lib"]) == 25
    assert losses["lib"][-1] < 0.95 * losses["lib"][0]  # it does learn
    assert max_err(losses["tiled"], losses["lib"]) <= LOSS_CURVE_TOLERANCE
