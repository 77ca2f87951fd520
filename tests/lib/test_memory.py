"""Tests for attention_lib.memory.TensorMemory: exact byte counts on cases whose
memory is known by construction, and the backward pass that a TorchFunctionMode
could not see."""

from __future__ import annotations

import math

import torch

from attention_lib import TensorMemory, tiled_attention

F32 = 4  # bytes


def test_counts_a_new_tensor_and_gives_it_back() -> None:
    with TensorMemory() as memory:
        x = torch.empty(1000)
        assert memory.live == 1000 * F32
        del x
    assert memory.peak == 1000 * F32 and memory.live == 0
    assert memory.peak_mib == 1000 * F32 / 2**20


def test_views_in_place_and_out_ops_are_free() -> None:
    x = torch.randn(64, 32)
    buffer = torch.empty(64, 32)
    with TensorMemory() as memory:
        views = [x.T, x[1:], x.view(32, 64), x.expand(2, 64, 32), x.unsqueeze(0)]
        x.mul_(2.0)
        torch.add(x, 1.0, out=buffer)
        del views
    assert memory.peak == 0 and memory.live == 0


def test_one_storage_counted_once_and_kept_while_a_view_lives() -> None:
    with TensorMemory() as memory:
        y = torch.ones(100, 10) * 2  # ones (4000 B) and the product (4000 B)
        row = y[3]  # a view keeps all of y's storage alive
        del y
        assert memory.live == 4000
        del row
    assert memory.peak == 8000 and memory.live == 0


def test_peak_is_the_largest_total_alive_at_once() -> None:
    with TensorMemory() as memory:
        a = torch.zeros(1000)
        b = torch.zeros(3000)
        del a
        c = torch.zeros(1500)  # a was freed: 3000 + 1500 < 1000 + 3000 + 1500
        del b, c
    assert memory.peak == (3000 + 1500) * F32
    assert memory.live == 0


def test_reused_addresses_are_told_apart() -> None:
    """The allocator hands a freed address out again: every allocation counts once."""
    with TensorMemory() as memory:
        for n in range(1, 200):
            t = torch.empty(n)
            del t
    assert memory.live == 0 and memory.peak == 199 * F32


def test_sees_the_backward_pass() -> None:
    """Naive attention's backward allocates (N, N) gradients: the peak of forward
    + backward is about three score matrices, not the forward's two."""
    gen = torch.Generator().manual_seed(0)
    n, heads, d = 256, 2, 8
    q, k, v = (torch.randn(1, heads, n, d, generator=gen, requires_grad=True) for _ in range(3))
    score_bytes = heads * n * n * F32

    def naive():
        return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1) @ v

    with torch.no_grad(), TensorMemory() as forward_only:
        naive()
    with TensorMemory() as training:
        naive().sum().backward()
    assert forward_only.peak == 2 * score_bytes  # scores, then scaled scores / weights
    assert 3 * score_bytes <= training.peak < 4 * score_bytes
    assert training.live == 3 * heads * n * d * F32  # only q.grad, k.grad, v.grad remain


def test_tiled_attention_training_memory_is_linear() -> None:
    gen = torch.Generator().manual_seed(0)
    peaks = []
    for n in (1024, 2048):
        q, k, v = (torch.randn(1, 2, n, 8, generator=gen, requires_grad=True) for _ in range(3))
        with TensorMemory() as memory:
            tiled_attention(q, k, v, block_size=128).sum().backward()
        peaks.append(memory.peak)
    assert peaks[1] / peaks[0] < 2.5  # O(N): about 2 per doubling
    assert peaks[1] < 0.1 * 2 * 2048 * 2048 * F32  # far below one (2, N, N) matrix
