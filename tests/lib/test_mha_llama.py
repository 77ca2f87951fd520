"""Chapter 10's MultiHeadAttention: grouped-query attention, RoPE, and parity with
🤗 transformers' LlamaAttention (tiny configs, random weights, nothing downloaded)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.masking_utils import eager_mask, sdpa_mask
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

from attention_lib import (
    CausalLM,
    KVCache,
    LayerKVCache,
    MultiHeadAttention,
    apply_rope,
    causal_mask,
    kv_cache_bytes,
    padding_mask,
)

D_MODEL, HEADS, D_K = 64, 8, 8


def split(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.unflatten(-1, (heads, D_K)).transpose(1, 2)  # (B, heads, L, d_k)


def by_sdpa(
    m: MultiHeadAttention, x: torch.Tensor, mem: torch.Tensor, **sdpa_kwargs
) -> torch.Tensor:
    """The module's function written with F.scaled_dot_product_attention(enable_gqa=True)."""
    q = split(m.W_q(x), HEADS)
    k, v = split(m.W_k(mem), m.num_kv_heads), split(m.W_v(mem), m.num_kv_heads)
    if m.rope_base is not None:
        q, k = apply_rope(q, base=m.rope_base), apply_rope(k, base=m.rope_base)
    out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **sdpa_kwargs)
    return m.W_o(out.transpose(1, 2).flatten(2))  # (B, Lq, d_model)


@pytest.mark.parametrize("backend", ["lib", "torch", "tiled"])
@pytest.mark.parametrize("num_kv_heads", [8, 4, 2, 1])
@pytest.mark.parametrize("rope_base", [None, 10000.0])
def test_gqa_equals_sdpa_enable_gqa(backend, num_kv_heads, rope_base):
    torch.manual_seed(0)
    m = MultiHeadAttention(
        D_MODEL, HEADS, num_kv_heads=num_kv_heads, rope_base=rope_base, backend=backend
    ).eval()
    assert m.W_k.weight.shape == m.W_v.weight.shape == (num_kv_heads * D_K, D_MODEL)
    x = torch.randn(2, 9, D_MODEL)
    with torch.no_grad():
        torch.testing.assert_close(
            m(x, x, x, is_causal=True), by_sdpa(m, x, x, is_causal=True), atol=1e-5, rtol=0
        )
        mem = torch.randn(2, 5, D_MODEL)  # cross-attention, another length
        torch.testing.assert_close(m(x, mem, mem), by_sdpa(m, x, mem), atol=1e-5, rtol=0)


def test_query_head_h_reads_kv_head_h_over_group():
    """Rebuild each query head alone against its KV head h // (H / H_kv)."""
    torch.manual_seed(1)
    m = MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=2).eval()
    x = torch.randn(1, 6, D_MODEL)
    with torch.no_grad():
        _, weights = m(x, x, x, need_weights=True)  # (B, H, L, L)
        q, k = split(m.W_q(x), HEADS), split(m.W_k(x), 2)
        for h in range(HEADS):
            scores = q[:, h] @ k[:, h // 4].transpose(-2, -1) / D_K**0.5
            torch.testing.assert_close(weights[:, h], scores.softmax(-1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("mask_kind", ["2d", "per_batch", "per_head", "padding"])
def test_gqa_masks_broadcast_over_the_groups(mask_kind):
    torch.manual_seed(2)
    m = MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=2).eval()
    x = torch.randn(2, 7, D_MODEL)
    g = torch.Generator().manual_seed(3)
    mask = {
        "2d": torch.rand(7, 7, generator=g) > 0.3,
        "per_batch": torch.rand(2, 1, 7, 7, generator=g) > 0.3,
        "per_head": torch.rand(2, HEADS, 7, 7, generator=g) > 0.3,
        "padding": padding_mask([7, 4], 7),
    }[mask_kind]
    mask[..., 0] = True  # no empty rows
    with torch.no_grad():
        ours, weights = m(x, x, x, mask, need_weights=True)
        torch.testing.assert_close(ours, by_sdpa(m, x, x, attn_mask=mask), atol=1e-5, rtol=0)
    assert weights.shape == (2, HEADS, 7, 7)
    assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()


def test_kv_cache_stores_only_the_kv_heads_and_rope_continues_positions():
    torch.manual_seed(4)
    m = MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=2, rope_base=10000.0).eval()
    x = torch.randn(2, 8, D_MODEL)
    slot = LayerKVCache()
    with torch.no_grad():
        full = m(x, x, x, is_causal=True)
        first = m(x[:, :5], x[:, :5], x[:, :5], is_causal=True, kv_cache=slot)
        rest = [
            m(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], kv_cache=slot) for t in range(5, 8)
        ]
    torch.testing.assert_close(torch.cat([first, *rest], 1), full, atol=1e-5, rtol=0)
    assert slot.key.shape == (2, 2, 8, D_K)  # H_kv = 2 heads cached, not 8


def test_rope_makes_self_attention_shift_invariant_but_not_permutation_equivariant():
    torch.manual_seed(5)
    m = MultiHeadAttention(D_MODEL, HEADS, rope_base=10000.0, bias=False).eval()
    x = torch.randn(1, 6, D_MODEL)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    with torch.no_grad():
        assert not torch.allclose(
            m(x[:, perm], x[:, perm], x[:, perm]), m(x, x, x)[:, perm], atol=1e-4
        )
        # the same tokens 3 positions later: same scores, same output (caching the
        # first 3 positions of unrelated tokens but masking them out)
        junk = torch.randn(1, 3, D_MODEL)
        slot = LayerKVCache()
        m(junk, junk, junk, kv_cache=slot)
        keep = torch.cat(
            [torch.zeros(6, 3, dtype=torch.bool), torch.ones(6, 6, dtype=torch.bool)], 1
        )
        shifted = m(x, x, x, keep, kv_cache=slot)
        torch.testing.assert_close(shifted, m(x, x, x), atol=1e-5, rtol=0)


