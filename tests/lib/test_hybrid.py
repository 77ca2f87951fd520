"""Hybrid models (chapter 18): ``CausalLM(layer_types=[..., "linear", ...])``,
and with Kimi Linear's ``"kda"`` and Mamba-2's ``"mamba2"`` layers (checked
against transformers' layers in test_kda.py and test_mamba2.py).

A ``"linear"`` layer is a Gated DeltaNet (attention_lib.gated_deltanet, checked
against Qwen3-Next's layer in test_linear_attention.py) in place of the attention
sublayer; its cache is a fixed-size state. Oracle: the model's own full pass
(prefill + decode through the cache must give the same logits), and generation
without a cache.
"""

from __future__ import annotations

import pytest
import torch

from attention_lib import CausalLM, KVCache, LayerKVCache, generate
from attention_lib.gated_deltanet import GatedDeltaNet, LayerStateCache

HYBRID = ["linear", "linear", "linear", "full"]  # Qwen3-Next's 3:1


def model(kinds=HYBRID, **options) -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(13, 32, 2, len(kinds), max_len=64, layer_types=kinds, **options).eval()


KIMI, NEMOTRON = ["kda", "kda", "kda", "full"], ["mamba2", "full", "mamba2"]  # KDA, Mamba-2
KINDS = [HYBRID, ["linear"] * 2, ["full", "linear", "sliding"], KIMI, NEMOTRON]
RECURRENT = ("linear", "kda", "mamba2")  # a fixed-size state


@pytest.mark.parametrize("positional", ["rope", "learned"])
@pytest.mark.parametrize("kinds", KINDS, ids=str)
def test_prefill_and_decode_equal_the_full_pass(kinds, positional) -> None:
    lm = model(kinds, positional=positional, window=4)
    tokens = torch.randint(0, 13, (2, 30), generator=torch.Generator().manual_seed(1))
    cache = KVCache()
    with torch.no_grad():
        whole = lm(tokens)
        parts = [lm(tokens[:, :20], cache=cache)]  # a prefill of 20 (chunked: 2 chunks)
        parts += [lm(tokens[:, t : t + 1], cache=cache) for t in range(20, 30)]
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, atol=2e-5, rtol=1e-5)
    assert cache.position == 30
    for kind, layer_cache in zip(kinds, cache.layers):
        expected = LayerStateCache if kind in RECURRENT else LayerKVCache
        assert type(layer_cache) is expected and layer_cache.position == 30


def test_the_state_does_not_grow_the_keys_do() -> None:
    lm, cache, sizes = model(), KVCache(), []
    tokens = torch.randint(0, 13, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for t in range(40):
            lm(tokens[:, t : t + 1], cache=cache)
            sizes.append([layer.nbytes for layer in cache.layers])
    state = 2 * 16 * 16 * 4 + 3 * 32 * 3 * 4  # (B H d d) state + the conv's last 3 inputs
    assert all(s[:3] == [state] * 3 for s in sizes)  # the linear layers: constant
    assert [s[3] for s in sizes] == [2 * 2 * 16 * 4 * (t + 1) for t in range(40)]  # K and V
    assert len(cache) == 40  # the full layer stores every token


@pytest.mark.parametrize("kinds", [HYBRID, KIMI, NEMOTRON], ids=str)
def test_generation_with_the_hybrid_cache_equals_recomputing(kinds) -> None:
    lm = model(kinds)
    prompt = torch.randint(0, 13, (3, 7), generator=torch.Generator().manual_seed(3))
    cached = generate(lm, prompt, 12)
    assert torch.equal(cached, generate(lm, prompt, 12, use_cache=False))


def test_a_linear_layer_is_a_gated_deltanet_and_trains() -> None:
    lm = model().train()
    assert [type(layer.self_attn) for layer in lm.blocks.layers][:3] == [GatedDeltaNet] * 3
    tokens = torch.randint(0, 13, (4, 16))
    lm(tokens).sum().backward()
    grads = [p.grad for p in lm.blocks.layers[0].self_attn.parameters()]
    assert all(g is not None and bool(g.abs().sum() > 0) for g in grads)


@pytest.mark.parametrize("kinds", [HYBRID, KIMI, NEMOTRON], ids=str)
def test_what_a_linear_layer_cannot_do_is_refused(kinds) -> None:
    with pytest.raises(ValueError, match="no dropout"):
        model(kinds, dropout=0.1)
    with pytest.raises(ValueError, match="qk_norm"):
        model(kinds, qk_norm=True)
    lm, tokens = model(kinds), torch.randint(0, 13, (2, 5))
    with pytest.raises(ValueError, match="no weights"):
        lm(tokens, need_weights=True)
    padded = torch.cat([torch.zeros(2, 3, dtype=tokens.dtype), tokens], dim=1)  # left padding
    keep = torch.arange(8) >= 3  # (8,): the padding is zeroed, so it writes nothing
    positions = (torch.arange(8) - 3).clamp(min=0)
    alone, got = lm(tokens), lm(padded, mask=keep.expand(2, 8), positions=positions)
    assert (got[:, 3:] - alone).abs().max() < 1e-5  # a left-padded row computes what it alone does
    full_cache = KVCache()
    model(["full"] * len(kinds))(tokens, cache=full_cache)  # another model's layers
    with pytest.raises(ValueError, match="layer_types"):
        lm(tokens[:, :1], cache=full_cache)


def test_chunked_attention_is_decided_by_the_layer_types() -> None:
    # A linear layer has a chunk of its own (the delta rule's), which is not
    # chunked attention: the padding mask is not refused as chunked attention;
    # a model without layer_types and with chunk_size
    # has chunked attention in every layer.
    tokens, mask = torch.randint(0, 13, (2, 5)), torch.ones(2, 5, dtype=torch.bool)
    lm = model(["linear", "full"], chunk_size=4)  # no 'chunked' layer: span unused
    assert lm.blocks.layers[0].self_attn.chunk_size == 64
    assert lm(tokens, mask=mask).shape == (2, 5, 13)
    torch.manual_seed(0)
    everywhere = CausalLM(13, 32, 2, 2, max_len=64, chunk_size=4).eval()
    with pytest.raises(ValueError, match="chunked layers"):
        everywhere(tokens, mask=mask)


@pytest.mark.parametrize("kinds", [KIMI, NEMOTRON], ids=str)
def test_rollback_through_a_snapshot(kinds) -> None:
    """Speculative decoding's rollback (chapter 13) works for the KDA and
    Mamba-2 states as for Gated DeltaNet's: snapshot, read 5, crop 5."""
    lm = model(kinds)
    tokens = torch.randint(0, 13, (1, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = lm(tokens)[:, 10:]
        cache = KVCache()
        lm(tokens[:, :10], cache=cache)
        cache.snapshot()
        lm(torch.randint(0, 13, (1, 5)), cache=cache)  # rejected guesses
        cache.crop(5)
        got = lm(tokens[:, 10:], cache=cache)
    assert cache.position == 16 and (got - want).abs().max() < 1e-5
