"""GatedDeltaNet with grouped heads and ``GatedDeltaNet.from_hf`` (chapter 18).

Oracle: 🤗 transformers 5.24's ``Qwen3NextGatedDeltaNet`` of a tiny random
``Qwen3NextConfig`` (nothing downloaded), called as ``Qwen3NextDecoderLayer``
calls it (``hidden_states``, ``cache``, ``attention_mask=None``), with the
model's own cache (``DynamicCache(config=config)``: the convolution state and
the recurrent state). float32, 1e-5.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download

import pytest
import torch
from transformers import DynamicCache, Qwen3NextConfig
from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next

from attention_lib.gated_deltanet import GatedDeltaNet, LayerStateCache
from attention_lib.linear_attention import gated_delta_core, gated_delta_rule

D_MODEL = 32


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> None:
    torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def config(key_heads: int, value_heads: int, key_dim: int, value_dim: int) -> Qwen3NextConfig:
    return Qwen3NextConfig(
        hidden_size=D_MODEL, linear_num_key_heads=key_heads,
        linear_num_value_heads=value_heads, linear_key_head_dim=key_dim,
        linear_value_head_dim=value_dim, linear_conv_kernel_dim=4,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, intermediate_size=32, vocab_size=16, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
    )  # fmt: skip


def transformers_layer(cfg: Qwen3NextConfig) -> torch.nn.Module:
    """A random ``Qwen3NextGatedDeltaNet`` (layer 0, a linear layer)."""
    assert cfg.layer_types[0] == "linear_attention"
    layer = qwen3_next.Qwen3NextGatedDeltaNet(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for p in layer.parameters():  # random, not the init's ones/zeros
            p.copy_(torch.randn_like(p) * 0.2)
        layer.A_log.copy_(torch.empty_like(layer.A_log).uniform_(0.01, 16).log())
    return layer


# (H_k, H, d_k, d): Qwen3-Next's 1:2 grouping, a 1:4 grouping, ungrouped, d_k != d
SHAPES = [(2, 4, 8, 8), (1, 4, 8, 8), (4, 4, 8, 8), (2, 4, 8, 16)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("length", [1, 5, 21, 70])  # one token, < and > a 64-token chunk
def test_from_hf_computes_qwen3_next_gated_deltanet(shape, length) -> None:
    torch.manual_seed(length)
    theirs = transformers_layer(config(*shape))
    ours = GatedDeltaNet.from_hf(theirs)
    assert (ours.num_key_heads, ours.num_heads, ours.key_head_dim, ours.head_dim) == shape
    x = torch.randn(2, length, D_MODEL)
    with torch.no_grad():
        expected = theirs(hidden_states=x, cache=None, attention_mask=None)
        got = ours(x)
    assert expected.abs().mean() > 0.01  # a real signal, not zeros
    close(got, expected)


@pytest.mark.parametrize("shape", SHAPES[:2] + SHAPES[3:], ids=str)
def test_grouping_matters(shape) -> None:
    """Sharing a query/key head among value heads in another order (or not
    repeating it) gives another output: the copy of the grouped layout is
    what makes the layer equal."""
    torch.manual_seed(3)
    theirs = transformers_layer(config(*shape))
    ours = GatedDeltaNet.from_hf(theirs)
    x = torch.randn(1, 9, D_MODEL)
    H_k, d_k = shape[0], shape[2]
    with torch.no_grad():
        expected = theirs(hidden_states=x, cache=None, attention_mask=None)
        for W in (ours.W_q, ours.W_k):  # swap the first two heads' rows, or reverse one head
            rows = W.weight.view(H_k, d_k, -1)
            rows.copy_(rows.flip(0) if H_k > 1 else rows.flip(1))
        assert (ours(x) - expected).abs().max() > 1e-3


@pytest.mark.parametrize("shape", SHAPES[:2], ids=str)
@pytest.mark.parametrize("prefill", [1, 6, 67])
def test_prefill_and_decode_with_the_cache(shape, prefill) -> None:
    """Prefill, then one token at a time: ours with a LayerStateCache,
    transformers' with its own cache; both equal the full pass."""
    torch.manual_seed(prefill)
    cfg = config(*shape)
    theirs = transformers_layer(cfg)
    ours = GatedDeltaNet.from_hf(theirs)
    x = torch.randn(2, prefill + 7, D_MODEL)
    ours_cache, their_cache = LayerStateCache(), DynamicCache(config=cfg)
    with torch.no_grad():
        whole = ours(x)
        expected_whole = theirs(hidden_states=x, cache=None, attention_mask=None)
        steps = [slice(0, prefill)] + [slice(t, t + 1) for t in range(prefill, x.shape[1])]
        got = torch.cat([ours(x[:, s], kv_cache=ours_cache) for s in steps], dim=1)
        expected = torch.cat(
            [theirs(hidden_states=x[:, s], cache=their_cache, attention_mask=None) for s in steps],
            dim=1,
        )
    close(expected, expected_whole)  # transformers' cache is right too
    close(got, whole)
    close(got, expected)
    close(ours_cache.state, their_cache.get_recurrent_state(0, state_idx=0))
    H_k, H, d_k, d = shape
    channels = 2 * H_k * d_k + H * d
    assert ours_cache.state.shape == (2, H, d_k, d)
    assert ours_cache.conv.shape == (2, channels, 3)  # the last conv_size - 1 inputs
    assert ours_cache.position == x.shape[1]


