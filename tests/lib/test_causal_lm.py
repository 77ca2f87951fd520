"""Tests for attention_lib.causal_lm: the decoder-only model and its cached forward."""

from __future__ import annotations

import pytest
import torch

from attention_lib import CausalLM, Encoder, KVCache

V = 13


def model(**kwargs: object) -> CausalLM:
    torch.manual_seed(0)
    options = {"d_model": 32, "num_heads": 4, "num_layers": 2, "max_len": 24, **kwargs}
    return CausalLM(V, **options).eval()


def tokens(batch: int = 2, length: int = 20, seed: int = 1) -> torch.Tensor:
    return torch.randint(V, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_logits_shape_and_the_blocks_are_the_encoder() -> None:
    lm = model()
    assert lm(tokens()).shape == (2, 20, V)
    assert isinstance(lm.blocks, Encoder) and lm.num_layers == 2


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", None])
@pytest.mark.parametrize("backend", ["lib", "torch"])
def test_incremental_logits_through_the_cache_equal_the_full_pass(
    positional: str | None, backend: str
) -> None:
    lm, x = model(positional=positional, backend=backend), tokens()
    with torch.no_grad():
        full = lm(x)  # (B, L, V)
        cache = KVCache()
        chunks = [lm(x[:, :7], cache=cache)]  # a prompt of 7 tokens
        chunks += [lm(x[:, i : i + 1], cache=cache) for i in range(7, 15)]  # one by one
        chunks.append(lm(x[:, 15:], cache=cache))  # five at once, bottom-right mask
    torch.testing.assert_close(torch.cat(chunks, 1), full, atol=1e-5, rtol=0)
    assert len(cache) == 20


def test_changing_a_later_token_never_changes_earlier_logits() -> None:
    lm, x = model(), tokens()
    with torch.no_grad():
        before = lm(x)
        for t in (0, 9, 19):
            changed = x.clone()
            changed[:, t] = (changed[:, t] + 1) % V
            after = lm(changed)
            assert torch.equal(after[:, :t], before[:, :t]), t
            assert not torch.allclose(after[:, t], before[:, t])


def test_weights_with_a_cache_are_causal_over_all_keys() -> None:
    lm, x = model(), tokens()
    cache = KVCache()
    with torch.no_grad():
        lm(x[:, :10], cache=cache)
        _, weights = lm(x[:, 10:13], cache=cache, need_weights=True)
    assert weights.shape == (2, 2, 4, 3, 13)  # (B, layers, H, L, T + L)
    allowed = torch.ones(3, 13, dtype=torch.bool).tril(diagonal=10)
    assert (weights[..., ~allowed] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 4, 3))


def test_gradients_flow_and_training_mode_uses_dropout() -> None:
    lm = model(dropout=0.5).train()
    x = tokens()
    lm(x).sum().backward()
    assert all(p.grad is not None for p in lm.parameters())
    assert not torch.equal(lm(x), lm(x))  # dropout is active in train()


def test_bad_arguments() -> None:
    lm = model()
    with pytest.raises(TypeError, match="integer tensor"):
        lm(torch.rand(1, 3))
    with pytest.raises(ValueError, match="length L"):
        lm(torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \(B, L\)"):
        lm(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="vocab_size=13"):
        lm(torch.tensor([[0, 13]]))
    with pytest.raises(ValueError, match="max_len=24"):
        lm(tokens(length=25))
    with pytest.raises(TypeError, match="KVCache"):
        lm(tokens(), cache={})
    cache = KVCache()
    lm(tokens(length=20), cache=cache)
    with pytest.raises(ValueError, match="20 cached \\+ 5 new tokens"):
        lm(tokens(length=5), cache=cache)
    with pytest.raises(ValueError, match="B=3"):
        lm(tokens(batch=3, length=1), cache=cache)
    with pytest.raises(ValueError, match="layers"):
        model(num_layers=3)(tokens(length=1), cache=cache)
    with pytest.raises(ValueError, match="float64"):
        model().double()(tokens(length=1), cache=cache)
    with pytest.raises(ValueError, match="positional"):
        CausalLM(V, positional="rotary")
    with pytest.raises(TypeError, match="vocab_size"):
        CausalLM(2.5)
