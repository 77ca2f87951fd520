"""Tests for attention_lib.kv_memory (KV-cache sizes from published model shapes)."""

from __future__ import annotations

import pytest

from attention_lib import PUBLISHED_SHAPES, ModelShape, kv_cache_bytes, kv_cache_table


def test_formula_by_hand():
    # Llama-2-7B, 4096 tokens, fp16: 2 (K, V) * 32 layers * 32 heads * 128 * 4096 * 2 bytes
    assert kv_cache_bytes(32, 32, 128, 4096) == 2 * 32 * 32 * 128 * 4096 * 2 == 2**31
    assert kv_cache_bytes(2, 3, 4, 5, batch_size=6, bytes_per_value=4) == 2 * 2 * 3 * 4 * 5 * 6 * 4
    assert kv_cache_bytes(32, 8, 128, 0) == 0


def test_window_caps_the_tokens():
    assert kv_cache_bytes(1, 1, 1, 10, window=4) == kv_cache_bytes(1, 1, 1, 4)
    assert kv_cache_bytes(1, 1, 1, 3, window=4) == kv_cache_bytes(1, 1, 1, 3)


def test_published_table():
    table = kv_cache_table((4096, 32768, 131072))
    assert list(table) == ["Llama-2-7B", "Llama-3-8B", "Mistral-7B-v0.1", "Falcon-7B"]
    assert table["Llama-2-7B"] == pytest.approx([2.147483648, 17.179869184, 68.719476736])
    # GQA with 8 of 32 KV heads: a quarter of the cache
    assert table["Llama-3-8B"] == pytest.approx([x / 4 for x in table["Llama-2-7B"]])
    # a 4096-token window: the cache stops growing
    assert table["Mistral-7B-v0.1"] == pytest.approx([table["Llama-3-8B"][0]] * 3)
    # MQA (1 KV head of width 64)
    assert table["Falcon-7B"] == pytest.approx([x / 64 for x in table["Llama-2-7B"]])


def test_query_heads_do_not_count():
    a = ModelShape("a", num_layers=2, num_heads=8, num_kv_heads=2, d_head=16)
    b = ModelShape("b", num_layers=2, num_heads=32, num_kv_heads=2, d_head=16)
    assert a.kv_cache_bytes(100) == b.kv_cache_bytes(100)
    assert kv_cache_table([10], [a]) == {"a": [a.kv_cache_bytes(10) / 1e9]}


def test_published_shapes_are_consistent():
    for shape in PUBLISHED_SHAPES.values():
        assert shape.num_heads % shape.num_kv_heads == 0
    assert PUBLISHED_SHAPES["Falcon-7B"].num_heads * PUBLISHED_SHAPES["Falcon-7B"].d_head == 4544


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: kv_cache_bytes(32, 8, 128, 4096.0), TypeError, "seq_len"),
        (lambda: kv_cache_bytes(0, 8, 128, 4096), ValueError, "num_layers"),
        (lambda: kv_cache_bytes(32, 8, 128, -1), ValueError, "seq_len"),
        (lambda: kv_cache_bytes(32, 8, 128, 10, window=0), ValueError, "window"),
        (lambda: kv_cache_bytes(32, True, 128, 10), TypeError, "num_kv_heads"),
        (lambda: kv_cache_table([10], ["Llama-2-7B"]), TypeError, "ModelShape"),
    ],
)
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
