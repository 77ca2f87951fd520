"""Tests for attention_lib.kv_cache: the per-layer key/value store of a decoder."""

from __future__ import annotations

import pytest
import torch

from attention_lib import CausalLM, KVCache, LayerKVCache, MultiHeadAttention


def test_an_empty_cache_holds_nothing() -> None:
    cache = KVCache()
    assert len(cache) == 0 and cache.nbytes == 0 and cache.layers == []
    assert "tokens=0" in repr(cache)


def test_layer_cache_appends_along_the_time_axis() -> None:
    slot = LayerKVCache()
    k1, v1 = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    k2, v2 = torch.randn(2, 3, 1, 5), torch.randn(2, 3, 1, 5)
    assert slot.update(k1, v1) == (k1, v1)
    key, value = slot.update(k2, v2)
    assert torch.equal(key, torch.cat([k1, k2], dim=2))
    assert torch.equal(value, torch.cat([v1, v2], dim=2))
    assert len(slot) == 5 and slot.nbytes == 2 * 2 * 3 * 5 * 5 * 4


def test_layer_slots_are_created_on_demand() -> None:
    cache = KVCache()
    third = cache.layer(2)
    assert len(cache.layers) == 3 and cache.layer(2) is third


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("batch, length", [(1, 1), (3, 7)])
def test_nbytes_is_two_layers_batch_heads_tokens_d_head_itemsize(
    dtype: torch.dtype, batch: int, length: int
) -> None:
    layers, heads, d_model = 3, 4, 32
    model = CausalLM(11, d_model, heads, layers, 16).to(dtype)
    cache = KVCache()
    model(torch.randint(11, (batch, length)), cache=cache)
    model(torch.randint(11, (batch, 1)), cache=cache)
    tokens, d_k = length + 1, d_model // heads
    itemsize = torch.empty(0, dtype=dtype).element_size()
    assert len(cache) == tokens
    assert cache.nbytes == 2 * layers * batch * heads * tokens * d_k * itemsize


def test_multi_head_attention_attends_to_cached_and_new_keys() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 6, 16)  # (B, L, d_model)
    full = mha(x, x, x, is_causal=True)  # (B, L, d_model)
    slot = LayerKVCache()
    first = mha(x[:, :5], x[:, :5], x[:, :5], is_causal=True, kv_cache=slot)
    last = mha(x[:, 5:], x[:, 5:], x[:, 5:], kv_cache=slot)  # one query, all keys
    torch.testing.assert_close(torch.cat([first, last], 1), full, atol=1e-6, rtol=0)
    assert len(slot) == 6 and slot.key.shape == (2, 4, 6, 4)


def test_what_a_cache_keeps_is_keep_last_and_window_is_its_older_name() -> None:
    """Issue 34: ``window`` named two things, what a query of sliding-window
    attention sees and what a rolling cache keeps; the cache's is ``keep_last``,
    and ``window`` (chapters 10 and 15) still reaches it."""
    for cache in (KVCache(window=4, sink_tokens=1), KVCache(keep_last=4, sink_tokens=1)):
        assert (cache.keep_last, cache.window, cache.sink_tokens) == (4, 4, 1)
        assert repr(cache).startswith("KVCache(keep_last=4, sink_tokens=1,")
    slot = LayerKVCache(window=2)
    for p in range(4):
        slot.update(torch.full((1, 1, 1, 1), float(p)), torch.zeros(1, 1, 1, 1))
    assert slot.key.flatten().tolist() == [2, 3] and slot.keep_last == slot.window == 2
    with pytest.raises(ValueError, match="window"):
        KVCache(keep_last=4, window=4)
    with pytest.raises(ValueError, match="window"):
        LayerKVCache(window=0)
    with pytest.raises(ValueError, match="keep_last"):
        LayerKVCache(sink_tokens=2)
