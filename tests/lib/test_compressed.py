"""DeepSeek-V4's compressed attention (chapter 18) against 🤗 transformers 5.24.

Oracle: ``DeepseekV4HCACompressor``, ``DeepseekV4CSACompressor`` and its
``DeepseekV4Indexer`` of a tiny random ``DeepseekV4Config`` (nothing
downloaded), called as ``DeepseekV4Attention`` calls them (``hidden_states``,
the query latent, ``position_ids``, no cache): the compressed entries, the
causal block bias of HCA and the top-k block bias of CSA. The attention over
the chosen entries is checked against a dense masked reference computed
independently (a loop over each query's chosen entries).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download

import pytest
import torch
from transformers import DeepseekV4Config
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as v4

from attention_lib.compressed import (
    CompressedIndexer,
    Compressor,
    CompressorCache,
    compressed_attention,
    compressed_keep,
)
from attention_lib.dsa import top_k_keys, top_k_mask

RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}


def config() -> DeepseekV4Config:
    return DeepseekV4Config(
        hidden_size=32, head_dim=16, partial_rotary_factor=0.25, q_lora_rank=16,
        index_n_heads=4, index_head_dim=8, index_topk=3, compress_rates=RATES,
        sliding_window=8, num_attention_heads=2, num_hidden_layers=2, vocab_size=64,
        o_groups=1, o_lora_rank=8,
    )  # fmt: skip


def theirs(kind: type) -> torch.nn.Module:
    module = kind(config()).eval()
    with torch.no_grad():
        for p in module.parameters():  # random, not the init's empty tensors
            p.copy_(torch.randn_like(p) * 0.5)
    return module


def inputs(length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(length)
    positions = torch.arange(length)
    return torch.randn(2, length, 32), torch.randn(2, length, 16), positions


@pytest.mark.parametrize("kind", [v4.DeepseekV4HCACompressor, v4.DeepseekV4CSACompressor])
@pytest.mark.parametrize("length", [3, 8, 23])  # no window closed, one, several (+ a rest)
def test_compressor_equals_deepseek_v4_and_streams(kind, length) -> None:
    module = theirs(kind)
    x, latent, positions = inputs(length)
    ours = Compressor.from_hf(module)
    assert ours.overlap == (kind is v4.DeepseekV4CSACompressor) and ours.rope_dim == 4
    with torch.no_grad():
        expected, bias = module(x, latent, positions.expand(2, -1), None, 0)
        got = ours(x)
        cache = CompressorCache()  # a prefill of 3, then one token at a time
        steps = [ours(x[:, :3], cache)] + [ours(x[:, t : t + 1], cache) for t in range(3, length)]
    assert got.shape == (2, length // ours.rate, 16)
    torch.testing.assert_close(got, expected[:, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(steps[-1], got, atol=1e-5, rtol=1e-5)  # streamed == whole
    assert cache.position == length and len(cache) == length // ours.rate
    if kind is v4.DeepseekV4HCACompressor and bias is not None:  # every closed entry
        assert torch.equal(compressed_keep(positions, len(cache), ours.rate), bias[0, 0] == 0)


def test_csa_top_k_selection_equals_deepseek_v4() -> None:
    module = theirs(v4.DeepseekV4CSACompressor)
    x, latent, positions = inputs(23)
    indexer = CompressedIndexer.from_hf(module.indexer)
    with torch.no_grad():
        _, bias = module(x, latent, positions.expand(2, -1), None, 0)
        scores = indexer(x, latent, positions)  # (B, L, T), -inf where not closed
    indices, valid = top_k_keys(scores, 3)
    chosen, read = top_k_mask(indices, valid, scores.shape[-1]), bias[:, 0] == 0  # (B, L, T)
    for b, t in (chosen != read).any(-1).nonzero().tolist():  # a tie (torch.topk: either)
        assert torch.equal(scores[b, t][chosen[b, t]].sort()[0], scores[b, t][read[b, t]].sort()[0])
    assert (chosen == read).all(-1).float().mean() > 0.9  # ties are rare
    assert chosen.sum(-1).tolist()[0] == [min(3, (t + 1) // 4) for t in range(23)]


def test_compressed_attention_is_the_dense_masked_reference() -> None:
    """Sliding window + chosen entries in one softmax == a loop over each query's keys."""
    torch.manual_seed(0)
    B, H, L, T, d, window = 2, 2, 12, 3, 8, 4
    q, keys, entries = torch.randn(B, H, L, d), torch.randn(B, L, d), torch.randn(B, T, d)
    t = torch.arange(L)
    keep = ((t[:, None] - t[None]) >= 0) & ((t[:, None] - t[None]) < window)  # (L, L)
    scores = torch.randn(B, L, T).masked_fill(~compressed_keep(t, T, 4), -torch.inf)
    chosen = top_k_mask(*top_k_keys(scores, 2), T)  # (B, L, T)
    got = compressed_attention(q, keys, entries, keep[None], chosen)
    for b, h, i in [(0, 0, 0), (1, 1, 7), (0, 1, 11)]:
        kv = torch.cat([keys[b, keep[i]], entries[b, chosen[b, i]]])  # (n, d)
        p = (kv @ q[b, h, i] / d**0.5).softmax(-1)
        torch.testing.assert_close(got[b, h, i], p @ kv, atol=1e-6, rtol=1e-6)
    assert chosen[0, 3].sum() == 1 and chosen[0, 11].sum() == 2  # closed entries: 1, then 3


def test_refusals() -> None:
    with pytest.raises(TypeError, match="DeepSeek-V4 compressor"):
        Compressor.from_hf(torch.nn.Linear(2, 2))
    cfg = config()
    cfg.rope_parameters["compress"] |= {"rope_type": "yarn", "factor": 4.0}
    with pytest.raises(ValueError, match="default compressed RoPE"):
        Compressor.from_hf(v4.DeepseekV4HCACompressor(cfg))
