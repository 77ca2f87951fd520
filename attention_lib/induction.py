"""The induction task: a random pattern of tokens, repeated.

Each sequence is a pattern of ``n`` distinct random tokens (the *period* ``n``
varies from sequence to sequence), repeated until the sequence is full:
``a b c d a b c d a b``. A causal language model reads it left to right and
predicts every next token. The first ``n`` next tokens are unpredictable (the
pattern is random), but from position ``n`` on, the current token has occurred
before, and the next token is the one that followed it then. A model solves
that with an *induction head*: find the earlier occurrence of the current
token and copy its successor. Because the period varies, no fixed offset
finds it: the model must look at the content.

Explained in chapter 9, *Attention that writes*.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .validation import (
    check_generator,
    check_int,
    check_integer_tensor,
    check_same,
    check_sequences,
)


def make_induction_data(
    num_sequences: int,
    seq_len: int,
    vocab_size: int,
    *,
    min_period: int = 2,
    max_period: int | None = None,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor, Tensor]:
    """Repeated random patterns for next-token prediction.

    Sequence ``b`` repeats a pattern of ``periods[b]`` distinct tokens (drawn
    without replacement from ``0 .. vocab_size - 1``) over ``seq_len + 1``
    tokens; ``inputs`` are its first ``seq_len`` tokens and ``targets`` the
    ``seq_len`` tokens that follow each input position.

    Explained in chapter 9, *Attention that writes*.

    Args:
        num_sequences: number of sequences ``N``.
        seq_len: length ``L`` of every input sequence.
        vocab_size: number of token ids ``V``.
        min_period: shortest pattern (at least 1).
        max_period: longest pattern; defaults to ``min(vocab_size, seq_len // 2)``,
            so that every sequence shows its pattern at least twice. At most
            ``vocab_size`` (the tokens of a pattern are distinct).
        generator: the random source (e.g. ``torch.Generator().manual_seed(0)``).

    Returns:
        ``(inputs, targets, periods)``: ``int64`` tensors of shapes ``(N, L)``,
        ``(N, L)`` and ``(N,)``, with ``targets[:, i] = inputs[:, i + 1]``.

    Raises:
        TypeError: on a non-int size or a ``generator`` that is not a ``torch.Generator``.
        ValueError: if the periods are out of range.
    """
    num_sequences = check_int("num_sequences", num_sequences, minimum=0)
    seq_len = check_int("seq_len", seq_len, minimum=1)
    vocab_size = check_int("vocab_size", vocab_size, minimum=1)
    min_period = check_int("min_period", min_period, minimum=1)
    if max_period is None:
        max_period = max(min_period, min(vocab_size, seq_len // 2))
    # a pattern's tokens are distinct: at most vocab_size of them
    max_period = check_int("max_period", max_period, minimum=min_period, maximum=vocab_size)
    check_generator(generator)
    device = generator.device
    periods = torch.randint(
        min_period, max_period + 1, (num_sequences,), generator=generator, device=device
    )  # (N,)
    noise = torch.rand(num_sequences, vocab_size, generator=generator, device=device)
    patterns = noise.argsort(dim=-1)[:, :max_period]  # (N, max_period): distinct tokens
    positions = torch.arange(seq_len + 1, device=device)  # (L + 1,)
    index = positions % periods[:, None]  # (N, L + 1): where in its pattern each token is
    sequences = patterns.gather(1, index)  # (N, L + 1)
    return sequences[:, :-1].contiguous(), sequences[:, 1:].contiguous(), periods


def predictable_positions(periods: Tensor, seq_len: int) -> Tensor:
    """Which next tokens can be predicted: position ``i`` of sequence ``b`` iff
    ``i >= periods[b]`` (its token has occurred before, one period back).

    Explained in chapter 9, *Attention that writes*.

    Args:
        periods: ``(N,)`` integer periods, as returned by :func:`make_induction_data`.
        seq_len: sequence length ``L``.

    Returns:
        Bool tensor of shape ``(N, L)``.
    """
    check_integer_tensor("periods", periods, what=" (N,)")
    if periods.dim() != 1:
        raise ValueError(f"periods must have shape (N,), got {tuple(periods.shape)}")
    seq_len = check_int("seq_len", seq_len, minimum=1)
    return torch.arange(seq_len, device=periods.device) >= periods[:, None]  # (N, L)


@torch.no_grad()
def predictable_accuracy(
    model: nn.Module, inputs: Tensor, targets: Tensor, periods: Tensor
) -> float:
    """Share of the predictable next tokens that the model's arg-max gets right.

    Runs the model in ``eval()`` mode and restores its mode afterwards.

    Explained in chapter 9, *Attention that writes*.

    Args:
        model: maps ``(N, L)`` tokens to ``(N, L, V)`` logits.
        inputs: ``(N, L)`` token ids.
        targets: ``(N, L)`` next-token ids.
        periods: ``(N,)`` periods (see :func:`predictable_positions`).

    Returns:
        Accuracy in ``[0, 1]`` over the positions ``i >= periods[b]``.
    """
    check_sequences(inputs=inputs, targets=targets)
    check_same("shape", inputs=tuple(inputs.shape), targets=tuple(targets.shape))
    predictable = predictable_positions(periods, inputs.shape[1])  # (N, L)
    check_same("length N", inputs=len(inputs), periods=len(periods))
    was_training = model.training
    model.eval()
    try:
        correct = model(inputs).argmax(-1) == targets  # (N, L)
    finally:
        model.train(was_training)
    return correct[predictable].float().mean().item() if predictable.any() else 0.0
