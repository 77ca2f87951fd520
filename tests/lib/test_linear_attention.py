"""attention_lib.linear_attention and attention_lib.gated_deltanet (chapter 18).

Oracles: the definitions written out (the masked matrix of linear attention,
the delta rule one token at a time), and 🤗 transformers' own pure-PyTorch
Qwen3-Next functions ``torch_recurrent_gated_delta_rule`` and
``torch_chunk_gated_delta_rule``, called as ``Qwen3NextGatedDeltaNet`` calls them
(``(B, L, H, d)`` layout, ``use_qk_l2norm_in_kernel=True``), and the layer
``Qwen3NextGatedDeltaNet`` itself with our weights copied in. float32, 1e-5.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download

import pytest
import torch
import torch.nn.functional as F
from transformers import Qwen3NextConfig
from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next

from attention_lib.gated_deltanet import GatedDeltaNet, LayerStateCache
from attention_lib.linear_attention import gated_delta_rule, linear_attention

torch.manual_seed(0)
Q, K, V = torch.randn(3, 2, 3, 37, 8).unbind(0)  # (B, H, L, d): L not a multiple of chunks
G = -torch.rand(2, 3, 37)  # (B, H, L) log-decay <= 0
BETA = torch.rand(2, 3, 37)
STATE = torch.randn(2, 3, 8, 8)  # (B, H, d_k, d_v)


def unit(x: torch.Tensor) -> torch.Tensor:
    """Qwen3-Next's (and FLA's) l2norm: x / sqrt(|x|^2 + 1e-6)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> None:
    torch.testing.assert_close(a, b, atol=tol, rtol=tol)


# --- linear attention ---------------------------------------------------------------


@pytest.mark.parametrize("feature_map", ["elu+1", None])
def test_linear_attention_is_the_masked_sum_of_feature_products(feature_map) -> None:
    phi = (lambda x: F.elu(x) + 1) if feature_map else (lambda x: x)
    L = Q.shape[-2]
    out = torch.zeros(2, 3, L, 8)
    for i in range(L):  # o_i = sum_{j <= i} (phi(q_i) . phi(k_j)) v_j  (/ sum of the weights)
        w = (phi(Q[..., i : i + 1, :]) * phi(K[..., : i + 1, :])).sum(-1)  # (B, H, i + 1)
        out[..., i, :] = (w.unsqueeze(-1) * V[..., : i + 1, :]).sum(-2)
        if feature_map:
            out[..., i, :] /= w.sum(-1, keepdim=True)
    close(linear_attention(Q, K, V, feature_map=feature_map), out, 1e-4)


@pytest.mark.parametrize("feature_map", ["elu+1", "identity"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("schedule", ["recurrent", "chunked"])
def test_the_three_schedules_agree(feature_map, causal, schedule) -> None:
    quadratic = linear_attention(Q, K, V, feature_map=feature_map, causal=causal)
    other = linear_attention(
        Q, K, V, feature_map=feature_map, causal=causal, schedule=schedule, chunk_size=5
    )
    close(other, quadratic, 1e-4)


def test_softmax_free_attention_cannot_overwrite_a_key() -> None:
    k = torch.tensor([1.0, 0.0, 0.0, 0.0])
    keys = k.expand(1, 1, 2, 4)  # write (k, v1), then (k, v2)
    values = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])  # (1, 1, 2, 2): v1, v2
    read = linear_attention(keys, keys, values, feature_map=None, schedule="recurrent")
    assert torch.equal(read[0, 0, -1], torch.tensor([1.0, 1.0]))  # v1 + v2
    no_decay, full = torch.zeros(1, 1, 2), torch.ones(1, 1, 2)
    read = gated_delta_rule(keys, keys, values, no_decay, full, scale=1.0)
    assert torch.equal(read[0, 0, -1], torch.tensor([0.0, 1.0]))  # v2 replaced v1


def test_linear_attention_refuses_what_it_cannot_compute() -> None:
    with pytest.raises(ValueError, match="normalize"):
        linear_attention(Q, K, V, feature_map="identity", normalize=True)
    with pytest.raises(ValueError, match="feature_map"):
        linear_attention(Q, K, V, feature_map="relu")
    with pytest.raises(ValueError, match="schedule"):
        linear_attention(Q, K, V, schedule="parallel")
    with pytest.raises(ValueError, match="d_k"):
        linear_attention(Q, K[..., :4], V)
    with pytest.raises(TypeError, match="query"):
        linear_attention(Q.long(), K, V)


# --- the gated delta rule ---------------------------------------------------------------


