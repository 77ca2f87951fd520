"""Sliding-window attention (chapter 10): causal_mask(window=...), the tiled
kernel's band, and the rolling KV cache of a windowed decoder.

Oracle: 🤗 transformers' sliding-window mask (``masking_utils``), also used as
the ``attn_mask`` of ``F.scaled_dot_product_attention``; for generation, a full
recomputation of the sequence under the window mask.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download

import pytest
import torch
import torch.nn.functional as F
from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function

from attention_lib import CausalLM, KVCache, LayerKVCache, causal_mask, generate, tiled_attention


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


@pytest.mark.parametrize("window", [1, 2, 3, 7, 50])
@pytest.mark.parametrize("q_len, k_len", [(0, 0), (1, 1), (9, 9), (5, 12), (12, 5)])
def test_causal_mask_window_matches_transformers(window, q_len, k_len):
    assert torch.equal(
        causal_mask(q_len, k_len, window=window), hf_window_mask(q_len, k_len, window)
    )


def test_causal_mask_window_by_hand():
    assert causal_mask(4, window=2).int().tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [0, 1, 1, 0],
        [0, 0, 1, 1],
    ]
    assert torch.equal(causal_mask(6, window=6), causal_mask(6))
    assert torch.equal(causal_mask(6, window=1), torch.eye(6, dtype=torch.bool))
    assert causal_mask(3, window=2, device="cpu").device.type == "cpu"


@pytest.mark.parametrize(
    "window, error", [(0, ValueError), (-1, ValueError), (2.0, TypeError), (True, TypeError)]
)
def test_causal_mask_bad_window(window, error):
    with pytest.raises(error, match="window"):
        causal_mask(4, window=window)


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


def test_rolling_layer_cache_keeps_the_last_window_positions():
    slot = LayerKVCache(window=3)
    k = torch.arange(5.0).view(1, 1, 5, 1)  # positions 0..4
    key, _ = slot.update(k[..., :2, :], k[..., :2, :])
    assert key.shape[-2] == 2 and len(slot) == 2 and slot.position == 2
    key, _ = slot.update(k[..., 2:, :], k[..., 2:, :])  # 3 new: returns all 5 ...
    assert key.flatten().tolist() == [0, 1, 2, 3, 4]
    assert slot.key.flatten().tolist() == [2, 3, 4]  # ... keeps the last 3
    assert (len(slot), slot.dropped, slot.position) == (3, 2, 5)
    assert slot.nbytes == 2 * 3 * 4  # K and V, 3 float32 numbers each


@pytest.mark.parametrize("positional", ["rope", "learned", "sinusoidal"])
@pytest.mark.parametrize("num_kv_heads", [4, 1])
def test_generation_with_a_rolling_cache_equals_full_recomputation(positional, num_kv_heads):
    torch.manual_seed(0)
    model = CausalLM(
        13, 32, 4, 2, max_len=40, positional=positional, num_kv_heads=num_kv_heads, window=5
    ).eval()
    prompt = torch.randint(13, (2, 7))
    rolling = generate(model, prompt, 25, use_cache=True)  # KVCache(window=5)
    assert torch.equal(rolling, generate(model, prompt, 25, use_cache=False))
    # logits, step by step, against one pass over the whole sequence
    cache = KVCache(window=5)
    with torch.no_grad():
        full = model(rolling)  # (B, 32, V) under the window mask
        steps = [model(rolling[:, :7], cache=cache)]
        steps += [model(rolling[:, t : t + 1], cache=cache) for t in range(7, 32)]
        assert len(cache) == 5 and cache.position == 32
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    head_dim = 32 // 4
    assert cache.nbytes == 2 * 2 * 2 * num_kv_heads * 5 * head_dim * 4  # K,V x layers x B


def test_the_window_changes_what_a_model_computes():
    torch.manual_seed(1)
    wide = CausalLM(13, 32, 4, 1, max_len=20, positional="rope")
    narrow = CausalLM(13, 32, 4, 1, max_len=20, positional="rope", window=3)
    narrow.load_state_dict(wide.state_dict())
    tokens = torch.randint(13, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(narrow(tokens)[:, :3], wide(tokens)[:, :3])  # inside the window
        assert not torch.allclose(narrow(tokens)[:, 3:], wide(tokens)[:, 3:])


def test_a_rolling_cache_narrower_than_the_window_is_refused():
    model = CausalLM(13, 32, 4, 1, max_len=20, window=4)
    with pytest.raises(ValueError, match="window"):
        model(torch.randint(13, (1, 3)), cache=KVCache(window=2))
    with pytest.raises(ValueError, match="window"):
        CausalLM(13, 32, 4, 1, max_len=20)(torch.randint(13, (1, 3)), cache=KVCache(window=8))
    with pytest.raises(ValueError, match="window"):
        KVCache(window=0)
