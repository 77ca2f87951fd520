"""Chapter 17's multi-head latent attention (DeepSeek-V2/V3): parity with 🤗
transformers' DeepseekV3Attention (tiny random configs, nothing downloaded), the
absorbed form, the latent cache and the checks."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download

import pytest
import torch
from transformers import DeepseekV3Config, DynamicCache
from transformers.masking_utils import create_causal_mask
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3Attention,
    DeepseekV3RotaryEmbedding,
)

from attention_lib import LatentKVCache, MultiHeadLatentAttention, causal_mask

D_MODEL, HEADS = 64, 4
SIZES = {"kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6}


class HF:
    """A DeepseekV3Attention with random weights, called as DeepseekV3Model calls it:
    its rotary embedding, its causal mask, eager attention."""

    def __init__(self, **options):
        self.config = DeepseekV3Config(
            hidden_size=D_MODEL,
            num_attention_heads=HEADS,
            num_key_value_heads=HEADS,
            num_hidden_layers=1,
            vocab_size=32,
            **{"q_lora_rank": 24, **SIZES, **options},
        )
        assert self.config.head_dim == SIZES["qk_rope_head_dim"]  # what the rotary needs
        self.config._attn_implementation = "eager"
        torch.manual_seed(0)
        self.layer = DeepseekV3Attention(self.config, layer_idx=0).eval()
        with torch.no_grad():
            for name, p in self.layer.named_parameters():  # biases and norms too
                p.normal_(1.0 if "norm" in name else 0.0, 0.2)
        self.rotary = DeepseekV3RotaryEmbedding(self.config)

    def __call__(self, x: torch.Tensor, cache: DynamicCache | None = None) -> torch.Tensor:
        return self.run(x, cache)[0]

    def run(self, x: torch.Tensor, cache: DynamicCache | None = None) -> tuple:
        """The layer's output and its eager attention weights (B, H, L, T)."""
        past = 0 if cache is None else cache.get_seq_length()
        positions = torch.arange(past, past + x.shape[1])[None]  # (1, L)
        mask = create_causal_mask(
            config=self.config,
            inputs_embeds=x,
            attention_mask=None,
            cache=cache,
            position_ids=positions,
        )
        with torch.no_grad():
            return self.layer(
                x, position_embeddings=self.rotary(x, positions), attention_mask=mask, cache=cache
            )


X = torch.randn(2, 11, D_MODEL, generator=torch.Generator().manual_seed(1))


#: DeepSeek-V3's YaRN (mscale 1, mscale_all_dim 1: an attention factor and a score
#: scale), trained on 4 positions: X's 11 pass it
YARN = {
    "rope_type": "yarn",
    "rope_theta": 1e4,
    "factor": 4.0,
    "original_max_position_embeddings": 4,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}


def tiny(**options) -> MultiHeadLatentAttention:
    torch.manual_seed(3)
    return MultiHeadLatentAttention(D_MODEL, HEADS, **{**SIZES, **options}).eval()


@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"q_lora_rank": None},
        {"attention_bias": True},
        {"rope_parameters": {"rope_theta": 50.0}},
        {"rope_parameters": YARN},
    ],
    ids=["q-lora", "full-W_q", "bias", "base-50", "yarn"],
)
def test_equals_deepseek_v3_attention(options, absorb):
    hf = HF(**options)
    m = MultiHeadLatentAttention.from_hf(hf.layer, absorb=absorb)
    assert (m.W_q is None) == (hf.config.q_lora_rank is not None)
    with torch.no_grad():
        torch.testing.assert_close(m(X, is_causal=True), hf(X), atol=1e-5, rtol=0)


@pytest.mark.parametrize("absorb", [False, True])
def test_weights_equal_deepseek_v3_attention_weights(absorb):
    hf = HF()
    m = MultiHeadLatentAttention.from_hf(hf.layer, absorb=absorb)
    _, theirs = hf.run(X)  # (B, H, L, L), eager
    with torch.no_grad():
        out, weights = m(X, is_causal=True, need_weights=True)
        torch.testing.assert_close(out, m(X, is_causal=True), atol=0, rtol=0)
    torch.testing.assert_close(weights, theirs, atol=1e-6, rtol=0)


