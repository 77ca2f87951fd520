"""Sinks, soft-capping, QK-norm and output gates (chapter 15's options).

The converters' tests (test_convert.py) check them against the transformers layers
that introduced them (gpt-oss sinks, Gemma 2 soft-capping, Qwen3 QK-norm); here:
what each computes, cache parity, and the backends that refuse what they cannot do.
"""

from __future__ import annotations

import pytest
import torch

from attention_lib import LayerKVCache, MultiHeadAttention, scaled_dot_product_attention

torch.manual_seed(0)
Q, K, V = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)


def test_a_sink_is_a_virtual_key_with_a_zero_value() -> None:
    sink = torch.tensor([0.0, 2.0, -1.0])  # one logit per head
    out, weights = scaled_dot_product_attention(Q, K, V, sink=sink)
    scores = Q @ K.transpose(-2, -1) / 8**0.5  # (B, H, Lq, Lk)
    extended = torch.cat([scores, sink[:, None, None].expand(2, 3, 4, 1)], -1)
    expected = extended.softmax(-1)[..., :-1]  # the sink's share is dropped
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(out, expected @ V)
    assert bool((weights.sum(-1) < 1).all())
    # a row with every key masked puts all its weight on the sink: a zero output
    keep = torch.ones(4, 6, dtype=torch.bool)
    keep[1] = False
    out, weights = scaled_dot_product_attention(Q, K, V, keep, sink=sink)
    assert torch.equal(weights[..., 1, :], torch.zeros(2, 3, 6))
    assert torch.equal(out[..., 1, :], torch.zeros(2, 3, 8))


def test_soft_capping_bounds_the_scores_before_the_mask() -> None:
    out, weights = scaled_dot_product_attention(Q * 30, K, V, softcap=2.0, is_causal=True)
    scores = 2.0 * torch.tanh((Q * 30) @ K.transpose(-2, -1) / 8**0.5 / 2.0)
    mask = torch.ones(4, 6, dtype=torch.bool).tril()  # top-left: query i sees keys 0..i
    torch.testing.assert_close(weights, scores.masked_fill(~mask, float("-inf")).softmax(-1))
    assert out.shape == (2, 3, 4, 8)
    # capped scores lie in [-2, 2]: within a row, weights differ by at most e^4
    seen = weights[..., -1, :4]  # the last query sees keys 0..3
    assert float((seen.max(-1).values / seen.min(-1).values).max()) <= torch.e**4 * 1.0001


@pytest.mark.parametrize(
    "bad,error",
    [
        ({"softcap": 0.0}, ValueError),
        ({"softcap": "2"}, TypeError),
        ({"sink": torch.zeros(4)}, ValueError),  # 4 heads for 3
        ({"sink": torch.zeros(3, dtype=torch.float64)}, TypeError),
        ({"sink": [0.0, 0.0, 0.0]}, TypeError),
    ],
)
def test_bad_sink_and_softcap_are_refused(bad, error) -> None:
    with pytest.raises(error, match=next(iter(bad))):
        scaled_dot_product_attention(Q, K, V, **bad)


def test_fused_and_tiled_backends_refuse_sinks_and_soft_capping() -> None:
    for backend in ("torch", "tiled"):
        for option in ({"sink": True}, {"softcap": 30.0}):
            with pytest.raises(ValueError, match="backend='lib' only"):
                MultiHeadAttention(16, 2, backend=backend, **option)
    mha = MultiHeadAttention(16, 2, sink=True)
    with pytest.raises(ValueError, match="backend='lib' only"):
        mha.backend = "torch"
    assert mha.backend == "lib"


def test_qk_norm_gives_every_head_unit_rms_before_rope() -> None:
    torch.manual_seed(1)
    mha = MultiHeadAttention(32, 4, qk_norm=True, rope_base=100.0).eval()
    x = torch.randn(2, 5, 32) * 50  # large inputs: logits would grow without the norm
    q = mha.W_q(x).view(2, 5, 4, 8).transpose(1, 2)  # (B, H, L, d_k)
    normed = mha.q_norm(q)
    rms = normed.pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones_like(rms), atol=1e-4, rtol=0)
    _, weights = mha(x, x, x, need_weights=True)
    assert bool((weights.max(-1).values < 1 - 1e-3).all())  # not saturated


def test_the_gate_scales_the_heads_output_from_the_layers_input() -> None:
    """A reference written from Qwen3-Next's attention: the heads' output times
    sigmoid(gate(x)), then o_proj."""
    torch.manual_seed(2)
    gated = MultiHeadAttention(16, 2, gate=True).eval()
    plain = MultiHeadAttention(16, 2).eval()
    plain.load_state_dict(gated.state_dict(), strict=False)
    x = torch.randn(2, 5, 16)
    merged = []  # the ungated heads' output, as W_o receives it
    plain.W_o.register_forward_pre_hook(lambda module, args: merged.append(args[0]))
    with torch.no_grad():
        plain(x, x, x, is_causal=True)
        expected = plain.W_o(merged[0] * torch.sigmoid(gated.W_g(x)))  # (B, L, d)
        torch.testing.assert_close(gated(x, x, x, is_causal=True), expected, atol=1e-6, rtol=0)


