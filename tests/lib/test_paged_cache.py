"""PagedKVCache (chapter 12): block tables, allocation and freeing, reference
counts and copy on write; attention through the block table equals attention
over the contiguous cache."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from attention_lib import CausalLM, KVCache, generate
from attention_lib.paged_cache import PagedBatch, PagedKVCache

V = 31


def model(**options) -> CausalLM:
    torch.manual_seed(5)
    return CausalLM(V, 32, 4, 2, 64, **options).eval()


def ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(V, (n,), generator=torch.Generator().manual_seed(seed))


def paged_generate(lm: CausalLM, prompt: torch.Tensor, n: int, block_size: int) -> torch.Tensor:
    """Greedy generation of one sequence through a paged cache."""
    cache = PagedKVCache.for_model(lm, 64, block_size)
    seq = cache.new_sequence()
    tokens, new = prompt, prompt[None]
    with torch.no_grad():
        for _ in range(n):
            batch = cache.extend([seq], new.shape[1])
            logits = lm(new, cache=batch, mask=batch.mask, positions=batch.positions)
            new = logits[:, -1:].argmax(-1)  # (1, 1)
            tokens = torch.cat([tokens, new[0]])
    return tokens


@pytest.mark.parametrize("options", [{}, {"positional": "rope", "num_kv_heads": 2}])
@pytest.mark.parametrize("block_size", [1, 3, 4, 16])
def test_generation_through_the_block_table_equals_the_contiguous_run(options, block_size):
    lm = model(**options)
    prompt = ids(7)
    assert torch.equal(
        paged_generate(lm, prompt, 12, block_size), generate(lm, prompt[None], 12)[0]
    )


def test_gathered_keys_equal_the_contiguous_cache_and_attention_matches():
    lm = model(positional="rope", num_kv_heads=2)
    rng = random.Random(0)
    lengths = [5, 11, 2, 8]
    pool = PagedKVCache.for_model(lm, 40, 3)
    seqs = [pool.new_sequence() for _ in lengths]
    contiguous = []
    # interleave the sequences so that their blocks are scattered over the pool
    for step in range(max(lengths)):
        order = list(range(len(seqs)))
        rng.shuffle(order)
        for i in order:
            if step < lengths[i]:
                batch = pool.extend([seqs[i]], 1)
                tok = ids(lengths[i], i)[step : step + 1][None]
                with torch.no_grad():
                    lm(tok, cache=batch, mask=batch.mask, positions=batch.positions)
    for i, n in enumerate(lengths):
        cache = KVCache()
        with torch.no_grad():
            lm(ids(n, i)[None], cache=cache)
        contiguous.append(cache)
        for layer in range(lm.num_layers):
            k, v = pool.gather(layer, seqs[i])  # (H_kv, T, d_k)
            torch.testing.assert_close(k, cache.layer(layer).key[0], atol=1e-6, rtol=0)
            torch.testing.assert_close(v, cache.layer(layer).value[0], atol=1e-6, rtol=0)
    assert any(t != sorted(t) or t[-1] - t[0] >= len(t) for t in pool.tables.values())
    # one batched decode step through the block tables == F.sdpa on each contiguous cache
    q = torch.randn(len(lengths), 4, 1, 8)  # (B, H, 1, d_k)
    batch = pool.extend(seqs, 1)
    attention = lm.blocks.layers[0].self_attn
    new_k, new_v = torch.randn(2, len(lengths), 2, 1, 8).unbind(0)
    k, v = batch.layer(0).update(new_k, new_v)  # (B, H_kv, T + 1, d_k)
    keep = batch.mask[:, None, None, :]  # (B, 1, 1, T + 1)
    from attention_lib.backends import lib_backend

    paged = lib_backend(q, k, v, keep, causal=None, dropout_p=0.0, scale=None)
    for row, cache in enumerate(contiguous):
        ck = torch.cat([cache.layer(0).key, new_k[row : row + 1]], 2)
        cv = torch.cat([cache.layer(0).value, new_v[row : row + 1]], 2)
        want = F.scaled_dot_product_attention(q[row : row + 1], ck, cv, enable_gqa=True)
        torch.testing.assert_close(paged[row : row + 1], want, atol=1e-6, rtol=0)
    assert attention.num_kv_heads == 2


def test_allocation_freeing_and_the_block_table():
    pool = PagedKVCache(6, 4, num_layers=1, num_kv_heads=1, head_dim=2)
    a, b = pool.new_sequence(), pool.new_sequence()
    pool.extend([a], 5)  # 2 blocks
    pool.extend([b], 4)  # 1 block
    assert pool.tables == {a: [0, 1], b: [2]} and pool.num_free_blocks == 3
    assert pool.blocks_needed(a, 3) == 0 and pool.blocks_needed(a, 4) == 1
    assert pool.blocks_needed(b, 1) == 1
    pool.extend([a, b], 3)
    assert pool.lengths == {a: 8, b: 7} and pool.tables[b] == [2, 3]
    assert not pool.can_extend([a, b], 9)
    with pytest.raises(RuntimeError, match="out of blocks"):
        pool.extend([a], 20)
    pool.free_sequence(a)
    pool.free_sequence(b)
    assert pool.num_free_blocks == 6 and int(pool.ref_count.sum()) == 0


def test_prefix_sharing_reference_counts_and_copy_on_write():
    lm = model()
    prefix, block = ids(10, 1), 4  # 2 full blocks and a partial one (2 tokens)
    pool = PagedKVCache.for_model(lm, 32, block)
    parent = pool.new_sequence()
    batch = pool.extend([parent], len(prefix))
    with torch.no_grad():
        lm(prefix[None], cache=batch, mask=batch.mask, positions=batch.positions)
    before = [pool.gather(i, parent) for i in range(lm.num_layers)]
    children = [pool.fork(parent) for _ in range(3)]
    assert pool.num_used_blocks == 3 and pool.ref_count[pool.tables[parent]].tolist() == [4] * 3
    outs = []
    for j, child in enumerate(children):
        suffix = ids(3 + j, 10 + j)
        assert pool.blocks_needed(child, len(suffix)) >= 1  # its own copy of the partial block
        batch = pool.extend([child], len(suffix))
        with torch.no_grad():
            logits = lm(suffix[None], cache=batch, mask=batch.mask, positions=batch.positions)
            full = lm(torch.cat([prefix, suffix])[None])
        torch.testing.assert_close(logits[0, -1], full[0, -1], atol=1e-5, rtol=0)
        assert pool.tables[child][:2] == pool.tables[parent][:2]  # full blocks shared
        assert pool.tables[child][2] != pool.tables[parent][2]  # the partial one copied
        outs.append(logits)
    for i in range(lm.num_layers):  # the parent's keys were never overwritten
        for got, want in zip(pool.gather(i, parent), before[i]):
            assert torch.equal(got, want)
    assert pool.ref_count[pool.tables[parent][:2]].tolist() == [4, 4]
    assert pool.ref_count[pool.tables[parent][2]] == 1
    shared = pool.num_used_blocks
    unshared = sum(-(-pool.lengths[s] // block) for s in pool.tables)
    assert shared < unshared
    for s in [parent, *children]:
        pool.free_sequence(s)
    assert pool.num_free_blocks == 32 and int(pool.ref_count.sum()) == 0


def test_random_forks_and_frees_never_leak_or_overwrite():
    for seed in range(5):
        rng = random.Random(seed)
        block = rng.choice([1, 2, 3, 5])
        pool = PagedKVCache(60, block, num_layers=1, num_kv_heads=1, head_dim=1)
        content: dict[int, list[float]] = {}
        value = 0.0
        for _ in range(60):
            action = rng.random()
            if action < 0.3 or not content:
                seq = pool.new_sequence()
                content[seq] = []
            elif action < 0.5:
                parent = rng.choice(list(content))
                seq = pool.fork(parent)
                content[seq] = list(content[parent])
            elif action < 0.65:
                seq = rng.choice(list(content))
                pool.free_sequence(seq)
                del content[seq]
                continue
            else:
                seq = rng.choice(list(content))
            n = rng.randint(1, 4)
            if not pool.can_extend([seq], n):
                continue
            batch = pool.extend([seq], n)
            new = torch.arange(value, value + n).view(1, 1, n, 1)
            value += n
            zeros = torch.zeros(1, 1, n, 1)
            batch.layer(0).update(new, zeros)
            content[seq] += new.flatten().tolist()
            for s, want in content.items():
                assert pool.gather(0, s)[0].flatten().tolist() == want
        for s in list(content):
            pool.free_sequence(s)
        assert pool.num_free_blocks == 60 and int(pool.ref_count.sum()) == 0


def test_a_paged_batch_is_refused_where_it_does_not_fit():
    lm = model()
    pool = PagedKVCache(8, 4, num_layers=2, num_kv_heads=2, head_dim=8)  # 2 heads, not 4
    seq = pool.new_sequence()
    batch = pool.extend([seq], 3)
    assert isinstance(batch, PagedBatch) and isinstance(batch, KVCache)
    with pytest.raises(ValueError, match="paged cache holds"):
        lm(ids(3)[None], cache=batch, mask=batch.mask, positions=batch.positions)
    with pytest.raises(TypeError, match="num_blocks"):
        PagedKVCache(2.0, 4, num_layers=1, num_kv_heads=1, head_dim=1)
    with pytest.raises(ValueError, match="head_dim"):
        PagedKVCache(2, 4, num_layers=1, num_kv_heads=1, head_dim=0)
    with pytest.raises(ValueError, match="num_new"):
        pool.extend([seq], 0)
    hybrid = CausalLM(V, 32, 4, 2, 64, positional="rope", layer_types=["linear", "full"])
    with pytest.raises(ValueError, match="'linear'"):  # a fixed-size state, not blocks
        PagedKVCache.for_model(hybrid, 8, 4)
    with pytest.raises(ValueError, match="distinct sequence ids of"):
        pool.extend([seq, seq], 1)  # would reserve twice
    with pytest.raises(ValueError, match="distinct sequence ids of"):
        pool.fork(seq + 1)
    pool.free_sequence(seq)
    with pytest.raises(ValueError, match="distinct sequence ids of"):
        pool.free_sequence(seq)  # freed twice
    assert pool.num_free_blocks == 8