def test_a_model_returns_the_weights_of_its_latent_layers():
    from attention_lib import CausalLM

    torch.manual_seed(0)
    model = CausalLM(16, 32, 4, 2, max_len=8, positional="rope", layer_types=["mla", "full"])
    tokens = torch.randint(0, 16, (2, 5))
    mla = model.blocks.layers[0].self_attn
    seen = []
    mla.register_forward_hook(lambda mod, args, out: seen.append(args[0]))
    with torch.no_grad():
        logits, weights = model(tokens, need_weights=True)  # (B, layers, H, L, L)
        _, own = mla(seen[0], is_causal=True, need_weights=True)
    torch.testing.assert_close(logits, model(tokens), atol=0, rtol=0)
    assert weights.shape == (2, 2, 4, 5, 5)
    torch.testing.assert_close(weights[:, 0], own, atol=1e-6, rtol=0)


def test_cached_decoding_equals_deepseek_v3_with_its_cache():
    hf = HF()
    m = MultiHeadLatentAttention.from_hf(hf.layer, absorb=True)
    theirs, cache = DynamicCache(config=hf.config), LatentKVCache()
    with torch.no_grad():
        ours = [m(X[:, :6], is_causal=True, kv_cache=cache)]
        ref = [hf(X[:, :6], theirs)]
        for t in range(6, X.shape[1]):
            ours.append(m(X[:, t : t + 1], is_causal=True, kv_cache=cache))
            ref.append(hf(X[:, t : t + 1], theirs))
    torch.testing.assert_close(torch.cat(ours, 1), torch.cat(ref, 1), atol=1e-5, rtol=0)


def test_from_hf_refuses_what_it_cannot_reproduce():
    dynamic = {"rope_type": "dynamic", "factor": 4.0}
    with pytest.raises(ValueError, match="RoPE"):
        MultiHeadLatentAttention.from_hf(HF(rope_parameters={"rope_theta": 1e4, **dynamic}).layer)
    with pytest.raises(ValueError, match="RoPE"):
        MultiHeadLatentAttention.from_hf(HF(rope_interleave=False).layer)
    with pytest.raises(TypeError, match="layer"):
        MultiHeadLatentAttention.from_hf(tiny())  # our own module is not a 🤗 layer


@pytest.mark.parametrize("q_lora_rank", [None, 12])
def test_absorbed_equals_naive_with_masks_and_positions(q_lora_rank):
    m = tiny(q_lora_rank=q_lora_rank)
    keep = torch.rand(2, 1, 11, 11, generator=torch.Generator().manual_seed(4)) > 0.3
    positions = torch.tensor([[3] * 11, [0] * 11]) + torch.arange(11)  # (B, L): offsets
    with torch.no_grad():
        naive = m(X, mask=keep, is_causal=True, positions=positions)
        m.absorb = True
        torch.testing.assert_close(
            m(X, mask=keep, is_causal=True, positions=positions), naive, atol=1e-5, rtol=0
        )
        m.absorb = False  # per-sequence positions == each sequence alone at its offset
        alone = m(X[:1], mask=keep[:1], is_causal=True, positions=torch.arange(3, 14))
    torch.testing.assert_close(naive[:1], alone, atol=1e-5, rtol=0)


def test_absorbed_reads_only_the_latents():
    """W_UK and W_UV folded by hand: queries in the latent space, c as the value."""
    m = tiny(absorb=True)
    w_uk, w_uv = m.up_projections()
    assert w_uk.shape == (HEADS, 8, 16) and w_uv.shape == (HEADS, 6, 16)
    with torch.no_grad():
        kv = m.W_ukv(torch.eye(16)).view(16, HEADS, 14)  # (d_c, H, d_nope + d_v)
        torch.testing.assert_close(w_uk, kv[..., :8].permute(1, 2, 0))
        torch.testing.assert_close(w_uv, kv[..., 8:].permute(1, 2, 0))


