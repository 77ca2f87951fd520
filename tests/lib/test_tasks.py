"""Tests for attention_lib.tasks: toy task data, ideal attention patterns,
accuracy and the training loop."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from attention_lib import (
    TASKS,
    TokenClassifier,
    TrainingHistory,
    count_shared_sequences,
    ideal_attention_share,
    ideal_key_positions,
    make_task_data,
    token_accuracy,
    train_token_classifier,
)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- data ------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", TASKS)
def test_task_data_shapes_dtype_and_range(task: str) -> None:
    x, y = make_task_data(task, 50, 7, 5, generator=gen(0))
    assert x.shape == y.shape == (50, 7)
    assert x.dtype == y.dtype == torch.int64
    assert int(x.min()) >= 0 and int(x.max()) < 5
    # The targets are a rearrangement of the inputs in every task.
    torch.testing.assert_close(x.sort(-1).values, y.sort(-1).values)


def test_task_targets_follow_their_definitions() -> None:
    x, y = make_task_data("reverse", 20, 6, 9, generator=gen(1))
    for i in range(6):
        assert torch.equal(y[:, i], x[:, 5 - i])
    x, y = make_task_data("shift", 20, 6, 9, generator=gen(1), offset=2)
    for i in range(6):
        assert torch.equal(y[:, i], x[:, (i - 2) % 6])
    x, y = make_task_data("sort", 20, 6, 9, generator=gen(1))
    assert torch.all(y[:, 1:] >= y[:, :-1])
    assert torch.equal(y, torch.tensor([sorted(row) for row in x.tolist()]))


def test_task_data_is_deterministic_per_seed() -> None:
    a = make_task_data("reverse", 30, 8, 10, generator=gen(42))
    b = make_task_data("reverse", 30, 8, 10, generator=gen(42))
    c = make_task_data("reverse", 30, 8, 10, generator=gen(43))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_task_data_bad_input() -> None:
    with pytest.raises(ValueError, match="task"):
        make_task_data("copy", 4, 4, 4, generator=gen(0))
    with pytest.raises(TypeError, match="generator"):
        make_task_data("reverse", 4, 4, 4, generator=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seq_len"):
        make_task_data("reverse", 4, 0, 4, generator=gen(0))
    with pytest.raises(ValueError, match="vocab_size"):
        make_task_data("reverse", 4, 4, 1, generator=gen(0))
    with pytest.raises(TypeError, match="num_sequences"):
        make_task_data("reverse", 4.0, 4, 4, generator=gen(0))  # type: ignore[arg-type]


# --- ideal attention ---------------------------------------------------------------------------


def test_ideal_key_positions() -> None:
    assert ideal_key_positions("reverse", 5).tolist() == [4, 3, 2, 1, 0]
    assert ideal_key_positions("shift", 5, offset=2).tolist() == [3, 4, 0, 1, 2]
    with pytest.raises(ValueError, match="task"):
        ideal_key_positions("sort", 5)


@pytest.mark.parametrize("task, offset", [("reverse", 1), ("shift", 1), ("shift", 3)])
def test_ideal_positions_hold_the_answers(task: str, offset: int) -> None:
    x, y = make_task_data(task, 40, 9, 6, generator=gen(2), offset=offset)
    assert torch.equal(x[:, ideal_key_positions(task, 9, offset=offset)], y)


def test_ideal_attention_share_of_perfect_uniform_and_blurred_weights() -> None:
    L = 6
    ideal = ideal_key_positions("reverse", L)
    perfect = torch.eye(L)[ideal]  # one-hot on the anti-diagonal, (L, L)
    assert ideal_attention_share(perfect, ideal).item() == pytest.approx(1.0)
    uniform = torch.full((2, 3, L, L), 1 / L)
    share = ideal_attention_share(uniform, ideal)
    assert share.shape == (2, 3)
    torch.testing.assert_close(share, torch.full((2, 3), 1 / L))
    # Half of the weight on the ideal key, half on its right-hand neighbour (clamped).
    neighbour = (ideal + 1).clamp(max=L - 1)
    half = 0.5 * perfect + 0.5 * torch.eye(L)[neighbour]
    assert ideal_attention_share(half, ideal).item() == pytest.approx(0.5 + 0.5 / L)
    assert ideal_attention_share(half, ideal, window=1).item() == pytest.approx(1.0)
    # Identity attention puts weight on the ideal key only where i == L - 1 - i (never, L even).
    assert ideal_attention_share(torch.eye(L), ideal).item() == 0.0


def test_ideal_attention_share_bad_input() -> None:
    ideal = ideal_key_positions("reverse", 4)
    with pytest.raises(ValueError, match="key_positions"):
        ideal_attention_share(torch.rand(3, 4), ideal)
    with pytest.raises(ValueError, match="key_positions"):
        ideal_attention_share(torch.rand(4, 3), ideal)
    with pytest.raises(TypeError, match="key_positions"):
        ideal_attention_share(torch.rand(4, 4), ideal.float())
    with pytest.raises(TypeError, match="weights"):
        ideal_attention_share(torch.ones(4, 4, dtype=torch.long), ideal)
    with pytest.raises(ValueError, match="window"):
        ideal_attention_share(torch.rand(4, 4), ideal, window=-1)


def test_count_shared_sequences() -> None:
    a = torch.tensor([[1, 2, 3], [4, 5, 6], [1, 2, 3], [7, 8, 9]])
    b = torch.tensor([[1, 2, 3], [9, 9, 9]])
    assert count_shared_sequences(a, b) == 2
    assert count_shared_sequences(b, a) == 1
    with pytest.raises(ValueError, match="a and b"):
        count_shared_sequences(a, torch.zeros(2, 4, dtype=torch.long))


# --- accuracy and training --------------------------------------------------------------------------


class Oracle(nn.Module):
    """Predicts the reversed input, except at position 0 where it says class 0."""

    def forward(self, tokens: Tensor) -> Tensor:
        logits = nn.functional.one_hot(tokens.flip(-1), 4).float()  # (B, L, 4)
        logits[:, 0] = torch.tensor([1.0, 0, 0, 0])
        return logits


def test_token_accuracy_counts_positions_and_restores_the_mode() -> None:
    x, y = make_task_data("reverse", 10, 5, 4, generator=gen(3))
    model = Oracle().train()
    expected = 1 - (y[:, 0] != 0).sum().item() / y.numel()
    assert token_accuracy(model, x, y, batch_size=3) == pytest.approx(expected)
    assert model.training
    with pytest.raises(ValueError, match="targets"):
        token_accuracy(model, x, y[:, :4])


def test_training_solves_a_tiny_task_deterministically() -> None:
    x, y = make_task_data("reverse", 512, 5, 4, generator=gen(4))
    x_test, y_test = make_task_data("reverse", 128, 5, 4, generator=gen(5))

    def run(steps: int) -> tuple[TokenClassifier, TrainingHistory]:
        torch.manual_seed(0)
        model = TokenClassifier(4, d_model=16, num_heads=2, num_layers=1, d_ff=32, max_len=5)
        history = train_token_classifier(
            model,
            x,
            y,
            steps=steps,
            batch_size=32,
            lr=1e-2,
            generator=gen(6),
            eval_data=(x_test, y_test),
            eval_every=50,
            log_every=25,
        )
        return model, history

    model, history = run(150)
    assert not model.training
    assert history.steps == [25, 50, 75, 100, 125, 150] and len(history.loss) == 6
    assert history.eval_steps == [50, 100, 150]
    assert history.loss[-1] < history.loss[0] / 5
    assert history.accuracy[-1] >= 0.95
    assert history.accuracy[-1] == token_accuracy(model, x_test, y_test)
    # Same seeds, same thread count: bit-identical runs.
    (model1, history1), (model2, history2) = run(30), run(30)
    assert history1.loss == history2.loss and history1.accuracy == history2.accuracy
    assert history1.eval_steps == [30]  # the last step is always evaluated
    for p, q in zip(model1.parameters(), model2.parameters()):
        assert torch.equal(p, q)


def test_training_bad_input() -> None:
    model = TokenClassifier(4, d_model=8, num_heads=2, max_len=5)
    x, y = make_task_data("reverse", 8, 5, 4, generator=gen(0))
    with pytest.raises(ValueError, match="steps"):
        train_token_classifier(model, x, y, steps=0, generator=gen(0))
    with pytest.raises(TypeError, match="generator"):
        train_token_classifier(model, x, y, steps=1, generator=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="targets"):
        train_token_classifier(model, x, y[:4], steps=1, generator=gen(0))
    with pytest.raises(TypeError, match="inputs"):
        train_token_classifier(model, x.float(), y, steps=1, generator=gen(0))


def test_training_progress_bar_outside_a_notebook(capsys: pytest.CaptureFixture[str]) -> None:
    model = TokenClassifier(4, d_model=8, num_heads=2, max_len=5)
    x, y = make_task_data("reverse", 8, 5, 4, generator=gen(0))
    history = train_token_classifier(
        model, x, y, steps=3, batch_size=4, generator=gen(0), progress=True
    )
    assert history.steps == [3]
    assert "training: 100%" in capsys.readouterr().err
