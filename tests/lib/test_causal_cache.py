"""Issue 21's defects, each pinned by a test that failed before the fix:

1. ``is_causal=True`` with a KV cache aligns the new queries bottom-right (they are
   the last positions), for every backend, with grouped heads, RoPE and windows;
3. grouped-query attention on the fused backend takes no more memory than MHA;
4. a cache filled by another model is refused at the entry with a clear message;

and the forward hooks of an inner attention layer see exactly a public call.
"""

from __future__ import annotations

import pytest
import torch

from attention_lib import CausalLM, KVCache, LayerKVCache, MultiHeadAttention, TensorMemory

BACKENDS = ["lib", "torch", "tiled"]
CHUNKS = (5, 1, 1, 3, 1, 1, 1, 2)  # a prefill, then decode steps and short chunks


def _mha(backend: str, **options) -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(32, 8, backend=backend, dtype=torch.float64, **options).eval()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "options",
    [{}, {"num_kv_heads": 2}, {"num_kv_heads": 1, "rope_base": 100.0}, {"rope_base": 10.0},
     {"window": 3}, {"window": 4, "num_kv_heads": 2, "rope_base": 50.0},
     {"window": 3, "rolling": True}, {"window": 4, "num_kv_heads": 1, "rolling": True}],
    ids=["mha", "gqa", "mqa-rope", "rope", "window", "window-gqa-rope", "rolling",
         "rolling-mqa"],
)  # fmt: skip
def test_prefill_and_decode_with_is_causal_equal_the_full_pass(backend, options) -> None:
    options = dict(options)
    rolling = options.pop("rolling", False)  # a rolling cache of the window's size
    mha = _mha(backend, **options)
    x = torch.randn(2, sum(CHUNKS), 32, dtype=torch.float64)
    with torch.no_grad():
        full = mha(x, x, x, is_causal=True)  # (B, L, d)
        cache = LayerKVCache(window=options["window"] if rolling else None)
        parts, start = [], 0
        for n in CHUNKS:
            chunk = x[:, start : start + n]
            parts.append(mha(chunk, chunk, chunk, is_causal=True, kv_cache=cache))
            start += n
    assert cache.position == sum(CHUNKS)
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-12, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_decode_step_sees_every_cached_key(backend) -> None:
    # The defect: a one-token step after a cache saw only key 0 (top-left alignment).
    mha = _mha(backend)
    x = torch.randn(1, 6, 32, dtype=torch.float64)
    cache = LayerKVCache()
    with torch.no_grad():
        mha(x[:, :5], x[:, :5], x[:, :5], is_causal=True, kv_cache=cache)
        _, weights = mha(x[:, 5:], x[:, 5:], x[:, 5:], is_causal=True, kv_cache=cache,
                         need_weights=True)  # fmt: skip
    assert weights.shape == (1, 8, 1, 6)
    assert bool((weights > 0).all())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "options",
    [
        {"positional": "learned"},
        {"positional": "sinusoidal"},
        {"positional": "rope", "num_kv_heads": 2},
        {"positional": "rope", "window": 4},
    ],
    ids=["learned", "sinusoidal", "rope-gqa", "rope-window"],
)
def test_causal_lm_with_a_cache_equals_the_full_pass(backend, options) -> None:
    torch.manual_seed(3)
    model = CausalLM(11, 32, 4, 2, max_len=32, backend=backend, **options).eval()
    model.double()
    tokens = torch.randint(11, (2, sum(CHUNKS)))
    with torch.no_grad():
        full = model(tokens)
        cache, parts, start = KVCache(window=options.get("window")), [], 0
        for n in CHUNKS:
            parts.append(model(tokens[:, start : start + n], cache=cache))
            start += n
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-10, rtol=0)


@pytest.mark.parametrize("n", [512, 1024])
def test_grouped_heads_take_no_more_memory_than_mha_on_the_fused_backend(n) -> None:
    peaks = {}
    for kv_heads in (8, 2, 1):
        torch.manual_seed(0)
        mha = MultiHeadAttention(256, 8, num_kv_heads=kv_heads, backend="torch").eval()
        x = torch.randn(1, n, 256)
        with torch.no_grad(), TensorMemory() as memory:
            mha(x, x, x, is_causal=True)
        peaks[kv_heads] = memory.peak
    assert peaks[2] <= peaks[8] and peaks[1] <= peaks[8], peaks
    assert peaks[8] < 8 * n * 256 * 4  # O(N d) memory: no (N, N) scores anywhere


