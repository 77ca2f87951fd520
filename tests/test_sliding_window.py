"""Sliding-window attention (chapter 10): the tiled kernel's band.

Oracle: 🤗 transformers' sliding-window mask (``masking_utils``), used as the
``attn_mask`` of ``F.scaled_dot_product_attention``.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download

import pytest
import torch
import torch.nn.functional as F
from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function

from attention_lib import tiled_attention


def hf_window_mask(q_len: int, k_len: int, window: int) -> torch.Tensor:
    """transformers' sliding-window keep-mask ``(Lq, Lk)``: ``kv_idx <= q_idx`` and
    ``kv_idx > q_idx - window``."""
    mask = sdpa_mask(
        1,
        q_len,
        k_len,
        allow_is_causal_skip=False,
        mask_function=sliding_window_causal_mask_function(window),
    )
    return mask[0, 0]


def qkv(q_len, k_len, *, batch=(2, 3), d=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(*batch, q_len, d, generator=g, dtype=dtype),
        torch.randn(*batch, k_len, d, generator=g, dtype=dtype),
        torch.randn(*batch, k_len, d, generator=g, dtype=dtype),
    )


def reference(q, k, v, window):
    keep = hf_window_mask(q.shape[-2], k.shape[-2], window)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    return out.masked_fill(~keep.any(-1, keepdim=True), 0.0)  # rows with no key: 0


@pytest.mark.parametrize("window", [1, 2, 5, 16, 100])
@pytest.mark.parametrize("block_size", [3, (4, 7), 16])
@pytest.mark.parametrize("q_len, k_len", [(37, 37), (20, 33), (33, 20), (1, 9)])
def test_tiled_window_matches_transformers_mask(window, block_size, q_len, k_len):
    q, k, v = qkv(q_len, k_len)
    out = tiled_attention(q, k, v, is_causal=True, window=window, block_size=block_size)
    torch.testing.assert_close(out, reference(q, k, v, window), atol=1e-10, rtol=0)


@pytest.mark.parametrize("window", [1, 3, 12])
def test_tiled_window_gradients(window):
    q, k, v = (t.requires_grad_() for t in qkv(29, 29, batch=(2,)))
    grad_out = torch.randn(2, 29, 8, dtype=torch.float64)
    ours = torch.autograd.grad(
        tiled_attention(q, k, v, is_causal=True, window=window, block_size=(4, 5)),
        (q, k, v),
        grad_out,
    )
    theirs = torch.autograd.grad(reference(q, k, v, window), (q, k, v), grad_out)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_tiled_window_with_a_user_mask_and_float32():
    q, k, v = qkv(40, 40, dtype=torch.float32)
    user = torch.rand(40, 40, generator=torch.Generator().manual_seed(3)) > 0.3
    out = tiled_attention(q, k, v, user, is_causal=True, window=6, block_size=8)
    keep = user & hf_window_mask(40, 40, 6)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    expected = expected.masked_fill(~keep.any(-1, keepdim=True), 0.0)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


def test_window_at_least_the_length_is_plain_causal():
    q, k, v = qkv(30, 30)
    causal = tiled_attention(q, k, v, is_causal=True, block_size=7)
    for window in (30, 31, 1000):
        windowed = tiled_attention(q, k, v, is_causal=True, window=window, block_size=7)
        torch.testing.assert_close(windowed, causal, atol=0, rtol=0)


def test_tiles_before_the_band_are_skipped(monkeypatch):
    """At a fixed window the number of score tiles grows linearly with N."""
    import attention_lib.tiled as tiled

    counted = []
    real_bmm = torch.bmm

    def counting_bmm(*args, **kwargs):
        counted.append(1)
        return real_bmm(*args, **kwargs)

    tiles = {}
    for n in (64, 128, 256):
        q, k, v = qkv(n, n, batch=(1,), dtype=torch.float32)
        counted.clear()
        monkeypatch.setattr(tiled.torch, "bmm", counting_bmm)
        with torch.no_grad():
            tiled_attention(q, k, v, is_causal=True, window=16, block_size=16)
        monkeypatch.setattr(tiled.torch, "bmm", real_bmm)
        tiles[n] = len(counted)
    # 16x16 tiles, window 16: each query block sees its diagonal tile and the one before
    assert tiles == {64: 2 * 4 - 1, 128: 2 * 8 - 1, 256: 2 * 16 - 1}


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"window": 4}, ValueError, "is_causal=True"),
        ({"window": 0, "is_causal": True}, ValueError, "window"),
        ({"window": 2.0, "is_causal": True}, TypeError, "window"),
        ({"window": True, "is_causal": True}, TypeError, "window"),
    ],
)
def test_tiled_window_bad_input(kwargs, error, match):
    q, k, v = qkv(4, 4)
    with pytest.raises(error, match=match):
        tiled_attention(q, k, v, **kwargs)
