"""Toy sequence tasks whose ideal attention pattern is known in advance, and a
small training loop for :class:`~attention_lib.TokenClassifier`.

Every task maps a sequence of random tokens to a sequence of the same length,
one output class per position:

* ``"reverse"``: ``y[i] = x[L - 1 - i]``; the ideal attention of query ``i`` is
  key ``L - 1 - i``, the anti-diagonal;
* ``"shift"`` (copy with an offset): ``y[i] = x[(i - offset) mod L]``; the ideal
  attention is a diagonal shifted by ``offset`` (wrapping around);
* ``"sort"``: ``y = sorted(x)``; which key a query needs depends on the data,
  so there is no fixed ideal pattern.

The data comes from a ``torch.Generator``: no downloads, and the same seed
gives the same sequences on every machine.

Explained in chapter 7, *Attention that has learned something*.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .show.progress import progress_bar
from .validation import (
    check_choice,
    check_generator,
    check_int,
    check_integer_tensor,
    check_same,
    check_sequences,
    check_tensor,
)

#: Names accepted by :func:`make_task_data`.
TASKS = ("reverse", "shift", "sort")


def make_task_data(
    task: str,
    num_sequences: int,
    seq_len: int,
    vocab_size: int,
    *,
    generator: torch.Generator,
    offset: int = 1,
) -> tuple[Tensor, Tensor]:
    """Random input sequences and their targets for one toy task.

    Inputs are drawn uniformly from ``0 .. vocab_size - 1`` with ``generator``,
    so one seed always gives the same data set.

    Explained in chapter 7, *Attention that has learned something*.

    Args:
        task: ``"reverse"``, ``"shift"`` or ``"sort"`` (see the module docstring).
        num_sequences: number of sequences ``N``.
        seq_len: length ``L`` of every sequence.
        vocab_size: number of distinct tokens ``V``.
        generator: the random source (e.g. ``torch.Generator().manual_seed(0)``).
        offset: the shift of the ``"shift"`` task (ignored by the others).

    Returns:
        ``(inputs, targets)``, two ``int64`` tensors of shape ``(N, L)``.

    Raises:
        TypeError: on a non-str ``task``, a non-int size or a ``generator`` that is
            not a ``torch.Generator``.
        ValueError: on an unknown ``task`` or a size out of range.
    """
    check_choice("task", task, TASKS)
    num_sequences = check_int("num_sequences", num_sequences, minimum=0)
    seq_len = check_int("seq_len", seq_len, minimum=1)
    vocab_size = check_int("vocab_size", vocab_size, minimum=2)
    offset = check_int("offset", offset, minimum=0)
    check_generator(generator)
    inputs = torch.randint(
        vocab_size, (num_sequences, seq_len), generator=generator, device=generator.device
    )  # (N, L)
    if task == "reverse":
        targets = inputs.flip(-1)
    elif task == "shift":
        targets = inputs.roll(offset, dims=-1)  # targets[:, i] = inputs[:, i - offset]
    else:
        targets = inputs.sort(dim=-1).values
    return inputs, targets.contiguous()  # (N, L), (N, L)


def ideal_key_positions(task: str, seq_len: int, *, offset: int = 1) -> Tensor:
    """For every query position ``i``, the one key position that holds its answer.

    ``"reverse"``: ``L - 1 - i`` (the anti-diagonal); ``"shift"``:
    ``(i - offset) mod L``. ``"sort"`` has no fixed answer position and raises.

    Explained in chapter 7, *Attention that has learned something*.

    Args:
        task: ``"reverse"`` or ``"shift"``.
        seq_len: sequence length ``L``.
        offset: the shift of the ``"shift"`` task.

    Returns:
        ``int64`` tensor of shape ``(L,)``.

    Raises:
        TypeError: for a ``task`` that is not a str.
        ValueError: for ``"sort"`` or an unknown task.
    """
    check_choice("task", task, ("reverse", "shift"))  # "sort" has no fixed ideal position
    seq_len = check_int("seq_len", seq_len, minimum=1)
    offset = check_int("offset", offset, minimum=0)
    positions = torch.arange(seq_len)  # (L,)
    if task == "reverse":
        return seq_len - 1 - positions
    return (positions - offset) % seq_len


def ideal_attention_share(weights: Tensor, key_positions: Tensor, *, window: int = 0) -> Tensor:
    """The mean attention weight that queries put on their ideal key position.

    ``share = mean_i sum_{|j - key_positions[i]| <= window} weights[..., i, j]``:
    with the default ``window=0`` it is the weight on exactly the ideal key. 1.0
    means every query looks only at the key that holds its answer; uniform
    attention gives ``1 / Lk`` (for ``window=0``). A ``window > 0`` also counts
    the neighbouring keys, to measure a blurred version of the pattern.

    Explained in chapter 7, *Attention that has learned something*.

    Args:
        weights: attention weights ``(..., Lq, Lk)``, e.g. ``(B, layers, H, L, L)``.
        key_positions: ``(Lq,)`` integer key index per query
            (see :func:`ideal_key_positions`).
        window: also count keys up to this distance from the ideal one.

    Returns:
        Tensor of shape ``(...)``: the share for every leading index (average the
        batch dim yourself, e.g. ``.mean(0)``).

    Raises:
        TypeError: if the arguments are not tensors of the right kind.
        ValueError: if the shapes do not match, a position is out of range or
            ``window`` is negative.
    """
    check_tensor("weights", weights)  # floating, (..., Lq, Lk)
    check_integer_tensor("key_positions", key_positions, what=" (Lq,)")
    window = check_int("window", window, minimum=0)
    q_len, k_len = weights.shape[-2:]
    check_int("Lq (weights.shape[-2])", q_len, minimum=1)
    if key_positions.shape != (q_len,):  # one key per query
        raise ValueError(f"key_positions must have shape ({q_len},), got {key_positions.shape}")
    if int(key_positions.min()) < 0 or int(key_positions.max()) >= k_len:
        raise ValueError(f"key_positions must lie in [0, Lk={k_len}), got {key_positions.tolist()}")
    keys = torch.arange(k_len, device=weights.device)  # (Lk,)
    distance = (keys[None, :] - key_positions.to(weights.device)[:, None]).abs()  # (Lq, Lk)
    on_target = (distance <= window).to(weights.dtype)  # (Lq, Lk)
    return (weights * on_target).sum(-1).mean(-1)  # (..., Lq, Lk) -> (..., Lq) -> (...)


def count_shared_sequences(a: Tensor, b: Tensor) -> int:
    """How many rows of ``a`` also occur as a row of ``b`` (to prove a test set is held out).

    Explained in chapter 7, *Attention that has learned something*.

    Args:
        a: ``(N, L)`` integer sequences.
        b: ``(M, L)`` integer sequences.

    Returns:
        The number of rows of ``a`` equal to some row of ``b``.
    """
    check_sequences(a=a, b=b)
    check_same("length L", a=a.shape[1], b=b.shape[1])
    seen = set(map(tuple, b.tolist()))
    return sum(row in seen for row in map(tuple, a.tolist()))


@torch.no_grad()
def token_accuracy(
    model: nn.Module, inputs: Tensor, targets: Tensor, *, batch_size: int = 1024
) -> float:
    """Share of positions whose arg-max prediction equals the target (in ``eval()`` mode).

    The model's training/eval mode is restored afterwards.

    Explained in chapter 7, *Attention that has learned something*.

    Args:
        model: maps ``(B, L)`` tokens to ``(B, L, C)`` logits.
        inputs: ``(N, L)`` token ids.
        targets: ``(N, L)`` class ids.
        batch_size: sequences per forward pass.

    Returns:
        Token accuracy in ``[0, 1]``.
    """
    check_sequences(inputs=inputs, targets=targets)
    check_same("shape", inputs=tuple(inputs.shape), targets=tuple(targets.shape))
    batch_size = check_int("batch_size", batch_size, minimum=1)
    was_training = model.training
    model.eval()
    correct = 0
    try:
        for start in range(0, len(inputs), batch_size):
            logits = model(inputs[start : start + batch_size])  # (b, L, C)
            correct += int((logits.argmax(-1) == targets[start : start + batch_size]).sum())
    finally:
        model.train(was_training)
    return correct / max(1, targets.numel())


@dataclass
class TrainingHistory:
    """What :func:`train_token_classifier` measured.

    Attributes:
        steps: the step (1-based) of every entry of ``loss``.
        loss: mean training cross-entropy over the steps since the previous entry.
        eval_steps: the steps at which ``accuracy`` was measured.
        accuracy: held-out token accuracy at ``eval_steps``.
        seconds: wall-clock training time (volatile: never assert on it exactly).
    """

    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    seconds: float = 0.0


def train_token_classifier(
    model: nn.Module,
    inputs: Tensor,
    targets: Tensor,
    *,
    steps: int,
    batch_size: int = 64,
    lr: float = 3e-3,
    weight_decay: float = 0.0,
    generator: torch.Generator,
    eval_data: tuple[Tensor, Tensor] | None = None,
    eval_every: int = 100,
    log_every: int = 10,
    progress: bool = False,
) -> TrainingHistory:
    """Train a per-position classifier with AdamW and cross-entropy.

    Minibatches are drawn from ``(inputs, targets)`` by reshuffling the
    training set with ``generator`` every epoch. The learning rate rises
    linearly over the first 5% of the steps and then decays to 0 with a cosine.
    With a seeded model initialisation, a seeded ``generator`` and a fixed
    number of threads, two runs on one machine give identical models.

    Explained in chapter 7, *Attention that has learned something*.

    Args:
        model: maps ``(B, L)`` tokens to ``(B, L, C)`` logits; trained in place.
        inputs: ``(N, L)`` training token ids.
        targets: ``(N, L)`` training class ids.
        steps: number of optimiser steps.
        batch_size: sequences per step.
        lr: peak learning rate.
        weight_decay: AdamW weight decay.
        generator: random source of the minibatch order.
        eval_data: optional held-out ``(inputs, targets)`` for the accuracy curve.
        eval_every: evaluate every this many steps (and after the last step).
        log_every: record the mean loss every this many steps.
        progress: show a ``tqdm.auto`` progress bar.

    Returns:
        A :class:`TrainingHistory`. The model is left in ``eval()`` mode.
    """
    check_sequences(inputs=inputs, targets=targets)
    check_same("shape", inputs=tuple(inputs.shape), targets=tuple(targets.shape))
    steps = check_int("steps", steps, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    eval_every = check_int("eval_every", eval_every, minimum=1)
    log_every = check_int("log_every", log_every, minimum=1)
    check_generator(generator)
    if len(inputs) == 0:
        raise ValueError("inputs must hold at least one sequence, got 0")

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    warmup = max(1, steps // 20)

    def lr_factor(step: int) -> float:  # step = number of optimiser steps done so far
        if step < warmup:
            return (step + 1) / warmup
        progress_ = (step - warmup) / max(1, steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * progress_))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    history = TrainingHistory()
    order = torch.empty(0, dtype=torch.long)
    loss_sum, loss_count = 0.0, 0
    bar, finish_bar = progress_bar(steps) if progress else (None, None)
    start = time.perf_counter()
    model.train()
    for step in range(1, steps + 1):
        if len(order) < batch_size:  # a new epoch: reshuffle (the remainder is dropped)
            order = torch.randperm(len(inputs), generator=generator, device=generator.device)
        batch, order = order[:batch_size], order[batch_size:]
        logits = model(inputs[batch])  # (b, L, C)
        loss = F.cross_entropy(logits.flatten(0, 1), targets[batch].flatten())  # (b*L, C)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        loss_sum += loss.item()
        loss_count += 1
        if step % log_every == 0 or step == steps:
            history.steps.append(step)
            history.loss.append(loss_sum / loss_count)
            loss_sum, loss_count = 0.0, 0
        if eval_data is not None and (step % eval_every == 0 or step == steps):
            history.eval_steps.append(step)
            history.accuracy.append(token_accuracy(model, *eval_data))
        if bar is not None:
            bar.update(1)
            if history.loss:
                bar.set_postfix(loss=f"{history.loss[-1]:.3f}", refresh=False)
    history.seconds = time.perf_counter() - start
    if bar is not None and finish_bar is not None:
        bar.close()
        finish_bar()
    model.eval()
    return history