@pytest.mark.parametrize("absorb", [False, True])
def test_prefill_and_decode_equal_the_full_pass(absorb):
    m = tiny(q_lora_rank=12, absorb=absorb)
    cache = LatentKVCache()
    with torch.no_grad():
        full = m(X, is_causal=True)
        steps = [m(X[:, :4], is_causal=True, kv_cache=cache)]
        steps += [m(X[:, 4:7], is_causal=True, kv_cache=cache)]  # a chunk: bottom-right
        steps += [m(X[:, t : t + 1], is_causal=True, kv_cache=cache) for t in range(7, 11)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    assert len(cache) == cache.position == 11


def test_the_cache_holds_the_latent_and_the_rope_key_only():
    m = tiny()
    cache = LatentKVCache()
    with torch.no_grad():
        m(X, is_causal=True, kv_cache=cache)
    assert cache.latent.shape == (2, 11, 16) and cache.rope_key.shape == (2, 11, 4)
    assert cache.index_key is None
    assert cache.numbers_per_token == 16 + 4  # kv_lora_rank + qk_rope_head_dim
    assert cache.nbytes == 2 * 11 * (16 + 4) * 4  # float32
    with torch.no_grad():  # the heads' keys and values it rebuilds: H (d_nope + d_v) ...
        heads_kv = m.W_ukv(cache.latent)  # (B, T, H (d_nope + d_v))
    assert heads_kv.shape[-1] + HEADS * 4 == 4 * (8 + 4) + 4 * 6  # ... + H d_rope of keys


def test_mask_is_a_keep_mask_and_causal_is_bottom_right_after_the_cache():
    m = tiny()
    with torch.no_grad():
        masked = m(X, mask=causal_mask(11))
        torch.testing.assert_close(masked, m(X, is_causal=True), atol=1e-6, rtol=0)
        cache = LatentKVCache()
        m(X[:, :8], kv_cache=cache)
        last = m(X[:, 8:], kv_cache=cache, mask=causal_mask(3, 11, offset=8))
    torch.testing.assert_close(last, masked[:, 8:], atol=1e-5, rtol=0)


def test_bad_input_is_refused_clearly():
    m = tiny()
    with pytest.raises(ValueError, match=r"\bx\b"):
        m(torch.randn(2, 5, 32))
    with pytest.raises(TypeError, match="dtype"):
        m(X.double())
    with pytest.raises(TypeError, match="LatentKVCache"):
        m(X, kv_cache={})
    with pytest.raises(TypeError, match="is_causal"):
        m(X, is_causal=1)
    with pytest.raises(ValueError, match="mask"):
        m(X, mask=torch.ones(2, 11, 11, dtype=torch.bool))
    with pytest.raises(ValueError, match="positions"):
        m(X, positions=torch.arange(5))
    cache = LatentKVCache()
    with torch.no_grad():
        m(X, kv_cache=cache)
    with pytest.raises(ValueError, match="kv_cache"):
        m(X[:1], kv_cache=cache)  # another batch size
    with pytest.raises(ValueError, match="qk_rope_head_dim"):
        MultiHeadLatentAttention(D_MODEL, HEADS, **{**SIZES, "qk_rope_head_dim": 3})
    with pytest.raises(TypeError, match="kv_lora_rank"):
        MultiHeadLatentAttention(D_MODEL, HEADS, **{**SIZES, "kv_lora_rank": 16.0})
    with pytest.raises(TypeError, match="absorb"):
        tiny(absorb="yes")
    with pytest.raises(ValueError, match="index_head_dim"):
        tiny(index_topk=2, index_head_dim=2)  # narrower than the RoPE part (4)
    assert tiny(qk_rope_head_dim=64).indexer is None  # no indexer: its width is not asked


def test_bfloat16_follows_deepseek_v3_within_its_rounding():
    """In bfloat16 the module keeps the layer's dtype; it differs from transformers
    only by rounding (its RMSNorm rounds twice, nn.RMSNorm once)."""
    hf = HF()
    hf.layer.to(torch.bfloat16)
    m = MultiHeadLatentAttention.from_hf(hf.layer)
    assert m.W_o.weight.dtype == torch.bfloat16
    x = X.to(torch.bfloat16)
    with torch.no_grad():
        ours, theirs = m(x, is_causal=True).float(), hf(x).float()
        exact = MultiHeadLatentAttention.from_hf(HF().layer)(X, is_causal=True)
    assert (ours - theirs).abs().max() < 0.02 * exact.abs().max()
    assert (ours - exact).abs().max() < 0.02 * exact.abs().max()