CHUNKS = (5, 1, 1, 3, 1)


@pytest.mark.parametrize(
    "backend,options",
    [
        ("lib", {"sink": True}),
        ("lib", {"softcap": 3.0, "window": 4}),
        ("lib", {"sink": True, "softcap": 3.0, "qk_norm": True, "gate": True, "rope_base": 50.0}),
        *[
            (b, {"qk_norm": True, "gate": True, "num_kv_heads": 2})
            for b in ("lib", "torch", "tiled")
        ],
    ],
)
def test_every_option_keeps_cache_parity(backend, options) -> None:
    torch.manual_seed(3)
    mha = MultiHeadAttention(32, 4, backend=backend, dtype=torch.float64, **options).eval()
    with torch.no_grad():
        if mha.sink is not None:
            mha.sink.normal_()
    x = torch.randn(2, sum(CHUNKS), 32, dtype=torch.float64)
    with torch.no_grad():
        full = mha(x, x, x, is_causal=True)
        cache, parts, start = LayerKVCache(), [], 0
        for n in CHUNKS:
            chunk = x[:, start : start + n]
            parts.append(mha(chunk, chunk, chunk, is_causal=True, kv_cache=cache))
            start += n
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-12, rtol=0)


def test_a_streaming_cache_keeps_the_sinks_and_the_last_window() -> None:
    cache = LayerKVCache(window=3, sink_tokens=2)
    for p in range(10):  # one position at a time; the key holds its position
        cache.update(torch.full((1, 1, 1, 1), float(p)), torch.zeros(1, 1, 1, 1))
    assert cache.key.flatten().tolist() == [0, 1, 7, 8, 9] and cache.position == 10
    with pytest.raises(ValueError, match="window"):
        LayerKVCache(sink_tokens=2)
    with pytest.raises(ValueError, match="sink_tokens"):
        LayerKVCache(window=3, sink_tokens=-1)


@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_streaming_llm_attends_to_the_sinks_and_the_recent_window(positional) -> None:
    """A model without a window and KVCache(window=w, sink_tokens=s): after the
    prompt, token p attends to tokens 0..s-1 and p-w..p (StreamingLLM)."""
    from attention_lib import CausalLM, KVCache, causal_mask

    torch.manual_seed(4)
    model = CausalLM(13, 32, 4, 2, max_len=40, positional=positional).eval().double()
    tokens, prompt, w, s = torch.randint(13, (2, 20)), 5, 4, 2
    with torch.no_grad():
        cache = KVCache(window=w, sink_tokens=s)
        steps = [model(tokens[:, :prompt], cache=cache)]
        steps += [model(tokens[:, p : p + 1], cache=cache) for p in range(prompt, 20)]
        streamed = torch.cat(steps, 1)
        keep = causal_mask(20)
        keep[prompt:] &= causal_mask(20, window=w + 1)[prompt:] | (torch.arange(20) < s)
        # the same model in one pass, every layer under the StreamingLLM mask
        for layer in model.blocks.layers:
            layer.self_attn.register_forward_pre_hook(
                lambda m, args, kwargs: (args[:1] * 3 + (keep,), {"is_causal": False}),
                with_kwargs=True,
            )
        reference = model(tokens)
    assert len(cache) == s + w and cache.position == 20
    torch.testing.assert_close(streamed, reference, atol=1e-10, rtol=0)
    windowed = CausalLM(13, 32, 4, 2, max_len=40, window=4)
    with pytest.raises(ValueError, match="sink_tokens"):
        windowed(tokens[:, :3], cache=KVCache(window=4, sink_tokens=2))


def test_models_pass_the_options_to_every_attention_layer() -> None:
    from attention_lib import CausalLM, KVCache

    torch.manual_seed(5)
    options = {"qk_norm": True, "sink": True, "gate": True, "softcap": 20.0}
    model = CausalLM(11, 32, 4, 2, max_len=20, positional="rope", **options).eval().double()
    attention = model.blocks.layers[1].self_attn
    assert attention.q_norm is not None and attention.sink is not None
    assert attention.W_g is not None and attention.softcap == 20.0
    tokens = torch.randint(11, (2, 9))
    with torch.no_grad():
        cache = KVCache()
        steps = [model(tokens[:, :4], cache=cache)] + [
            model(tokens[:, p : p + 1], cache=cache) for p in range(4, 9)
        ]
        torch.testing.assert_close(torch.cat(steps, 1), model(tokens), atol=1e-10, rtol=0)


