"""Paged attention in place (chapter 12): walking each sequence's block table
with the online softmax equals attention over the gathered keys (and vLLM's
token-by-token reference), for every mask a layer may have, and its extra
memory does not grow with the cached tokens."""

from __future__ import annotations

import pytest
import torch

from attention_lib import TensorMemory, scaled_dot_product_attention
from attention_lib.paged_attention import paged_attention
from attention_lib.paged_cache import PagedKVCache


def filled_pool(lengths, block_size=4, kv_heads=2, d=8, seed=0, blocks=64):
    """A one-layer pool whose sequences (ids 0, 1, ...) hold random keys and
    values, their blocks interleaved in the pool (so tables are not ranges)."""
    gen = torch.Generator().manual_seed(seed)
    pool = PagedKVCache(blocks, block_size, num_layers=1, num_kv_heads=kv_heads, head_dim=d)
    seqs = [pool.new_sequence() for _ in lengths]
    for step in range(max(lengths)):  # one token at a time, every sequence: interleaved
        growing = [s for s, n in zip(seqs, lengths) if n > step]
        pool.extend(growing, 1)
    pool.key.copy_(torch.randn(pool.key.shape, generator=gen))
    pool.value.copy_(torch.randn(pool.value.shape, generator=gen))
    tables = torch.full((len(seqs), max(len(pool.tables[s]) for s in seqs)), -1)
    for row, s in enumerate(seqs):
        tables[row, : len(pool.tables[s])] = torch.tensor(pool.tables[s])
    return pool, seqs, tables


def token_by_token(pool, seq):
    """vLLM's reference paged attention (its kernel tests) looks every key up
    token by token through the block table: ``(H_kv, T, d)`` keys and values."""
    table, size = pool.tables[seq], pool.block_size
    look = [(table[j // size], j % size) for j in range(pool.lengths[seq])]
    keys = torch.stack([pool.key[0, b, o] for b, o in look])  # (T, H_kv, d)
    values = torch.stack([pool.value[0, b, o] for b, o in look])
    return keys.transpose(0, 1), values.transpose(0, 1)


def masked_attention(q, k, v, positions, window=None, chunk=None, softcap=None, sink=None):
    """The library's attention of queries at ``positions`` to keys ``0 .. T - 1``."""
    group = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)  # (H, T, d)
    t, p = torch.arange(k.shape[1]), positions[:, None]
    keep = t <= p
    if window is not None:
        keep &= t > p - window
    if chunk is not None:
        keep &= t // chunk == p // chunk
    return scaled_dot_product_attention(q, k, v, keep, softcap=softcap, sink=sink)[0]


@pytest.mark.parametrize(
    "options",
    [{}, {"window": 5}, {"chunk": 6}, {"softcap": 2.0}, {"sink": True}, {"tile": 1}],
)
def test_the_walk_equals_gathered_attention_and_vllm_s_reference(options):
    lengths = [1, 7, 13, 4, 20]
    pool, seqs, tables = filled_pool(lengths)
    heads, d, q_len = 4, 8, 3
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(len(seqs), heads, q_len, d, generator=gen)
    # each sequence's queries are its last tokens (fewer for a short one: padding)
    positions = torch.tensor([[n - q_len + i if n - q_len + i >= 0 else -1 for i in range(q_len)]
                              for n in lengths])  # fmt: skip
    sink = torch.randn(heads, generator=gen) if options.pop("sink", False) else None
    out = paged_attention(q, pool.key[0], pool.value[0], tables, positions,
                          torch.tensor(lengths), sink=sink, **options)  # fmt: skip
    mask_options = {k: v for k, v in options.items() if k != "tile"}
    for row, (seq, n) in enumerate(zip(seqs, lengths)):
        real = positions[row] >= 0
        for k, v in (token_by_token(pool, seq), pool.gather(0, seq)):  # vLLM's, the gather
            ref = masked_attention(q[row][:, real], k, v, positions[row][real], sink=sink,
                                   **mask_options)  # fmt: skip
            assert (out[row][:, real] - ref).abs().max() < 1e-6
        assert not out[row][:, ~real].any()  # padding queries: zero


def test_a_released_block_is_never_read():
    """Blocks out of a sliding window are freed (table entry -1); the pool's
    block there may hold anything: the walk skips it."""
    pool, _, tables = filled_pool([17], block_size=4)
    q = torch.randn(1, 2, 1, 8)
    args = (pool.key[0], pool.value[0])
    pos, n = torch.tensor([[16]]), torch.tensor([17])
    before = paged_attention(q, *args, tables, pos, n, window=5)
    holes = tables.clone()
    holes[0, :3] = -1  # positions 0..11 fell out of the window of position 16
    pool.key[0, tables[0, :3]] = float("nan")
    after = paged_attention(q, *args, holes, pos, n, window=5)
    assert torch.isfinite(after).all() and (after - before).abs().max() < 1e-6


def test_the_extra_memory_does_not_grow_with_the_cached_tokens():
    """8 sequences of 512 tokens: one decode step's peak extra memory stays
    below a quarter of the gathered keys and values, and the same at 128."""
    peaks = {}
    for length in (128, 512):
        pool, seqs, tables = filled_pool([length] * 8, block_size=16, kv_heads=2, d=32,
                                         blocks=8 * length // 16)  # fmt: skip
        q = torch.randn(8, 4, 1, 32)
        positions, lengths = torch.full((8, 1), length - 1), torch.full((8,), length)
        with TensorMemory() as memory:
            paged_attention(q, pool.key[0], pool.value[0], tables, positions, lengths)
        peaks[length] = memory.peak
        gathered = 2 * 8 * length * 2 * 32 * 4  # keys and values, (8, H_kv, T, d) float32
        with TensorMemory() as dense:
            for s in seqs:
                pool.gather(0, s)
        assert dense.peak >= gathered / 8  # one sequence's gathered copy at least
    assert peaks[512] < (2 * 8 * 512 * 2 * 32 * 4) / 4
    assert peaks[512] == peaks[128]  # one tile of blocks, whatever the length


def test_clear_errors():
    pool, _, tables = filled_pool([5])
    q = torch.randn(1, 4, 1, 8)
    args = (pool.key[0], pool.value[0], tables, torch.tensor([[4]]), torch.tensor([5]))
    with pytest.raises(ValueError, match="positions"):
        paged_attention(q, pool.key[0], pool.value[0], tables, torch.tensor([4]), torch.tensor([5]))
    with pytest.raises(ValueError, match="query"):
        paged_attention(torch.randn(1, 3, 1, 8), *args)  # 3 heads over 2 kv heads
    with pytest.raises(ValueError, match="tile"):
        paged_attention(q, *args, tile=0)
    with pytest.raises(TypeError, match="query"):
        paged_attention(q.numpy(), *args)
