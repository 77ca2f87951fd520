"""Chapter 17's DeepSeek Sparse Attention: the lightning indexer against 🤗
transformers' DeepseekV32Indexer (tiny random configs, nothing downloaded), the
top-k tie-break, sparse against dense attention, and cached decoding."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download

import pytest
import torch
from transformers import DeepseekV32Config
from transformers.masking_utils import create_causal_mask
from transformers.models.deepseek_v32.modeling_deepseek_v32 import (
    DeepseekV32Attention,
    DeepseekV32RotaryEmbedding,
)

from attention_lib import (
    LatentKVCache,
    MultiHeadLatentAttention,
    causal_mask,
    lightning_indexer,
    top_k_keys,
)
from attention_lib.dsa import (
    LightningIndexer,
    attention_target,
    indexer_kl_loss,
    top_k_mask,
    top_k_recall,
)

D_MODEL, HEADS, TOPK, L = 64, 4, 4, 12
SIZES = {"kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6}


class HF:
    """A DeepseekV32Attention (MLA + indexer) with random weights, called as
    DeepseekV32Model calls it (its rotary embedding, its causal mask built without
    the is-causal skip, eager attention)."""

    def __init__(self, seed: int):
        self.config = DeepseekV32Config(
            hidden_size=D_MODEL,
            num_attention_heads=HEADS,
            num_key_value_heads=HEADS,
            num_hidden_layers=1,
            vocab_size=32,
            q_lora_rank=24,
            index_topk=TOPK,
            index_head_dim=8,
            index_n_heads=2,
            head_dim=SIZES["qk_rope_head_dim"],
            **SIZES,
        )
        self.config._attn_implementation = "eager"
        torch.manual_seed(seed)
        self.layer = DeepseekV32Attention(self.config, layer_idx=0).eval()
        with torch.no_grad():
            for name, p in self.layer.named_parameters():
                p.normal_(1.0 if "norm" in name and "weight" in name else 0.0, 0.3)
        self.rotary = DeepseekV32RotaryEmbedding(self.config)
        self.x = torch.randn(2, L, D_MODEL)
        self.positions = torch.arange(L)[None]
        self.mask = create_causal_mask(
            config=self.config,
            inputs_embeds=self.x,
            attention_mask=None,
            cache=None,
            position_ids=self.positions,
            allow_is_causal_skip=False,
        )
        self.angles = self.rotary(self.x, self.positions)

    def chosen(self) -> torch.Tensor:
        """The indexer's top-k indices, called as DeepseekV32Attention calls it."""
        with torch.no_grad():
            q_resid = self.layer.q_a_layernorm(self.layer.q_a_proj(self.x))
            return self.layer.indexer(
                self.x, q_resid, self.angles, self.mask[:, 0], self.positions
            ).long()

    def output(self, need_weights: bool = False):
        """The layer's output (and its eager attention weights (B, H, L, L))."""
        with torch.no_grad():
            out, weights = self.layer(
                self.x, self.angles, self.mask, cache=None, position_ids=self.positions
            )
        return (out, weights) if need_weights else out


def our_scores(m: MultiHeadLatentAttention, x: torch.Tensor) -> torch.Tensor:
    """The module's indexer scores of a full causal pass, (B, L, L)."""
    from attention_lib.rope import rope_cos_sin

    cos, sin = rope_cos_sin(torch.arange(x.shape[1]), 4, base=m.rope_base, dtype=x.dtype)
    q_source = m.q_norm(m.W_dq(x))
    keys = m.indexer.keys(x, cos, sin)
    return m.indexer(x, q_source, keys, causal_mask(x.shape[1]), cos, sin)


def tie_free_rows(scores: torch.Tensor, k: int) -> torch.Tensor:
    """(B, L) True where the k-th and (k+1)-th best scores differ (or <= k keys)."""
    best = scores.sort(dim=-1, descending=True).values
    if best.shape[-1] <= k:
        return torch.ones(best.shape[:-1], dtype=torch.bool)
    kth, next_ = best[..., k - 1], best[..., k]
    return (kth != next_) | (next_ == float("-inf"))


