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

from attention_lib import CausalLM, MultiHeadAttention
from attention_lib.blocks import BlockSpec, GatedMLP, RMSNorm

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