def test_the_recurrent_form_is_the_update_written_out() -> None:
    q, k = unit(Q), unit(K)
    S, expected = STATE.clone(), []
    eye = torch.eye(8)
    for t in range(Q.shape[-2]):  # S_t = a_t (I - b_t k k^T) S_{t-1} + b_t k v^T
        kt, vt, a, b = k[..., t, :], V[..., t, :], G[..., t].exp(), BETA[..., t]
        outer = kt.unsqueeze(-1) * kt.unsqueeze(-2)  # (B, H, d, d)
        S = a[..., None, None] * (eye - b[..., None, None] * outer) @ S
        S = S + b[..., None, None] * kt.unsqueeze(-1) * vt.unsqueeze(-2)
        expected.append((q[..., t, :].unsqueeze(-1) * S).sum(-2) / 8**0.5)  # S^T q / sqrt(d)
    out, final = gated_delta_rule(q, k, V, G, BETA, initial_state=STATE, output_final_state=True)
    close(out, torch.stack(expected, dim=-2))
    close(final, S)


@pytest.mark.parametrize("chunk_size", [1, 4, 8, 37, 64])
def test_chunked_equals_recurrent(chunk_size) -> None:
    q, k = unit(Q), unit(K)
    rec, s_rec = gated_delta_rule(q, k, V, G, BETA, initial_state=STATE, output_final_state=True)
    out, s_out = gated_delta_rule(
        q, k, V, G, BETA, chunk_size=chunk_size, initial_state=STATE, output_final_state=True
    )
    close(out, rec)
    close(s_out, s_rec)


def qwen3_next_rule(fn, chunk_size=None):
    """Call a transformers function as Qwen3NextGatedDeltaNet does, in our layout."""
    t = lambda x: x.transpose(1, 2)  # (B, H, L, ...) <-> (B, L, H, ...)
    extra = {} if chunk_size is None else {"chunk_size": chunk_size}
    out, state = fn(
        t(Q), t(K), t(V), g=t(G), beta=t(BETA), initial_state=STATE,
        output_final_state=True, use_qk_l2norm_in_kernel=True, **extra,
    )  # fmt: skip
    return t(out), state


@pytest.mark.parametrize("chunk_size", [None, 8, 64])
def test_matches_transformers_qwen3_next(chunk_size) -> None:
    if chunk_size is None:
        theirs, their_state = qwen3_next_rule(qwen3_next.torch_recurrent_gated_delta_rule)
    else:
        theirs, their_state = qwen3_next_rule(qwen3_next.torch_chunk_gated_delta_rule, chunk_size)
    ours, state = gated_delta_rule(
        unit(Q), unit(K), V, G, BETA, chunk_size=chunk_size, initial_state=STATE,
        output_final_state=True,
    )  # fmt: skip
    close(ours, theirs)
    close(state, their_state)
    assert (ours - theirs).abs().max() < 1e-5


def test_a_state_carries_a_sequence_across_calls() -> None:
    q, k = unit(Q), unit(K)
    whole = gated_delta_rule(q, k, V, G, BETA, chunk_size=8)
    first, state = gated_delta_rule(
        q[..., :20, :], k[..., :20, :], V[..., :20, :], G[..., :20], BETA[..., :20],
        chunk_size=8, output_final_state=True,
    )  # fmt: skip
    rest = gated_delta_rule(
        q[..., 20:, :], k[..., 20:, :], V[..., 20:, :], G[..., 20:], BETA[..., 20:],
        initial_state=state,
    )  # fmt: skip
    close(torch.cat([first, rest], dim=-2), whole)


def test_gated_delta_rule_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match=r"\bg\b"):
        gated_delta_rule(Q, K, V, -G, BETA)
    with pytest.raises(ValueError, match=r"\(B, H, L\)"):
        gated_delta_rule(Q, K, V, G[..., :5], BETA)
    with pytest.raises(ValueError, match="chunk_size"):
        gated_delta_rule(Q, K, V, G, BETA, chunk_size=0)
    with pytest.raises(ValueError, match="initial_state"):
        gated_delta_rule(Q, K, V, G, BETA, initial_state=STATE[:, :2])
    with pytest.raises(TypeError, match="query"):
        gated_delta_rule(Q.numpy(), K, V, G, BETA)


# --- the layer -------------------------------------------------------------------