def test_grouped_core_is_the_rule_with_repeated_heads() -> None:
    torch.manual_seed(4)
    q, k = torch.randn(2, 2, 2, 13, 8).unbind(0)  # (B, H_k, L, d_k)
    k = k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(2, 6, 13, 5)  # (B, H, L, d)
    g, beta = -torch.rand(2, 6, 13), torch.rand(2, 6, 13)
    state = torch.randn(2, 6, 8, 5)
    for chunk in (None, 4):
        out, final = gated_delta_core(q, k, v, g, beta, state, scale=None, chunk_size=chunk)
        q3, k3 = (t.repeat_interleave(3, dim=1) for t in (q, k))  # heads 0,0,0,1,1,1
        want, want_final = gated_delta_rule(
            q3, k3, v, g, beta, chunk_size=chunk, initial_state=state, output_final_state=True
        )
        close(out, want)
        close(final, want_final)


def test_default_is_one_key_head_per_value_head() -> None:
    layer = GatedDeltaNet(D_MODEL, 4)
    assert (layer.num_key_heads, layer.key_head_dim) == (4, 8)
    assert layer.W_q.weight.shape == layer.W_v.weight.shape == (32, D_MODEL)
    assert layer.conv.weight.shape == (96, 1, 4)


def test_refuses_bad_grouping_and_foreign_layers() -> None:
    with pytest.raises(ValueError, match="num_key_heads must divide num_heads"):
        GatedDeltaNet(D_MODEL, 4, num_key_heads=3)
    for bad in (0, -2):
        with pytest.raises(ValueError, match="num_key_heads"):
            GatedDeltaNet(D_MODEL, 4, num_key_heads=bad)
    with pytest.raises(TypeError, match="key_head_dim"):
        GatedDeltaNet(D_MODEL, 4, key_head_dim=2.5)
    with pytest.raises(TypeError, match="Qwen3NextGatedDeltaNet"):
        GatedDeltaNet.from_hf(torch.nn.Linear(4, 4))


def test_refuses_another_conv_activation_and_it_matters() -> None:
    torch.manual_seed(5)
    cfg = config(2, 4, 8, 8)
    theirs = transformers_layer(cfg)
    x = torch.randn(1, 9, D_MODEL)
    with torch.no_grad():
        silu = theirs(hidden_states=x, cache=None, attention_mask=None)
        theirs.activation = "gelu"
        gelu = theirs(hidden_states=x, cache=None, attention_mask=None)
    assert (silu - gelu).abs().max() > 1e-3  # the activation changes the output
    with pytest.raises(ValueError, match="activation 'gelu'"):
        GatedDeltaNet.from_hf(theirs)