@pytest.mark.parametrize("seed", range(4))
def test_chosen_keys_equal_deepseek_v32_indexer_on_tie_free_rows(seed):
    hf = HF(seed)
    m = MultiHeadLatentAttention.from_hf(hf.layer)
    assert m.index_topk == TOPK and m.indexer.num_heads == 2
    with torch.no_grad():
        scores = our_scores(m, hf.x)  # (B, L, L)
    ours, valid = top_k_keys(scores, TOPK)
    theirs = hf.chosen()
    rows = tie_free_rows(scores, TOPK)
    assert rows.sum() >= L  # most rows compared
    compared = 0
    for b, s in rows.nonzero().tolist():
        mine = set(ours[b, s][valid[b, s]].tolist())
        assert mine == set(theirs[b, s].tolist()) & set(range(s + 1)), (b, s)
        compared += 1
    assert compared == int(rows.sum())


@pytest.mark.parametrize("absorb", [False, True])
def test_output_equals_deepseek_v32_attention_on_tie_free_rows(absorb):
    hf = HF(0)
    m = MultiHeadLatentAttention.from_hf(hf.layer, absorb=absorb)
    with torch.no_grad():
        rows = tie_free_rows(our_scores(m, hf.x), TOPK)
        ours = m(hf.x, is_causal=True)
    torch.testing.assert_close(ours[rows], hf.output()[rows], atol=1e-5, rtol=0)


@pytest.mark.parametrize("absorb", [False, True])
def test_sparse_weights_equal_deepseek_v32_attention_weights_on_tie_free_rows(absorb):
    hf = HF(1)
    m = MultiHeadLatentAttention.from_hf(hf.layer, absorb=absorb)
    with torch.no_grad():
        rows = tie_free_rows(our_scores(m, hf.x), TOPK)  # (B, L)
        _, ours = m(hf.x, is_causal=True, need_weights=True)  # (B, H, L, L)
    _, theirs = hf.output(need_weights=True)
    assert ((ours > 0).sum(-1) <= TOPK).all()  # k keys read, the others weigh 0
    torch.testing.assert_close(
        ours.transpose(1, 2)[rows], theirs.transpose(1, 2)[rows], atol=1e-6, rtol=0
    )


def test_indexer_kl_loss_is_the_kl_divergence_of_the_target():
    torch.manual_seed(0)
    weights = torch.rand(2, 3, L, L, dtype=torch.float64).tril()  # (B, H, L, L), causal
    weights = weights / weights.sum(-1, keepdim=True)
    p = attention_target(weights)  # (B, L, L)
    torch.testing.assert_close(p, weights.mean(1), atol=1e-15, rtol=0)  # rows sum to 1 each
    scores = torch.randn(2, L, L, dtype=torch.float64, requires_grad=True)
    visible = causal_mask(L)
    blocked = scores.masked_fill(~visible, float("-inf"))
    kl = torch.distributions.kl_divergence(
        torch.distributions.Categorical(probs=p), torch.distributions.Categorical(logits=blocked)
    )  # (B, L)
    loss = indexer_kl_loss(blocked, p)
    torch.testing.assert_close(loss, kl.mean(), atol=1e-12, rtol=0)
    loss.backward()
    assert scores.grad[..., ~visible].abs().max() == 0  # no gradient to blocked keys
    exact = indexer_kl_loss(p.log(), p)  # softmax(log p) = p: nothing to learn
    assert exact.abs() < 1e-12
    keep = top_k_mask(*top_k_keys(blocked.detach(), 3), L)  # the sparse stage: 3 keys
    restricted = p.masked_fill(~keep, 0)
    restricted = restricted / restricted.sum(-1, keepdim=True)
    sparse_kl = torch.distributions.kl_divergence(
        torch.distributions.Categorical(probs=restricted),
        torch.distributions.Categorical(logits=blocked.detach().masked_fill(~keep, float("-inf"))),
    )
    sparse = indexer_kl_loss(blocked.detach(), p, keep)
    torch.testing.assert_close(sparse, sparse_kl.mean(), atol=1e-12, rtol=0)


