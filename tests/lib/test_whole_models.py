"""Whole models from the book's parts: the blocks of today's decoders
(attention_lib.blocks) and CausalLM.from_hf against transformers' models (tiny
random configs, nothing downloaded)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.models.gemma3.configuration_gemma3 import Gemma3TextConfig
from transformers.models.gemma3.modeling_gemma3 import Gemma3MLP, Gemma3RMSNorm
from transformers.models.llama.configuration_llama import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from attention_lib import CausalLM, KVCache, MultiHeadAttention, generate
from attention_lib.blocks import BlockSpec, GatedMLP, RMSNorm
from attention_lib.moe import MixtureOfExperts

# --- the blocks ------------------------------------------------------------------------


def _randomised(module: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.5)
    return module


@pytest.mark.parametrize("theirs,offset", [(LlamaRMSNorm, 0.0), (Gemma3RMSNorm, 1.0)])
def test_rms_norm_equals_llamas_and_gemmas(theirs, offset):
    hf = _randomised(theirs(16, eps=1e-6))
    ours = RMSNorm(16, 1e-6, offset=offset)
    ours.weight.data.copy_(hf.weight)
    x = torch.randn(2, 5, 16) + 0.3
    torch.testing.assert_close(ours(x), hf(x), atol=1e-6, rtol=0)
    assert RMSNorm(4, offset=offset)(x[..., :4]).allclose(nn.RMSNorm(4, eps=1e-6)(x[..., :4]))


@pytest.mark.parametrize("kind", ["swiglu", "geglu"])
def test_gated_mlp_equals_llamas_and_gemmas(kind):
    if kind == "swiglu":
        hf = LlamaMLP(LlamaConfig(hidden_size=16, intermediate_size=24, num_attention_heads=4))
    else:
        hf = Gemma3MLP(
            Gemma3TextConfig(hidden_size=16, intermediate_size=24, num_attention_heads=4)
        )
    hf = _randomised(hf)
    ours = GatedMLP(16, 24, kind)
    for name in ("gate", "up", "down"):
        getattr(ours, name).load_state_dict(getattr(hf, f"{name}_proj").state_dict())
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(ours(x), hf(x), atol=1e-6, rtol=0)


def test_block_spec_refuses_unknown_kinds():
    with pytest.raises(ValueError, match="norm"):
        BlockSpec("batch")
    with pytest.raises(ValueError, match="mlp"):
        BlockSpec(mlp="moe")
    with pytest.raises(TypeError, match="sandwich"):
        BlockSpec(sandwich=1)
    with pytest.raises(ValueError, match="mlp"):
        BlockSpec().make_mlp(8, 16)  # chapter 7's ReLU MLP is FeedForward


def test_the_default_block_is_chapter_7s_bit_for_bit():
    tokens = torch.randint(0, 50, (2, 9))
    models = []
    for block in (None, BlockSpec()):
        torch.manual_seed(3)
        models.append(CausalLM(50, 32, 4, 2, block=block))
    assert [n for n, _ in models[0].named_parameters()] == [
        n for n, _ in models[1].named_parameters()
    ]
    assert torch.equal(models[0](tokens), models[1](tokens))


def test_a_2026_block_builds_and_counts_its_parameters():
    d, d_ff, vocab, layers = 32, 48, 50, 3
    model = CausalLM(
        vocab, d, 4, layers, d_ff=d_ff, positional="rope", num_kv_heads=2, head_dim=16,
        qk_norm=True, bias=False, block=BlockSpec("rms_1p", mlp="geglu", sandwich=True),
        tie_embeddings=True, embed_scale=d**0.5, logit_softcap=30.0, head_bias=False,
    )  # fmt: skip
    attention = d * 4 * 16 * 2 + 2 * d * 2 * 16 + 2 * 16  # W_q, W_o; W_k, W_v; QK-norm
    per_layer = attention + 3 * d * d_ff + 4 * d  # gated MLP, four norms
    assert sum(p.numel() for p in model.parameters()) == vocab * d + layers * per_layer + d
    assert model.head.weight is model.embedding.weight
    logits = model(torch.randint(0, vocab, (2, 7)))
    assert logits.shape == (2, 7, vocab) and logits.abs().max() < 30.0


def test_head_dim_other_than_d_model_over_heads():
    mha = MultiHeadAttention(32, 4, head_dim=16, num_kv_heads=2, rope_base=1e4)
    assert (mha.W_q.out_features, mha.W_o.in_features, mha.W_k.out_features) == (64, 64, 32)
    x = torch.randn(2, 5, 32)
    assert mha(x, x, x, is_causal=True).shape == (2, 5, 32)


# --- whole models: CausalLM.from_hf against transformers -------------------------------

VOCAB = 97
TINY = {  # a tiny config every family accepts; ids 0-2 are pad, bos, eos
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "initializer_range": 0.1,  # logits of order 1, not 0.1
}
LLAMA3_ROPE = {  # scaled from 32 positions on: the prompts and generations pass it
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
DEEPSEEK_YARN = {  # DeepSeek-V3's published kind, trained on 16 positions here
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 16,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
MLA = {  # DeepSeek-V3's latent attention, small; every layer dense (no MoE)
    "q_lora_rank": 24,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 6,
    "first_k_dense_replace": 2,
}
GEMMA2_CAPS = {  # small caps, reached by logits of order 1
    "head_dim": 16,
    "sliding_window": 8,
    "final_logit_softcapping": 3.0,
    "attn_logit_softcapping": 5.0,
}
QWEN3_NEXT = {  # 3 Gated DeltaNet : 1 full layer (partial RoPE, output gate), MLPs dense
    "num_hidden_layers": 4,
    "head_dim": 16,  # RoPE turns 4 of its 16 coordinates (partial_rotary_factor 0.25)
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "mlp_only_layers": [0, 1, 2, 3],
}
GPT_OSS = {  # sinks, sliding : full, YaRN from 16 positions, 2 of 4 experts per token
    "head_dim": 8,
    "sliding_window": 8,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 4.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,  # as gpt-oss's published config
        "original_max_position_embeddings": 16,
    },
}
KIMI_LINEAR = {  # KDA layers only (its full layers are NoPE MLA), MLPs dense
    "num_hidden_layers": 3,
    "layer_types": ["linear_attention"] * 3,
    "mlp_layer_types": ["dense"] * 3,
    "linear_attn_config": {"head_dim": 8, "num_heads": 4, "short_conv_kernel_size": 4},
    "use_cache": False,  # transformers 5.24's cache needs an attention layer
}
BAMBA = {  # Mamba-2 : attention : Mamba-2 (partial RoPE), grouped B and C, 8-token chunks
    "num_hidden_layers": 3,
    "attn_layer_indices": [1],
    "mamba_n_heads": 8,
    "mamba_d_head": 8,
    "mamba_n_groups": 2,
    "mamba_d_state": 8,
    "mamba_chunk_size": 8,
}
FAMILIES = {  # id: (config class, options); every window and scaling is reached below
    "llama3": (LlamaConfig, {"rope_parameters": LLAMA3_ROPE}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "gemma3": (Gemma3TextConfig, {"num_hidden_layers": 6, "head_dim": 16, "sliding_window": 8}),
    "smollm3": ("SmolLM3Config", {"num_hidden_layers": 4}),  # layer 3 is NoPE
    "gemma2": ("Gemma2Config", {"num_hidden_layers": 4, **GEMMA2_CAPS}),  # soft-capping
    "deepseek_v3": (
        "DeepseekV3Config",
        {**MLA, "num_key_value_heads": 4, "rope_parameters": DEEPSEEK_YARN},
    ),
    "qwen3_next": ("Qwen3NextConfig", QWEN3_NEXT),
    "gpt_oss": ("GptOssConfig", GPT_OSS),
    "kimi_linear": ("KimiLinearConfig", KIMI_LINEAR),  # KDA (chapter 18)
    "bamba": ("BambaConfig", BAMBA),  # Mamba-2 (chapter 18)
}


def hf_model(family: str, **options) -> nn.Module:
    """A transformers ...ForCausalLM of ``family`` (a name of FAMILIES or of a
    config class) with random weights (norms too)."""
    import transformers

    config_class, family_options = FAMILIES.get(family, (family, {}))
    if isinstance(config_class, str):
        config_class = getattr(transformers, config_class)
    config = config_class(**{**TINY, **family_options, **options})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms away from their initial 1 (or Gemma's 0)
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):  # (transformers zeroes biases)
                p.add_(torch.randn_like(p) * 0.2)
    return model


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request):
    theirs = hf_model(request.param)
    return request.param, theirs, CausalLM.from_hf(theirs)


def _prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """Three left-padded prompts of 1, 9 and 40 tokens, ``(3, 40)`` ids and mask."""
    torch.manual_seed(1)
    lengths = (1, 9, 40)
    ids = torch.zeros(3, 40, dtype=torch.long)
    mask = torch.zeros(3, 40, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, 40 - n :] = torch.randint(3, VOCAB, (n,))
        mask[row, 40 - n :] = 1
    return ids, mask


def test_logits_equal_transformers(pair):
    family, theirs, ours = pair
    ids, mask = _prompts()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # each prompt counts from its first token
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask, position_ids=positions).logits
        got = ours(ids, mask=mask.bool(), positions=positions)
        alone = [theirs(ids[i : i + 1, 40 - n :]).logits for i, n in enumerate((1, 9, 40))]
    real = mask.bool()
    difference = (got - expected)[real].abs().max()
    assert difference < 1e-4, f"{family}: {difference:.2e}"
    for row, logits in enumerate(alone):  # and each prompt alone, unpadded
        assert (got[row, 40 - logits.shape[1] :] - logits[0]).abs().max() < 1e-4


def test_greedy_tokens_equal_transformers_generate(pair):
    family, theirs, ours = pair
    ids, mask = _prompts()
    ids, mask = ids[1:], mask[1:]  # 9 and 40 tokens: past every window and scaling
    expected = theirs.generate(
        ids, attention_mask=mask, max_new_tokens=32, do_sample=False, eos_token_id=None
    )
    got = generate(ours, ids, 32, attention_mask=mask.bool())
    assert torch.equal(got, expected), family


def test_cached_decoding_equals_the_full_pass(pair):
    family, _, ours = pair
    ids, _ = _prompts()
    sequence = torch.cat([ids[2:], torch.randint(3, VOCAB, (1, 20))], dim=1)  # (1, 60)
    with torch.no_grad():
        full = ours(sequence)
        cache = KVCache()
        steps = [ours(sequence[:, :30], cache=cache)]
        steps += [ours(sequence[:, i : i + 1], cache=cache) for i in range(30, 60)]
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-5, family
    assert torch.equal(generate(ours, ids[2:], 32), generate(ours, ids[2:], 32, use_cache=False))


# --- refusals: each names the feature, and the feature changes transformers' output ----

DYNAMIC = {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}
GRANITE = {"embedding_multiplier": 2.0, "logits_scaling": 4.0, "residual_multiplier": 0.5}
QWEN3_NEXT_MOE = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 16,
}
MOE = {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1}
REFUSED = {  # id: (family, its options, a keyword of the message, the family without it)
    "moe-layer": (
        "deepseek_v3",
        {"first_k_dense_replace": 1, "moe_intermediate_size": 16, **MOE},
        "mixture-of-experts",
        ("deepseek_v3", {}),
    ),
    "dynamic-rope": (
        "LlamaConfig",
        {"rope_parameters": DYNAMIC, "max_position_embeddings": 16},
        "RoPE",
        ("LlamaConfig", {"max_position_embeddings": 16}),
    ),
    "qkv-bias-only": ("Qwen2Config", {}, "bias in some projections", ("LlamaConfig", {})),
    "mlp-bias": ("LlamaConfig", {"mlp_bias": True}, "biases", ("LlamaConfig", {})),
    "exact-gelu": ("LlamaConfig", {"hidden_act": "gelu"}, "activation", ("LlamaConfig", {})),
    "qwen3-next-moe": (  # its last layer's MLP a mixture of experts (as published)
        "Qwen3NextConfig",
        {**QWEN3_NEXT, "mlp_only_layers": [0, 1, 2], **QWEN3_NEXT_MOE},
        "mixture-of-experts",
        ("Qwen3NextConfig", QWEN3_NEXT),
    ),
    "granite-multipliers": (  # no submodule shows them: the probe run refuses
        "GraniteConfig",
        {**GRANITE, "attention_multiplier": 0.25},
        "differ by",
        ("GraniteConfig", {"attention_multiplier": 0.25}),
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_refusals_name_the_feature_and_the_feature_matters(case):
    family, options, keyword, (plain_family, plain_options) = REFUSED[case]
    featured = hf_model(family, **options)
    with pytest.raises(ValueError, match=keyword):
        CausalLM.from_hf(featured, max_len=64)
    plain = hf_model(plain_family, **plain_options)  # the same weights, without the feature
    plain.load_state_dict(featured.state_dict(), strict=False)
    ours = CausalLM.from_hf(plain, max_len=64)
    ids, _ = _prompts()
    with torch.no_grad():
        without = plain(ids[2:]).logits
        assert (ours(ids[2:]) - without).abs().max() < 1e-4  # reproduced without it
        assert (featured(ids[2:]).logits - without).abs().max() > 1e-3  # it matters


def test_qwen3_next_full_layer_partial_rope_and_output_gate():
    """Qwen3-Next's full layer alone equals transformers' (called as its model
    calls it), and both of what it adds to Qwen3's layer matter."""
    qwen3_next = hf_model("Qwen3NextConfig", **QWEN3_NEXT)
    theirs = qwen3_next.model.layers[3].self_attn
    ours = MultiHeadAttention.from_hf(theirs)
    assert (ours.rope_dim, ours.d_k, ours.W_g.out_features) == (4, 16, 4 * 16)
    torch.manual_seed(2)
    x, positions = torch.randn(2, 11, 32), torch.arange(11)[None]
    causal = torch.full((11, 11), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        angles = qwen3_next.model.rotary_emb(x, positions)
        expected, _ = theirs(hidden_states=x, position_embeddings=angles, attention_mask=causal)
        assert (ours(x, x, x, is_causal=True) - expected).abs().max() < 1e-5
        ours.rope_dim = ours.d_k  # RoPE over the whole head: another layer
        assert (ours(x, x, x, is_causal=True) - expected).abs().max() > 1e-3
        ours.rope_dim, gate = 4, ours.W_g
        ours.W_g = None  # no output gate: another layer
        assert (ours(x, x, x, is_causal=True) - expected).abs().max() > 1e-3
        ours.W_g = gate
    with pytest.raises(ValueError, match="rope_dim"):
        MultiHeadAttention(32, 4, rope_base=1e4, rope_dim=3)
    with pytest.raises(ValueError, match="rope_dim"):
        MultiHeadAttention(32, 4, rope_dim=4)  # without RoPE


def test_mixture_of_experts_equals_gpt_oss_mlp_and_its_parts_matter():
    """gpt-oss's MLP alone (inputs large enough to reach the clamp), and what
    its routing rule and its clamp change."""
    theirs = hf_model("GptOssConfig", **GPT_OSS).model.layers[0].mlp
    ours = MixtureOfExperts.from_hf(theirs)
    torch.manual_seed(4)
    x = torch.randn(2, 13, 32) * 30.0
    with torch.no_grad():
        expected, _ = theirs(x)
        assert (ours(x) - expected).abs().max() < 1e-4 * expected.abs().max()
        ours.limit = 1e9  # without the clamp: another MLP
        assert (ours(x) - expected).abs().max() > 1e-2 * expected.abs().max()
        ours.limit, small = 7.0, x / 30.0  # logits of order 1: routing decides
        expected, _ = theirs(small)
        assert (ours(small) - expected).abs().max() < 1e-5
        ours.top_k = 4  # every expert for every token: another MLP
        assert (ours(small) - expected).abs().max() > 1e-2 * expected.abs().max()
    with pytest.raises(ValueError, match="top_k"):
        MixtureOfExperts(8, 16, 4, 5)
    with pytest.raises(ValueError, match="experts and top_k"):
        BlockSpec("rms", mlp="moe")
    with pytest.raises(TypeError, match="GptOssMLP"):
        MixtureOfExperts.from_hf(nn.Linear(3, 3))


def test_refuses_what_is_not_a_decoder():
    with pytest.raises(TypeError, match="ForCausalLM"):
        CausalLM.from_hf(nn.Linear(3, 3))


def test_kimi_linear_latent_layers_without_rope_are_refused_by_name():
    """Kimi Linear's full layers are MLA without RoPE (its model has no rotary
    embedding): refused by name, not converted as DeepSeek's MLA."""
    kinds = ["linear_attention"] * 2 + ["full_attention"]
    model = hf_model("kimi_linear", layer_types=kinds, num_key_value_heads=4)
    with pytest.raises(ValueError, match="layer 2's attention: latent attention without RoPE"):
        CausalLM.from_hf(model)
    assert not hasattr(model.model, "rotary_emb")
