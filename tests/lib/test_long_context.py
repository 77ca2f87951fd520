"""Tests for long-context attention: chunked masks, per-layer types (full, sliding,
chunked) with their own caches, NoPE layers, and their parity with 🤗 transformers."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import Gemma2Config, Gemma3TextConfig, Llama4TextConfig
from transformers.masking_utils import (
    chunked_causal_mask_function,
    sliding_window_causal_mask_function,
)

from attention_lib import CausalLM, KVCache, LayerKVCache, causal_mask
from attention_lib.convert import layer_options_from_hf
from attention_lib.kv_cache import ChunkKVCache
from attention_lib.layer_types import LAYER_TYPES, LayerType
from attention_lib.mha import MultiHeadAttention

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize("chunk", [1, 3, 4])
@pytest.mark.parametrize("past,q_len", [(0, 10), (0, 1), (5, 1), (6, 3), (8, 7)])
def test_chunked_mask_equals_transformers(chunk: int, past: int, q_len: int, hf_sdpa_mask) -> None:
    # Our cache of a chunked layer starts at a chunk: `past` seen, `past // c * c` dropped.
    dropped = past // chunk * chunk
    stored = past - dropped
    ours = causal_mask(q_len, stored + q_len, offset=stored, chunk=chunk)
    function = chunked_causal_mask_function(chunk, torch.zeros(1, dtype=torch.long))
    theirs = hf_sdpa_mask(function, q_len, stored + q_len, q_offset=past, kv_offset=dropped)
    assert torch.equal(ours, theirs)
    # ... and with every key kept (a full cache): the chunks count from key 0
    full = causal_mask(q_len, past + q_len, offset=past, chunk=chunk)
    assert torch.equal(full, hf_sdpa_mask(function, q_len, past + q_len, past, 0))


@pytest.mark.parametrize("window", [1, 2, 5])
@pytest.mark.parametrize("past,q_len", [(0, 9), (4, 1), (7, 4)])
def test_sliding_mask_equals_transformers(window: int, past: int, q_len: int, hf_sdpa_mask) -> None:
    ours = causal_mask(q_len, past + q_len, offset=past, window=window)
    function = sliding_window_causal_mask_function(window)
    assert torch.equal(ours, hf_sdpa_mask(function, q_len, past + q_len, past, 0))


def test_chunk_and_window_keep_what_both_keep() -> None:
    both = causal_mask(9, window=3, chunk=4)
    assert torch.equal(both, causal_mask(9, window=3) & causal_mask(9, chunk=4))
    assert both.sum() == 9 + 2 * 6 - 2  # each row: itself, + up to 2 back within its chunk


def test_gemma3_and_llama4_layer_patterns() -> None:
    gemma3 = layer_options_from_hf(Gemma3TextConfig(num_hidden_layers=6, sliding_window=4))
    assert gemma3["layer_types"] == ["sliding"] * 5 + ["full"]
    assert (gemma3["window"], gemma3["chunk_size"], gemma3["nope_layers"]) == (4, None, [])
    gemma2 = layer_options_from_hf(Gemma2Config(num_hidden_layers=4, sliding_window=3))
    assert gemma2["layer_types"] == ["sliding", "full"] * 2
    llama4 = layer_options_from_hf(Llama4TextConfig(num_hidden_layers=8, attention_chunk_size=5))
    assert llama4["layer_types"] == (["chunked"] * 3 + ["full"]) * 2
    assert (llama4["chunk_size"], llama4["nope_layers"]) == (5, [3, 7])
    model = CausalLM(13, 16, 2, 6, max_len=32, positional="rope", **gemma3)
    assert [layer.self_attn.window for layer in model.blocks.layers] == [4] * 5 + [None]
    model = CausalLM(13, 16, 2, 8, max_len=32, positional="rope", **llama4)
    attentions = [layer.self_attn for layer in model.blocks.layers]
    assert [a.chunk_size for a in attentions] == [5, 5, 5, None] * 2
    assert [a.rope_base for a in attentions] == [10000.0] * 3 + [None] + [10000.0] * 3 + [None]


def test_layer_options_refuse_what_is_not_computed() -> None:
    config = Gemma3TextConfig(num_hidden_layers=2)
    config.layer_types = ["linear_attention", "full_attention"]
    with pytest.raises(ValueError, match="linear_attention"):
        layer_options_from_hf(config)


MIXED = {
    "layer_types": ["full", "sliding", "chunked", "sliding", "chunked"],
    "window": 3,
    "chunk_size": 4,
}


@pytest.mark.parametrize("backend", ["lib", "torch", "tiled"])
@pytest.mark.parametrize("positional", ["rope", "learned"])
@pytest.mark.parametrize("prefill", [1, 4, 9])
def test_prefill_and_decode_through_the_cache_equal_the_full_pass(
    backend: str, positional: str, prefill: int
) -> None:
    torch.manual_seed(0)
    model = CausalLM(
        11, 32, 4, 5, max_len=64, positional=positional, backend=backend, **MIXED
    ).eval()
    model.blocks.layers[3].self_attn.backend = "lib"  # backends mixed within a model too
    tokens = torch.randint(0, 11, (2, 22))
    with torch.no_grad():
        full = model(tokens)
        cache = KVCache()
        steps = [model(tokens[:, :prefill], cache=cache)]
        steps += [model(tokens[:, i : i + 2], cache=cache) for i in range(prefill, 22, 2)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=2e-5, rtol=1e-5)
    # each layer keeps only what it can see: 22 tokens, window 3, chunk 4 (20 .. 21)
    assert [len(layer) for layer in cache.layers] == [22, 3, 2, 3, 2]
    assert [type(layer) for layer in cache.layers] == [LayerKVCache] * 2 + [ChunkKVCache] + [
        LayerKVCache,
        ChunkKVCache,
    ]
    assert (cache.position, len(cache)) == (22, 22)


def test_the_chunked_cache_starts_each_chunk_empty() -> None:
    cache = ChunkKVCache(3)
    sizes = []
    for _ in range(7):
        key = torch.randn(1, 1, 1, 2)
        returned, _ = cache.update(key, key)
        sizes.append((returned.shape[-2], len(cache), cache.dropped))
    assert sizes == [(1, 1, 0), (2, 2, 0), (3, 0, 3), (1, 1, 3), (2, 2, 3), (3, 0, 6), (1, 1, 6)]


def test_a_chunked_model_with_a_sliding_window_cache_of_one_layer_is_refused() -> None:
    attention = MultiHeadAttention(8, 2, chunk_size=4)
    cache = LayerKVCache(window=3)
    x = torch.randn(1, 5, 8)
    with pytest.raises(ValueError, match="start a chunk"):
        for i in range(5):  # the rolling cache drops 2 keys: its keys no longer start a chunk
            attention(
                x[:, i : i + 1], x[:, i : i + 1], x[:, i : i + 1], is_causal=True, kv_cache=cache
            )
    with pytest.raises(ValueError, match="is_causal"):
        attention(x, x, x)


def test_layer_types_refuse_missing_spans_and_foreign_caches() -> None:
    with pytest.raises(ValueError, match="window"):
        CausalLM(11, 16, 2, 2, layer_types=["full", "sliding"])
    with pytest.raises(ValueError, match="chunk_size"):
        CausalLM(11, 16, 2, 2, layer_types=["chunked", "full"], window=2)
    with pytest.raises(ValueError, match="one layer type per layer"):
        CausalLM(11, 16, 2, 3, layer_types=["full", "full"])
    with pytest.raises(ValueError, match="layer type"):
        CausalLM(11, 16, 2, 2, layer_types=["full", "global"])
    model = CausalLM(11, 16, 2, 2, **{**MIXED, "layer_types": ["full", "chunked"]}).eval()
    tokens = torch.randint(0, 11, (1, 5))
    for cache in (KVCache(window=3), KVCache(window=3, sink_tokens=1)):
        with pytest.raises(ValueError, match="layer_types"):
            model(tokens, cache=cache)
    other = CausalLM(11, 16, 2, 2, layer_types=["full", "sliding"], window=3).eval()
    cache = KVCache()
    other(tokens, cache=cache)
    with pytest.raises(ValueError, match="layer_types"):
        model(tokens, cache=cache)  # a cache filled by a model of other layer types


def test_need_weights_through_caches_of_different_spans_is_refused() -> None:
    model = CausalLM(11, 16, 2, 2, layer_types=["full", "sliding"], window=2).eval()
    tokens = torch.randint(0, 11, (1, 6))
    _, weights = model(tokens, need_weights=True)  # without a cache: all (L, L)
    assert weights.shape == (1, 2, 2, 6, 6)
    assert weights[0, 1, :, 5, :4].abs().sum() == 0  # the sliding layer: the last 2 only
    cache = KVCache()
    model(tokens, cache=cache)
    with pytest.raises(ValueError, match="different numbers of keys"):
        model(tokens[:, :1], cache=cache, need_weights=True)


def test_each_attention_type_takes_only_its_own_span() -> None:
    # the cache parity above cannot see this: a full layer given the window would
    # mask its full pass and its cached pass alike
    model = CausalLM(
        11, 16, 2, 3, layer_types=["full", "sliding", "chunked"], window=3, chunk_size=4
    )
    spans = [(layer.self_attn.window, layer.self_attn.chunk_size) for layer in model.blocks.layers]
    assert spans == [(None, None), (3, None), (None, 4)]


def test_layer_types_none_keeps_every_layer_alike() -> None:
    model = CausalLM(11, 16, 2, 3, window=4)
    assert [layer.self_attn.window for layer in model.blocks.layers] == [4, 4, 4]
    assert model.window == 4 and model.layer_types is None


def test_nope_layers_drop_rope_and_keep_cache_parity() -> None:
    torch.manual_seed(3)
    options = {"positional": "rope", "layer_types": ["chunked", "full"], "chunk_size": 3}
    model = CausalLM(11, 16, 2, 2, max_len=32, nope_layers=[1], **options).eval()
    assert [layer.self_attn.rope_base for layer in model.blocks.layers] == [10000.0, None]
    roped = CausalLM(11, 16, 2, 2, max_len=32, **options).eval()
    roped.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 11, (2, 10))
    with torch.no_grad():
        full = model(tokens)
        assert not torch.allclose(full, roped(tokens), atol=1e-3)  # NoPE is another model
        cache = KVCache()
        steps = [model(tokens[:, i : i + 1], cache=cache) for i in range(10)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=2e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="nope_layers"):
        CausalLM(11, 16, 2, 2, nope_layers=[2])


def test_a_registered_layer_type_builds_its_own_mixer_and_cache(monkeypatch) -> None:
    # A new type is one more table entry: here a "local" type whose mixer is a
    # windowed attention of its own width and whose cache is a rolling one.
    def local(d_model, num_heads, *, dropout, window=None, chunk_size=None, **attention):
        return MultiHeadAttention(d_model, num_heads, dropout, window=2, **attention)

    monkeypatch.setitem(LAYER_TYPES, "local", LayerType(local, lambda m: LayerKVCache(window=2)))
    torch.manual_seed(4)
    model = CausalLM(11, 16, 2, 2, max_len=32, layer_types=["local", "full"]).eval()
    reference = CausalLM(11, 16, 2, 2, max_len=32, layer_types=["sliding", "full"], window=2)
    reference.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 11, (1, 9))
    cache = KVCache()
    with torch.no_grad():
        steps = torch.cat([model(tokens[:, i : i + 1], cache=cache) for i in range(9)], 1)
        torch.testing.assert_close(steps, reference.eval()(tokens), atol=2e-5, rtol=1e-5)
    assert [len(layer) for layer in cache.layers] == [2, 9]


# --- RoPE scaling -----------------------------------------------------------------------

SCALINGS = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 32},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    "yarn-deepseek": {  # DeepSeek's mscale / mscale_all_dim, no truncation, other betas
        "rope_type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 64,
        "mscale": 1.0,
        "mscale_all_dim": 0.707,
        "beta_fast": 16.0,
        "beta_slow": 2.0,
        "truncate": False,
    },
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
}


def _llama_config(scaling: dict, base: float, d_head: int = 32, max_len: int = 32):
    from transformers import LlamaConfig

    rope = {**scaling, "rope_theta": base}
    return LlamaConfig(
        hidden_size=4 * d_head,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=max_len,  # dynamic's original length in transformers
        rope_parameters=rope,
    )


@pytest.mark.parametrize("name", SCALINGS)
@pytest.mark.parametrize("base", [10000.0, 500000.0])
@pytest.mark.parametrize("seq_len", [None, 20, 200])
def test_rope_frequencies_equal_transformers_init_functions(name, base, seq_len) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from attention_lib import rope_frequencies

    scaling = SCALINGS[name]
    config = _llama_config(scaling, base)
    kind = scaling["rope_type"]
    if kind == "default":
        theirs, their_factor = 1.0 / base ** (torch.arange(0, 32, 2).double() / 32), 1.0
    else:
        theirs, their_factor = ROPE_INIT_FUNCTIONS[kind](config, "cpu", seq_len=seq_len)
    omega, factor = rope_frequencies(32, base=base, scaling=scaling, seq_len=seq_len)
    torch.testing.assert_close(omega, theirs.double(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(their_factor, rel=1e-6)
    if kind in ("yarn", "linear", "llama3"):  # the slowest pair is slowed down
        assert omega[-1] < rope_frequencies(32, base=base)[0][-1] * 0.9


@pytest.mark.parametrize("name", SCALINGS)
@pytest.mark.parametrize("length", [24, 100])
def test_apply_rope_equals_the_llama_rotary_embedding(name, length) -> None:
    from transformers.models.llama.modeling_llama import (
        LlamaRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    from attention_lib import apply_rope

    torch.manual_seed(5)
    scaling = SCALINGS[name]
    rotary = LlamaRotaryEmbedding(_llama_config(scaling, 10000.0))  # fresh, one call: as a model
    q, k = torch.randn(2, 4, length, 32), torch.randn(2, 4, length, 32)
    positions = torch.arange(length)[None].expand(2, -1)  # (B, L)
    cos, sin = rotary(q, positions)  # the attention factor multiplies cos and sin
    their_q, their_k = apply_rotary_pos_emb(q, k, cos, sin)
    ours_q = apply_rope(q, positions[:, None], scaling=scaling)  # (B, 1, L) per sequence
    ours_k = apply_rope(k, torch.arange(length), scaling=scaling)
    torch.testing.assert_close(ours_q, their_q, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ours_k, their_k, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["linear", "yarn", "llama3"])
def test_scaled_rope_keeps_cache_parity(name) -> None:
    torch.manual_seed(6)
    model = CausalLM(
        11, 32, 2, 2, max_len=128, positional="rope", rope_scaling=SCALINGS[name]
    ).eval()
    assert model.blocks.layers[0].self_attn.rope_scaling == SCALINGS[name]
    tokens = torch.randint(0, 11, (1, 70))
    with torch.no_grad():
        full = model(tokens)
        cache = KVCache()
        steps = [model(tokens[:, :40], cache=cache)]
        steps += [model(tokens[:, i : i + 1], cache=cache) for i in range(40, 70)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=2e-5, rtol=1e-5)
    plain = CausalLM(11, 32, 2, 2, max_len=128, positional="rope").eval()
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert (plain(tokens) - full).abs().max() > 1e-3  # the scaling changes the model


def test_dynamic_scaling_is_refused_with_a_cache_and_bad_scalings_are_refused() -> None:
    from attention_lib import apply_rope, rope_frequencies

    model = CausalLM(11, 16, 2, 1, positional="rope", rope_scaling=SCALINGS["dynamic"]).eval()
    tokens = torch.randint(0, 11, (1, 40))
    model(tokens)  # one pass: the length of the call sets the base
    with pytest.raises(ValueError, match="dynamic"):
        model(tokens, cache=KVCache())
    bad = [
        ({"rope_type": "ntk"}, ValueError, "rope_type"),
        ({"rope_type": "linear"}, ValueError, "factor"),
        ({"rope_type": "linear", "factor": 2.0, "beta_fast": 4}, ValueError, "linear"),
        ({"rope_type": "linear", "factor": 2.0, "rope_theta": 5.0}, ValueError, "base"),
        ([("rope_type", "linear")], TypeError, "dict"),
    ]
    for scaling, error, words in bad:
        with pytest.raises(error, match=words):
            rope_frequencies(8, scaling=scaling)
        with pytest.raises(error, match=words):
            apply_rope(torch.randn(1, 3, 8), scaling=scaling)
    with pytest.raises(ValueError, match="rope_base"):
        MultiHeadAttention(16, 2, rope_scaling=SCALINGS["linear"])


def test_nope_layers_drop_the_rope_scaling_too() -> None:
    model = CausalLM(
        11, 16, 2, 2, positional="rope", rope_scaling=SCALINGS["yarn"], nope_layers=[0]
    )
    attentions = [layer.self_attn for layer in model.blocks.layers]
    assert [(a.rope_base, a.rope_scaling) for a in attentions] == [
        (None, None),
        (10000.0, SCALINGS["yarn"]),
    ]


def test_tiled_attention_visits_only_the_tiles_of_each_chunk() -> None:
    # 64 queries and keys in chunks of 16, tiles of 8: each chunk is a 2x2 grid of
    # tiles whose lower triangle (3 tiles) is visited; causal alone would visit 36.
    # The tiles visited are read by a profiler (the tile mask of each tile is asked
    # for once), without patching anything.
    import sys

    import torch.nn.functional as F

    from attention_lib import tiled as tiled_module
    from attention_lib.masks import Causal

    torch.manual_seed(7)
    q, k, v = (torch.randn(2, 3, 64, 8, dtype=torch.float64, requires_grad=True) for _ in "qkv")
    visited = []

    def profile(frame, event, arg):
        code = frame.f_code
        if (
            event == "call"
            and code.co_name == "keep_tile"
            and code.co_filename == tiled_module.__file__
        ):
            visited.append(
                tuple(frame.f_locals[n] for n in ("q_start", "q_end", "k_start", "k_end"))
            )

    options = {"dropout_p": 0.0, "scale": None, "block_size": (8, 8)}
    sys.setprofile(profile)
    try:
        out = tiled_module.tiled_core(q, k, v, None, causal=Causal(0, None, 16), **options)
    finally:
        sys.setprofile(None)
    forward = len(visited)
    mask = causal_mask(64, chunk=16)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)
    assert forward == 4 * 3
    assert all(k0 // 16 == (q1 - 1) // 16 for q0, q1, k0, k1 in visited)  # within a chunk
    grad = torch.randn_like(out)
    sys.setprofile(profile)
    try:
        ours = torch.autograd.grad(out, (q, k, v), grad)
    finally:
        sys.setprofile(None)
    theirs = torch.autograd.grad(expected, (q, k, v), grad)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    assert len(visited) == 2 * forward  # the backward pass recomputes the same tiles


def test_chunked_layers_refuse_a_padding_mask() -> None:
    # A left-padded row's chunks start at its first real token in transformers
    # (chunked_overlay's left_padding); ours would start at the padding: refused.
    model = CausalLM(11, 16, 2, 2, layer_types=["chunked", "full"], chunk_size=4).eval()
    tokens = torch.randint(0, 11, (2, 6))
    mask = torch.tensor([[True] * 6, [False] * 2 + [True] * 4])
    with pytest.raises(ValueError, match="chunked"):
        model(tokens, mask=mask)
    sliding = CausalLM(11, 16, 2, 2, layer_types=["sliding", "full"], window=3).eval()
    assert sliding(tokens, mask=mask).shape == (2, 6, 11)  # windows count key indices