def _stream(model, tokens, cache, chunk=1):
    """Feed ``tokens`` ``chunk`` at a time at the cache's positions; the logits."""
    with torch.no_grad():
        return torch.cat(
            [
                model(tokens[:, t : t + chunk], cache=cache, positions=cache.positions(chunk))
                for t in range(0, tokens.shape[1], chunk)
            ],
            1,
        )


@pytest.mark.parametrize("sinks, window", [(0, 5), (1, 4), (3, 6)])
def test_streaming_cache_equals_a_fresh_run_on_the_kept_tokens(sinks, window) -> None:
    """StreamingLLM at cache positions: a one-layer RoPE model fed one token at
    a time gives, at every step, the logits of the model run from scratch on the
    sinks and the window at positions 0, 1, ... (its keys depend on the token
    alone); the cached keys are exactly those of the kept tokens at those places."""
    from attention_lib import CausalLM, StreamingKVCache, apply_rope

    torch.manual_seed(6)
    model = CausalLM(13, 32, 4, 1, max_len=40, positional="rope").eval().double()
    tokens = torch.randint(13, (2, 30))
    cache = StreamingKVCache(keep_last=window, sink_tokens=sinks, rope_base=10000.0)
    streamed = _stream(model, tokens, cache)
    with torch.no_grad():
        for t in range(30):
            kept = torch.cat(
                [tokens[:, : min(sinks, t + 1)], tokens[:, max(sinks, t - window) : t + 1]], 1
            )
            torch.testing.assert_close(streamed[:, t], model(kept)[:, -1], atol=1e-12, rtol=0)
        attn = model.blocks.layers[0].self_attn
        kept = torch.cat([tokens[:, :sinks], tokens[:, -window:]], 1)  # what the cache holds
        h = model.blocks.layers[0].norm1(model.embedding(kept))  # (B, s + w, d)
        k = attn.W_k(h).view(2, -1, attn.num_kv_heads, attn.d_k).transpose(1, 2)
    torch.testing.assert_close(cache.layers[0].key, apply_rope(k), atol=1e-12, rtol=0)
    assert len(cache) == sinks + window and cache.position == 30
    assert cache.positions(2).tolist() == [sinks + window, sinks + window + 1]


def test_streaming_cache_in_chunks_and_with_two_layers() -> None:
    """Chunks of 3 tokens give the same logits as one token at a time whenever no
    key a chunk's first queries need has been dropped (no window: a full cache at
    positions 0, 1, ... is a plain cache); two layers differ from a fresh run."""
    from attention_lib import CausalLM, KVCache, StreamingKVCache

    torch.manual_seed(7)
    model = CausalLM(13, 32, 4, 2, max_len=64, positional="rope").eval().double()
    tokens = torch.randint(13, (2, 24))
    big = StreamingKVCache(keep_last=64, sink_tokens=0, rope_base=10000.0)
    with torch.no_grad():
        torch.testing.assert_close(
            _stream(model, tokens, big, chunk=3), model(tokens), atol=1e-12, rtol=0
        )
        small = StreamingKVCache(keep_last=4, sink_tokens=1, rope_base=10000.0)
        streamed = _stream(model, tokens, small)
        kept = torch.cat([tokens[:, :1], tokens[:, -5:]], 1)
        assert (streamed[:, -1] - model(kept)[:, -1]).abs().max() > 1e-6
        # at text positions (KVCache) the keys stay put: the last query is at 23
        plain = KVCache(window=4, sink_tokens=1)
        text = torch.cat([model(tokens[:, t : t + 1], cache=plain) for t in range(24)], 1)
    assert (text[:, -1] - streamed[:, -1]).abs().max() > 1e-6  # the sink is 23 away, not 5


def test_streaming_cache_refuses_bad_sizes() -> None:
    from attention_lib import StreamingKVCache

    with pytest.raises(ValueError, match="keep_last"):
        StreamingKVCache(keep_last=0, sink_tokens=1, rope_base=10000.0)
    with pytest.raises(ValueError, match="sink_tokens"):
        StreamingKVCache(keep_last=4, sink_tokens=-1, rope_base=10000.0)
    with pytest.raises(TypeError, match="keep_last"):
        StreamingKVCache(keep_last=4.0, sink_tokens=1, rope_base=10000.0)
    with pytest.raises((TypeError, ValueError), match="base"):
        StreamingKVCache(keep_last=4, sink_tokens=1, rope_base=1.0)
    with pytest.raises(ValueError, match="length"):
        StreamingKVCache(keep_last=4, sink_tokens=1, rope_base=10000.0).positions(0)
