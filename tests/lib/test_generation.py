"""Tests for attention_lib.generation: greedy decoding, sampling and their errors."""

from __future__ import annotations

import pytest
import torch

from attention_lib import CausalLM, generate

V = 17


@pytest.fixture(scope="module")
def lm() -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(V, 32, 4, 2, 40)


def prompt(batch: int = 3, length: int = 5) -> torch.Tensor:
    return torch.randint(V, (batch, length), generator=torch.Generator().manual_seed(2))


def test_greedy_tokens_are_identical_with_and_without_the_cache(lm: CausalLM) -> None:
    p = prompt()
    cached = generate(lm, p, 35)
    assert cached.shape == (3, 40) and torch.equal(cached[:, :5], p)
    assert torch.equal(cached, generate(lm, p, 35, use_cache=False))


def test_greedy_step_is_the_argmax_of_the_full_pass(lm: CausalLM) -> None:
    out = generate(lm, prompt(), 6)
    with torch.no_grad():
        logits = lm(out[:, :-1])  # (B, 10, V)
    assert torch.equal(out[:, 5:], logits[:, 4:].argmax(-1))


def test_generation_restores_the_training_mode(lm: CausalLM) -> None:
    lm.train()
    generate(lm, prompt(), 2)
    assert lm.training
    lm.eval()
    generate(lm, prompt(), 2)
    assert not lm.training


def test_zero_new_tokens_returns_the_prompt(lm: CausalLM) -> None:
    assert torch.equal(generate(lm, prompt(), 0), prompt())


def manual_sample(
    lm: CausalLM,
    p: torch.Tensor,
    n: int,
    temperature: float,
    top_k: int | None,
    generator: torch.Generator,
) -> torch.Tensor:
    """The sampling recipe written out, rerunning the full sequence every step."""
    out = p
    with torch.no_grad():
        for _ in range(n):
            logits = lm(out)[:, -1] / temperature  # (B, V)
            if top_k is not None:
                kth = logits.topk(top_k).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            new = torch.multinomial(logits.softmax(-1), 1, generator=generator)
            out = torch.cat([out, new], 1)
    return out


@pytest.mark.parametrize("temperature, top_k", [(1.0, None), (0.5, 3), (2.0, 1), (1.0, V)])
def test_sampling_follows_temperature_and_top_k(
    lm: CausalLM, temperature: float, top_k: int | None
) -> None:
    lm.eval()
    p = prompt()
    out = generate(
        lm,
        p,
        20,
        do_sample=True,
        temperature=temperature,
        top_k=top_k,
        generator=torch.Generator().manual_seed(5),
    )
    expected = manual_sample(lm, p, 20, temperature, top_k, torch.Generator().manual_seed(5))
    assert torch.equal(out, expected)
    if top_k == 1:  # only the arg-max survives: greedy
        assert torch.equal(out, generate(lm, p, 20))


def test_sampling_draws_from_the_top_k_only(lm: CausalLM) -> None:
    lm.eval()
    p = prompt(batch=64, length=1)
    out = generate(lm, p, 1, do_sample=True, top_k=2, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        top2 = lm(p)[:, -1].topk(2).indices  # (B, 2)
    assert (out[:, 1:] == top2).any(-1).all()
    wide = generate(
        lm, p, 1, do_sample=True, temperature=50.0, generator=torch.Generator().manual_seed(0)
    )
    assert not (wide[:, 1:] == top2).any(-1).all()  # a flat softmax goes elsewhere too


def test_clear_errors(lm: CausalLM) -> None:
    with pytest.raises(ValueError, match="max_len=40"):
        generate(lm, prompt(), 36)
    with pytest.raises(ValueError, match="empty"):
        generate(lm, torch.zeros(1, 0, dtype=torch.long), 3)
    with pytest.raises(TypeError, match="integer tensor"):
        generate(lm, prompt().float(), 3)
    with pytest.raises(TypeError, match=r"prompt\[0\]"):
        generate(lm, [[1, 2]], 3)
    with pytest.raises(ValueError, match="temperature"):
        generate(lm, prompt(), 3, do_sample=True, temperature=0.0)
    with pytest.raises(ValueError, match="temperature"):
        generate(lm, prompt(), 3, do_sample=True, temperature=-1.0)
    generate(lm, prompt(), 3, temperature=0.0)  # greedy ignores the temperature
    with pytest.raises(ValueError, match="top_k"):
        generate(lm, prompt(), 3, do_sample=True, top_k=0)
    with pytest.raises(ValueError, match="prompt"):
        generate(lm, torch.tensor([1, 2]), 3)
    with pytest.raises(ValueError, match="vocab_size"):
        generate(lm, torch.tensor([[1, V]]), 3)
    with pytest.raises(TypeError, match="CausalLM"):
        generate(torch.nn.Linear(2, 2), prompt(), 3)
    with pytest.raises(TypeError, match="max_new_tokens"):
        generate(lm, prompt(), 2.0)
    with pytest.raises(TypeError, match="generator"):
        generate(lm, prompt(), 2, do_sample=True, generator=0)


def test_every_step_is_a_public_call_of_the_model(lm: CausalLM) -> None:
    """Each step calls the model as a user would (no private entry, no global flag):
    a forward hook sees the prompt, then one new token per step."""
    lengths = []
    hook = lm.register_forward_hook(lambda module, args, output: lengths.append(args[0].shape))
    try:
        assert generate(lm, prompt(), 4).shape == (3, 9)
        assert generate(lm, prompt(), 2, use_cache=False).shape == (3, 7)
    finally:
        hook.remove()
    assert lengths == [(3, 5), (3, 1), (3, 1), (3, 1), (3, 5), (3, 6)]