def test_a_cache_of_another_model_is_refused_at_the_entry() -> None:
    x = torch.randn(2, 3, 32)
    other = LayerKVCache()
    MultiHeadAttention(32, 8, num_kv_heads=2).eval()(x, x, x, kv_cache=other)
    for model, what in [
        (MultiHeadAttention(32, 8), "H_kv=8"),  # other KV heads
        (MultiHeadAttention(32, 4, num_kv_heads=2), "d_k=8"),  # other head width
        (MultiHeadAttention(32, 8, num_kv_heads=2, dtype=torch.float64), "float64"),
    ]:
        with pytest.raises(ValueError, match=f"kv_cache holds .*{what}"):
            model(x.to(model.W_q.weight.dtype), x.to(model.W_q.weight.dtype),
                  x.to(model.W_q.weight.dtype), kv_cache=other)  # fmt: skip
    with pytest.raises(ValueError, match="B=1"):  # another batch
        MultiHeadAttention(32, 8, num_kv_heads=2)(x[:1], x[:1], x[:1], kv_cache=other)

    torch.manual_seed(0)
    small, wide = CausalLM(7, 16, 2, 1, max_len=16), CausalLM(7, 32, 2, 1, max_len=16)
    cache = KVCache()
    small(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="kv_cache holds"):
        wide(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="layers"):
        CausalLM(7, 16, 2, 2, max_len=16)(torch.zeros(1, 1, dtype=torch.long), cache=cache)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_hook_on_an_inner_attention_layer_sees_a_public_call(backend) -> None:
    torch.manual_seed(4)
    model = CausalLM(9, 32, 4, 2, max_len=16, positional="rope", num_kv_heads=2,
                     backend=backend).eval()  # fmt: skip
    attention = model.blocks.layers[1].self_attn
    seen = []

    def hook(module, args, kwargs, output):
        seen.append((args, kwargs, output))

    handle = attention.register_forward_hook(hook, with_kwargs=True)
    tokens = torch.randint(9, (2, 6))
    with torch.no_grad():
        model(tokens)  # no cache
        cache = KVCache()
        model(tokens[:, :4], cache=cache)
        cache_before = [layer.key.clone() for layer in cache.layers]
        model(tokens[:, 4:], cache=cache)
    handle.remove()
    assert len(seen) == 3
    # The hook received ordinary public arguments: calling the layer with them gives
    # exactly the output the model got (the cached call with a copy of the cache).
    with torch.no_grad():
        for args, kwargs, output in seen[:2]:
            kwargs = dict(kwargs)
            if kwargs.get("kv_cache") is not None:
                kwargs["kv_cache"] = LayerKVCache()
            assert torch.equal(attention(*args, **kwargs), output)
        args, kwargs, output = seen[2]
        replay = LayerKVCache()
        replay.update(cache_before[1], cache.layers[1].value[:, :, :4].clone())
        kwargs = {**kwargs, "kv_cache": replay}
        assert torch.equal(attention(*args, **kwargs), output)


def test_rope_positions_per_sequence() -> None:
    # RoPE scores depend on relative positions only: shifting a sequence's positions
    # (B, L) leaves its output unchanged, and the positions reach the rotation.
    mha = _mha("lib", rope_base=100.0)
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    shifted = torch.stack([torch.arange(5), torch.arange(7, 12)])  # (B, L)
    with torch.no_grad():
        plain = mha(x, x, x, is_causal=True)
        moved = mha(x, x, x, is_causal=True, positions=shifted)
        _, weights = mha(x, x, x, is_causal=True, positions=shifted * 3, need_weights=True)
        _, plain_weights = mha(x, x, x, is_causal=True, need_weights=True)
    torch.testing.assert_close(moved, plain, atol=1e-12, rtol=0)
    assert not torch.allclose(weights[1], plain_weights[1])  # 3x the distances: other scores
    with pytest.raises(ValueError, match="positions"):
        mha(x, x, x, positions=torch.arange(4))
    with pytest.raises(ValueError, match="length"):
        mha(x, x[:, :3], x[:, :3], positions=torch.arange(5))
    with pytest.raises(TypeError, match="positions"):
        mha(x, x, x, positions=torch.arange(5.0))