def qwen3_next_layer(heads=4, head_dim=8, d_model=32):
    config = Qwen3NextConfig(
        hidden_size=d_model, linear_num_key_heads=heads, linear_num_value_heads=heads,
        linear_key_head_dim=head_dim, linear_value_head_dim=head_dim,
        linear_conv_kernel_dim=4, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, intermediate_size=32, vocab_size=16,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
    )  # fmt: skip
    assert config.layer_types[0] == "linear_attention"
    theirs = qwen3_next.Qwen3NextGatedDeltaNet(config, layer_idx=0).eval()
    with torch.no_grad():
        for p in theirs.parameters():  # random, not the init's ones/zeros
            p.copy_(torch.randn_like(p) * 0.3)
        theirs.A_log.copy_(torch.empty(heads).uniform_(0.01, 16).log())
    ours = GatedDeltaNet(d_model, heads, head_dim, conv_size=4, chunk_size=8).eval()
    w = theirs.in_proj_qkvz.weight.view(heads, 4, head_dim, d_model)  # per head: q k v z
    ab = theirs.in_proj_ba.weight.view(heads, 2, d_model)  # per head: b a
    with torch.no_grad():
        for i, proj in enumerate((ours.W_q, ours.W_k, ours.W_v, ours.W_z)):
            proj.weight.copy_(w[:, i].reshape(heads * head_dim, d_model))
        ours.W_b.weight.copy_(ab[:, 0])
        ours.W_a.weight.copy_(ab[:, 1])
        ours.conv.weight.copy_(theirs.conv1d.weight)
        for name in ("A_log", "dt_bias"):
            getattr(ours, name).copy_(getattr(theirs, name))
        ours.norm.weight.copy_(theirs.norm.weight)
        ours.W_o.weight.copy_(theirs.out_proj.weight)
    return ours, theirs


def test_the_layer_is_qwen3_next_gated_deltanet() -> None:
    torch.manual_seed(1)
    ours, theirs = qwen3_next_layer()
    x = torch.randn(2, 21, 32)  # (B, L, d_model)
    with torch.no_grad():
        expected, got = theirs(x), ours(x)
    assert expected.abs().mean() > 0.01  # a real signal, not zeros
    close(got, expected)
    with torch.no_grad():  # the short conv matters: without it, another output
        ours.conv.weight.zero_()
        assert (ours(x) - expected).abs().max() > 0.01


@pytest.mark.parametrize("conv_size", [4, 1, None])
def test_the_layer_continues_from_its_cache(conv_size) -> None:
    torch.manual_seed(2)
    layer = GatedDeltaNet(32, 4, conv_size=conv_size, chunk_size=4).eval()
    x = torch.randn(2, 11, 32)
    cache = LayerStateCache()
    with torch.no_grad():
        whole = layer(x)
        parts = [layer(x[:, :6], kv_cache=cache)]  # prefill 6, then one token at a time
        parts += [layer(x[:, t : t + 1], kv_cache=cache) for t in range(6, 11)]
    close(torch.cat(parts, dim=1), whole)
    assert cache.position == 11 and len(cache) == 0
    expected = 2 * 4 * 8 * 8 * 4 + (0 if conv_size is None else 2 * 96 * (conv_size - 1) * 4)
    assert cache.nbytes == expected  # fixed: state + the conv's last inputs


def test_the_layer_refuses_a_foreign_cache() -> None:
    layer = GatedDeltaNet(32, 4)
    cache = LayerStateCache()
    with torch.no_grad():
        layer(torch.randn(2, 3, 32), kv_cache=cache)
    with pytest.raises(ValueError, match="kv_cache"):
        layer(torch.randn(3, 1, 32), kv_cache=cache)
    with pytest.raises(TypeError, match="LayerStateCache"):
        layer(torch.randn(2, 1, 32), kv_cache={})
    with pytest.raises(ValueError, match="d_model"):
        layer(torch.randn(2, 1, 16))
    x = torch.randn(2, 3, 32)
    for bad in ({"mask": torch.ones(3, 3, dtype=torch.bool)}, {"need_weights": True},
                {"is_causal": False}, {"key": x.clone()}):  # fmt: skip
        with pytest.raises(ValueError, match="causally with itself"):
            layer(x, **bad)
    assert layer(x, x, x, is_causal=True, positions=torch.arange(3)).shape == x.shape


def test_the_layer_refuses_a_bad_chunk_when_built() -> None:
    for bad in (0, -4):
        with pytest.raises(ValueError, match="chunk_size"):
            GatedDeltaNet(32, 4, chunk_size=bad)
    with pytest.raises(TypeError, match="chunk_size"):
        GatedDeltaNet(32, 4, chunk_size=2.5)
