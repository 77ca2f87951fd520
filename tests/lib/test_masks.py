"""Tests for attention_lib.masks: causal_mask, padding_mask, as_keep_mask, masked_softmax."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attention_lib import as_keep_mask, causal_mask, masked_softmax, padding_mask


@pytest.mark.parametrize("q_len,k_len", [(1, 1), (4, 4), (3, 6), (6, 3), (0, 2), (2, 0)])
def test_causal_mask_matches_torch_is_causal(q_len: int, k_len: int) -> None:
    mask = causal_mask(q_len, k_len)
    assert mask.dtype == torch.bool and mask.shape == (q_len, k_len)
    for i in range(q_len):
        for j in range(k_len):
            assert bool(mask[i, j]) == (j <= i)
    if q_len and k_len:
        # Same result as torch's own is_causal alignment.
        torch.manual_seed(0)
        q, k, v = torch.randn(q_len, 8), torch.randn(k_len, 8), torch.randn(k_len, 5)
        ours = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        theirs = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.testing.assert_close(ours, theirs)


def test_causal_mask_default_square_and_device() -> None:
    assert causal_mask(3).shape == (3, 3)
    assert causal_mask(3, device="cpu").device.type == "cpu"


@pytest.mark.parametrize(
    "args,exc,match",
    [
        ((2.0,), TypeError, "q_len"),
        ((True,), TypeError, "q_len"),
        ((-1,), ValueError, "q_len"),
        ((2, "3"), TypeError, "k_len"),
        ((2, -3), ValueError, "k_len"),
    ],
)
def test_causal_mask_bad_input(args: tuple, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        causal_mask(*args)


def test_padding_mask_values_and_shape() -> None:
    mask = padding_mask(torch.tensor([1, 3, 0]), max_len=4)
    assert mask.dtype == torch.bool and mask.shape == (3, 1, 1, 4)
    expected = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(mask[:, 0, 0], expected)
    # default max_len = longest, and a list works too
    assert padding_mask([2, 5]).shape == (2, 1, 1, 5)
    # broadcasts against (B, H, Lq, Lk)
    assert torch.broadcast_shapes(mask.shape, (3, 2, 5, 4)) == (3, 2, 5, 4)


@pytest.mark.parametrize(
    "lengths,max_len,exc,match",
    [
        (
            torch.tensor([1.0, 2.0]),
            None,
            TypeError,
            "lengths",
        ),
        ([1, 2.5], None, TypeError, "lengths"),
        (
            torch.tensor([[1, 2]]),
            None,
            ValueError,
            "lengths",
        ),
        (torch.tensor([1, -2]), None, ValueError, "lengths"),
        (torch.tensor([1, 5]), 3, ValueError, "max_len"),
        (torch.tensor([1, 2]), 2.0, TypeError, "max_len"),
    ],
)
def test_padding_mask_bad_input(lengths: object, max_len: object, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        padding_mask(lengths, max_len)  # type: ignore[arg-type]


def test_as_keep_mask_converts_numeric_and_combines_causal() -> None:
    float_mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    keep = as_keep_mask(float_mask, 2, 3)
    assert keep is not None and keep.dtype == torch.bool
    assert torch.equal(keep, float_mask.bool())
    combined = as_keep_mask(float_mask.long(), 2, 3, is_causal=True)
    assert torch.equal(combined, float_mask.bool() & causal_mask(2, 3))
    assert as_keep_mask(None, 2, 3) is None
    assert torch.equal(as_keep_mask(None, 2, 3, is_causal=True), causal_mask(2, 3))


def test_as_keep_mask_rejects_additive_bias() -> None:
    bias = torch.tensor([[0.0, float("-inf")]])
    with pytest.raises(ValueError, match="additive bias"):
        as_keep_mask(bias, 1, 2)


def test_masked_softmax_zero_rows_and_exact_zeros() -> None:
    scores = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    keep = torch.rand(2, 3, 4) > 0.4
    keep[0, 1] = False  # one fully masked row
    keep[1, 2] = True
    weights = masked_softmax(scores, keep)
    assert not torch.isnan(weights).any()
    assert torch.all(weights[~keep.expand_as(weights)] == 0)
    sums = weights.sum(-1)
    expected = keep.any(-1).to(sums.dtype)
    torch.testing.assert_close(sums, expected)
    # explicit reference for the kept entries
    ref = torch.where(keep, scores.exp(), torch.zeros_like(scores))
    ref = ref / ref.sum(-1, keepdim=True).clamp_min(1e-300)
    torch.testing.assert_close(weights, ref)
    weights.sum().backward()
    assert scores.grad is not None and not torch.isnan(scores.grad).any()
    assert torch.all(scores.grad[0, 1] == 0)


def test_masked_softmax_naive_version_would_nan() -> None:
    """The reason masked_softmax exists: the naive -inf version gives NaN."""
    scores = torch.zeros(1, 3)
    keep = torch.zeros(1, 3, dtype=torch.bool)
    naive = scores.masked_fill(~keep, float("-inf")).softmax(-1)
    assert torch.isnan(naive).all()
    assert torch.equal(masked_softmax(scores, keep), torch.zeros(1, 3))
    assert torch.equal(masked_softmax(scores, None), torch.full((1, 3), 1 / 3))
