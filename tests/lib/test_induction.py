"""Tests for attention_lib.induction: repeated random patterns and their accuracy."""

from __future__ import annotations

import pytest
import torch

from attention_lib import (
    CausalLM,
    make_induction_data,
    predictable_accuracy,
    predictable_positions,
)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_sequences_repeat_a_pattern_of_distinct_tokens() -> None:
    x, y, periods = make_induction_data(
        200, 20, 12, min_period=3, max_period=8, generator=seeded(0)
    )
    assert x.shape == y.shape == (200, 20) and periods.shape == (200,)
    assert x.dtype == y.dtype == periods.dtype == torch.int64
    assert torch.equal(y[:, :-1], x[:, 1:])  # targets are the next tokens
    assert periods.min() == 3 and periods.max() == 8
    for row, target, n in zip(x.tolist(), y.tolist(), periods.tolist()):
        full = row + target[-1:]  # the L + 1 tokens
        assert len(set(full[:n])) == n  # one pattern of n distinct tokens ...
        assert all(full[i] == full[i - n] for i in range(n, 21))  # ... repeated


def test_the_same_generator_seed_gives_the_same_data() -> None:
    a = make_induction_data(5, 9, 7, generator=seeded(4))
    b = make_induction_data(5, 9, 7, generator=seeded(4))
    assert all(torch.equal(s, t) for s, t in zip(a, b))


def test_default_max_period_shows_every_pattern_twice() -> None:
    _, _, periods = make_induction_data(500, 10, 30, generator=seeded(1))
    assert periods.max() == 5 and periods.min() == 2


def test_predictable_positions_start_one_period_in() -> None:
    mask = predictable_positions(torch.tensor([2, 4]), 5)
    assert mask.tolist() == [[False, False, True, True, True], [False, False, False, False, True]]


class Oracle(torch.nn.Module):
    """Logits that copy the token one period back: right on every predictable position."""

    def __init__(self, periods: torch.Tensor, vocab: int) -> None:
        super().__init__()
        self.periods, self.vocab = periods, vocab

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        index = (torch.arange(x.shape[1]) - self.periods[:, None] + 1).clamp(min=0)
        return torch.nn.functional.one_hot(x.gather(1, index), self.vocab).float()


def test_predictable_accuracy_counts_only_the_predictable_positions() -> None:
    x, y, periods = make_induction_data(50, 16, 10, generator=seeded(2))
    assert predictable_accuracy(Oracle(periods, 10), x, y, periods) == 1.0
    wrong = Oracle(periods, 10)
    wrong.periods = periods + 1  # copies the wrong token everywhere
    assert predictable_accuracy(wrong, x, y, periods) == 0.0
    model = CausalLM(10, 16, 2, 1, 16).train()
    predictable_accuracy(model, x, y, periods)
    assert model.training  # the mode is restored


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_period"):
        make_induction_data(3, 10, 4, max_period=5, generator=seeded(0))
    with pytest.raises(ValueError, match="max_period"):
        make_induction_data(3, 10, 9, min_period=4, max_period=3, generator=seeded(0))
    with pytest.raises(TypeError, match="generator"):
        make_induction_data(3, 10, 9, generator=0)
    with pytest.raises(TypeError, match="seq_len"):
        make_induction_data(3, 10.0, 9, generator=seeded(0))
    x, y, periods = make_induction_data(4, 6, 5, generator=seeded(0))
    model = CausalLM(5, 8, 2, 1, 6)
    with pytest.raises(ValueError, match="periods"):
        predictable_accuracy(model, x, y, periods[:2])
    with pytest.raises(ValueError, match="targets"):
        predictable_accuracy(model, x, y[:, :3], periods)
    with pytest.raises(TypeError, match="periods"):
        predictable_positions(periods.float(), 6)