def llama(num_kv_heads: int, impl: str, *, bias: bool = True, theta: float = 10000.0):
    config = LlamaConfig(
        hidden_size=D_MODEL,
        num_attention_heads=HEADS,
        num_key_value_heads=num_kv_heads,
        head_dim=D_K,
        attention_bias=bias,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
    )
    config._attn_implementation = impl
    torch.manual_seed(6)
    module = LlamaAttention(config, layer_idx=0).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.2)  # biases too, so that they matter
    return config, module


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("num_kv_heads", [8, 2, 1])
@pytest.mark.parametrize("bias, theta", [(True, 10000.0), (False, 500000.0)])
def test_from_hf_llama_matches_llama_attention(impl, num_kv_heads, bias, theta):
    config, hf = llama(num_kv_heads, impl, bias=bias, theta=theta)
    ours = MultiHeadAttention.from_hf_llama(hf).eval()
    assert (ours.num_kv_heads, ours.rope_base) == (num_kv_heads, theta)
    batch, length = 2, 13
    x = torch.randn(batch, length, D_MODEL)
    cos_sin = LlamaRotaryEmbedding(config)(x, torch.arange(length).expand(batch, length))
    if impl == "eager":
        mask = eager_mask(batch, length, length, dtype=torch.float32)  # 0 / min additive
    else:
        mask = sdpa_mask(batch, length, length, allow_is_causal_skip=False)  # bool
    with torch.no_grad():
        theirs, _ = hf(x, position_embeddings=cos_sin, attention_mask=mask)
        torch.testing.assert_close(ours(x, x, x, is_causal=True), theirs, atol=1e-5, rtol=0)
        torch.testing.assert_close(ours(x, x, x, causal_mask(length)), theirs, atol=1e-5, rtol=0)


def test_from_hf_llama_reads_mistral_attention_too():
    """Mistral's attention layer has Llama's layout; the converted module holds its
    window, and is_causal=True gives the model's sliding-window mask."""
    from transformers import MistralConfig
    from transformers.models.mistral.modeling_mistral import (
        MistralAttention,
        MistralRotaryEmbedding,
    )

    config = MistralConfig(
        hidden_size=D_MODEL,
        num_attention_heads=HEADS,
        num_key_value_heads=2,
        head_dim=D_K,
        sliding_window=4,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(8)
    hf = MistralAttention(config, layer_idx=0).eval()
    ours = MultiHeadAttention.from_hf_llama(hf).eval()
    assert ours.window == 4
    x = torch.randn(1, 10, D_MODEL)
    cos_sin = MistralRotaryEmbedding(config)(x, torch.arange(10)[None])
    keep = causal_mask(10, window=4)
    additive = torch.zeros(10, 10).masked_fill(~keep, float("-inf"))[None, None]
    with torch.no_grad():
        theirs, _ = hf(x, position_embeddings=cos_sin, attention_mask=additive)
        torch.testing.assert_close(ours(x, x, x, is_causal=True), theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"num_kv_heads": 3}, ValueError, "divide"),
        ({"num_kv_heads": 0}, ValueError, "num_kv_heads"),
        ({"num_kv_heads": 2.0}, TypeError, "num_kv_heads"),
        ({"rope_base": 1.0}, ValueError, "base"),
        ({"rope_base": "1e4"}, TypeError, "base"),
    ],
)
def test_bad_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        MultiHeadAttention(D_MODEL, HEADS, **kwargs)


def test_rope_needs_an_even_head_width():
    with pytest.raises(ValueError, match="even"):
        MultiHeadAttention(12, 4, rope_base=10000.0)  # d_k = 3


def test_a_cache_of_the_wrong_heads_is_refused():
    m = MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=2)
    slot = LayerKVCache()
    slot.update(torch.randn(1, HEADS, 3, D_K), torch.randn(1, HEADS, 3, D_K))  # 8 heads
    x = torch.randn(1, 1, D_MODEL)
    with pytest.raises(ValueError, match="H_kv=2"):
        m(x, x, x, kv_cache=slot)


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_causal_lm_cache_shrinks_by_heads_over_kv_heads(num_kv_heads):
    torch.manual_seed(7)
    layers, heads, d_model, batch, tokens = 3, 4, 32, 2, 10
    caches = {}
    for kv in (heads, num_kv_heads):
        model = CausalLM(
            11, d_model, heads, layers, max_len=16, positional="rope", num_kv_heads=kv
        ).eval()
        caches[kv] = KVCache()
        with torch.no_grad():
            model(torch.randint(11, (batch, tokens)), cache=caches[kv])
    ratio = caches[heads].nbytes / caches[num_kv_heads].nbytes
    assert ratio == heads / num_kv_heads
    # and the size is kv_memory's formula, at toy scale (float32: 4 bytes)
    assert caches[num_kv_heads].nbytes == batch * kv_cache_bytes(
        layers, num_kv_heads, d_model // heads, tokens, bytes_per_value=4
    )


def test_causal_lm_rope_options():
    model = CausalLM(11, 32, 4, 1, max_len=16, positional="rope", rope_base=500000.0)
    attention = model.blocks.layers[0].self_attn
    assert attention.rope_base == 500000.0 and model.position is None
    assert CausalLM(11, 32, 4, 1, max_len=16).blocks.layers[0].self_attn.rope_base is None
    with pytest.raises(ValueError, match="positional"):
        CausalLM(11, positional="alibi")