def test_top_k_recall_counts_the_shared_keys():
    target = torch.tensor([[0.1, 0.4, 0.2, 0.3]])  # top 2: keys 1, 3
    assert top_k_recall(torch.tensor([[0.0, 5.0, 1.0, 4.0]]), target, 2) == 1.0
    assert top_k_recall(torch.tensor([[9.0, 5.0, 1.0, 0.0]]), target, 2) == 0.5
    assert top_k_recall(torch.tensor([[9.0, 0.0, 8.0, 0.0]]), target, 2) == 0.0
    rows = torch.tensor([[0.0, 5.0, 1.0, 4.0], [2.0, float("-inf"), float("-inf"), 1.0]])
    assert top_k_recall(rows, target.expand(2, 4), 2) == 1.0  # row 2 keeps both keys: skipped


def test_the_indexer_losses_refuse_bad_input():
    scores, p = torch.randn(2, 4, 4), torch.full((2, 4, 4), 0.25)
    with pytest.raises(ValueError, match="shape"):
        indexer_kl_loss(scores, p[:, :3])
    with pytest.raises(TypeError, match="keep"):
        indexer_kl_loss(scores, p, keep=torch.ones(2, 4, 4))
    with pytest.raises(ValueError, match="row"):
        indexer_kl_loss(scores, p, keep=torch.zeros(2, 4, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="target"):
        top_k_recall(scores, p.long(), 2)
    with pytest.raises(ValueError, match="k = 4"):
        top_k_recall(scores, p, 4)
    with pytest.raises(ValueError, match="weights"):
        attention_target(torch.ones(4, 4))


def test_lightning_indexer_is_the_formula():
    g = torch.Generator().manual_seed(0)
    q, k, w = (
        torch.randn(2, 5, 3, 8, generator=g),
        torch.randn(2, 7, 8, generator=g),
        torch.randn(2, 5, 3, generator=g),
    )
    scores = lightning_indexer(q, k, w, scale=0.5)
    for b, s, t in [(0, 0, 0), (1, 4, 6), (0, 2, 5)]:
        expected = sum(w[b, s, h] * torch.relu(0.5 * q[b, s, h] @ k[b, t]) for h in range(3))
        torch.testing.assert_close(scores[b, s, t], expected, atol=1e-5, rtol=0)
    masked = lightning_indexer(q, k, w, causal_mask(5, 7))
    assert torch.isinf(masked[:, 0, 1:]).all() and torch.isfinite(masked[:, 4, :5]).all()


def test_top_k_ties_go_to_the_earlier_key():
    scores = torch.tensor([[0.0, 3.0, 0.0, 0.0, 1.0, 0.0]])
    indices, valid = top_k_keys(scores, 3)
    assert indices.tolist() == [[1, 4, 0]] and valid.all()
    indices, valid = top_k_keys(torch.tensor([[2.0, float("-inf"), float("-inf")]]), 2)
    assert indices.tolist() == [[0, 1]] and valid.tolist() == [[True, False]]
    assert top_k_mask(indices, valid, 3).tolist() == [[True, False, False]]
    g = torch.Generator().manual_seed(0)  # without ties: the same keys as torch.topk
    scores = torch.randn(50, 30, generator=g)
    mine = top_k_keys(scores, 5)[0].sort(-1).values
    assert torch.equal(mine, scores.topk(5).indices.sort(-1).values)


def sparse_layer(absorb: bool, seed: int = 0) -> MultiHeadLatentAttention:
    torch.manual_seed(seed)
    m = MultiHeadLatentAttention(
        D_MODEL,
        HEADS,
        **SIZES,
        q_lora_rank=12,
        index_topk=TOPK,
        index_heads=2,
        index_head_dim=8,
        absorb=absorb,
    )
    return m.eval()


X = torch.randn(2, L, D_MODEL, generator=torch.Generator().manual_seed(5))


def test_sparse_equals_dense_attention_under_the_top_k_mask():
    m = sparse_layer(absorb=True)  # gathers the k chosen latents of every query
    dense = sparse_layer(absorb=False)
    dense.indexer = None  # the same weights, no indexer: dense MLA
    with torch.no_grad():
        indices, valid = top_k_keys(our_scores(m, X), TOPK)
        keep = top_k_mask(indices, valid, L)[:, None] & causal_mask(L)  # (B, 1, L, L)
        torch.testing.assert_close(m(X, is_causal=True), dense(X, mask=keep), atol=1e-5, rtol=0)
        assert not torch.allclose(m(X, is_causal=True), dense(X, is_causal=True), atol=1e-3)


@pytest.mark.parametrize("absorb", [False, True])
def test_cached_decoding_equals_the_full_pass_with_ties(absorb):
    ties = 0
    for seed in range(3):
        m = sparse_layer(absorb, seed)
        with torch.no_grad():
            ties += int((~tie_free_rows(our_scores(m, X), TOPK)).sum())
            full = m(X, is_causal=True)
            cache = LatentKVCache()
            steps = [m(X[:, :3], is_causal=True, kv_cache=cache)]
            steps += [m(X[:, t : t + 1], is_causal=True, kv_cache=cache) for t in range(3, L)]
        torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
        assert cache.numbers_per_token == 16 + 4 + 8  # latent, RoPE key, indexer key
    assert ties > 0  # the tie-break was needed


def test_bad_input_is_refused_clearly():
    q, k, w = torch.randn(1, 3, 2, 4), torch.randn(1, 5, 4), torch.randn(1, 3, 2)
    with pytest.raises(ValueError, match=r"need query \(B, Lq, H_I, d_I\)"):
        lightning_indexer(q, torch.randn(1, 5, 6), w)
    with pytest.raises(ValueError, match="scale"):
        lightning_indexer(q, k, w, scale=0.0)
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        top_k_keys(torch.randn(3, 3), 0)
    with pytest.raises(TypeError, match="scores must be a floating-point tensor"):
        top_k_keys(torch.ones(3, 3, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="mask must be"):
        sparse_layer(True)(X, mask=torch.ones(2, HEADS, L, L, dtype=torch.bool))
    with pytest.raises(ValueError, match="index_head_dim"):
        MultiHeadLatentAttention(D_MODEL, HEADS, **SIZES, index_topk=2, index_head_dim=2)
    assert isinstance(sparse_layer(True).indexer, LightningIndexer)


def test_sparse_attention_reads_k_keys_however_long_the_context(monkeypatch):
    """The absorbed sparse path hands the attention k gathered keys per query,
    in the prompt and in every decoding step; dense MLA hands it all T."""
    import attention_lib.mla as mla_module

    read = []
    real = mla_module.attend

    def spy(query, key, *args, **kwargs):
        read.append(key.shape[-2])  # keys each query's scores are computed over
        return real(query, key, *args, **kwargs)

    monkeypatch.setattr(mla_module, "attend", spy)
    m = sparse_layer(absorb=True)
    dense = sparse_layer(absorb=True)
    dense.indexer = None
    with torch.no_grad():
        for layer in (m, dense):
            cache = LatentKVCache()
            layer(X, is_causal=True, kv_cache=cache)  # a prompt of L tokens
            for t in range(3):
                layer(X[:, t : t + 1], is_causal=True, kv_cache=cache)
    assert read == [TOPK] * 4 + [L, L + 1, L + 2, L + 3]
