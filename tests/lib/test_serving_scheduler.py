"""The engine's scheduler (chapter 12): chunked prefill under a token budget,
prefix caching by hash with LRU eviction, the admission watermark, every
attention layer type served, and TTFT/TPOT. Under random request mixes no
request's tokens change against generating it alone, and every block is freed."""

from __future__ import annotations

import math
import random

import pytest
import torch

from attention_lib import CausalLM, generate
from attention_lib.layer_types import LayerSpec
from attention_lib.paged_cache import PagedKVCache
from attention_lib.serving import Engine, Request

V = 23
KINDS = {
    "rope-gqa": {"positional": "rope", "num_kv_heads": 2},
    "learned": {},
    "sliding": {"positional": "rope", "layer_types": ["sliding", "sliding"], "window": 5},
    "mixed": {
        "positional": "rope",
        "layer_types": ["sliding", "chunked", "full"],
        "window": 5,
        "chunk_size": 6,
    },
    "chunked": {"positional": "rope", "layer_types": ["chunked", "chunked"], "chunk_size": 6},
    "sinks-softcap": {"positional": "rope", "sink": True, "softcap": 3.0, "window": 6},
    "mla": {"positional": "rope", "layer_types": ["mla", "full"]},
    "dsa-sliding": {
        "positional": "rope",
        "layer_types": [LayerSpec("dsa", index_topk=3), "sliding"],
        "window": 5,
    },
    "linear-sliding-full": {
        "positional": "rope",
        "layer_types": ["linear", "sliding", "full"],
        "window": 5,
    },
    "linear-mla": {"positional": "rope", "layer_types": ["linear", "mla"]},
    "kda-mamba2-full": {"positional": "rope", "layer_types": ["kda", "mamba2", "full"]},
    "every-type": {
        "positional": "rope",
        "layer_types": ["linear", "chunked", "mla", "sliding"],
        "window": 4,
        "chunk_size": 4,
    },
}
RECURRENT = {
    "linear-sliding-full",
    "linear-mla",
    "kda-mamba2-full",
    "every-type",
}  # a state per sequence: no prefix caching


def model(kind: str) -> CausalLM:
    torch.manual_seed(7)
    options = dict(KINDS[kind])
    layers = len(options.get("layer_types", [0, 0]))
    return CausalLM(V, 32, 4, layers, 40, **options).eval()


def alone(lm: CausalLM, r: Request) -> torch.Tensor:
    """What generate() gives the request by itself (cut after its eos)."""
    return generate(lm, r.prompt[None], r.max_new_tokens, eos_token_id=r.eos_token_id)[0][
        : len(r.prompt) + len(r.output)
    ]


def fresh(requests: list[Request]) -> list[Request]:
    return [Request(r.prompt, r.max_new_tokens, r.eos_token_id, r.arrival) for r in requests]


@pytest.mark.parametrize("kind", list(KINDS))
def test_random_mixes_and_schedules_keep_every_request_s_tokens(kind):
    lm = model(kind)
    preempted = hits = 0
    for seed in range(8):
        rng = random.Random(seed)
        eos = rng.choice([None, 3, 5])
        block = rng.choice([1, 2, 4, 7])
        num_blocks = rng.choice([-(-27 // block), 2 * -(-27 // block), 64])  # tight to roomy
        shared = [rng.randrange(V) for _ in range(rng.randint(0, 9))]  # a common prefix
        requests = []
        for _ in range(rng.randint(1, 9)):
            prompt = torch.tensor(shared + [rng.randrange(V) for _ in range(rng.randint(1, 12))])
            requests.append(Request(prompt, rng.randint(1, 14), eos, arrival=rng.randint(0, 10)))
        budget = rng.choice([None, 1, 3, 8, 40])
        engine = Engine(
            lm, num_blocks, block, rng.randint(1, 6), policy=rng.choice(["continuous", "static"]),
            max_num_batched_tokens=budget,
            enable_prefix_caching=rng.random() < 0.6 and kind not in RECURRENT,
            watermark=rng.choice([0.0, 0.01, 0.1]),
        )  # fmt: skip
        for r, out in zip(requests, engine.run(requests)):
            assert torch.equal(out, alone(lm, r)), (seed, r)
        assert engine.cache.all_free()  # every block and slot came back
        assert max(b for _, b in engine.trace) <= num_blocks * len(engine.cache.groups)
        assert max(n for n, _ in engine.trace) <= engine.max_batch_size
        if budget is not None:
            assert max(engine.batched) <= budget
        preempted += engine.preemptions
        hits += sum(r.cached for r in requests)
    assert preempted > 0  # tight pools ran out
    assert (hits > 0) == (kind not in RECURRENT)  # prefixes were found where they can be


def test_chunked_prefill_mixes_chunks_and_decode_rows_under_the_budget():
    lm = model("rope-gqa")
    long = Request(torch.arange(30) % V, 4)
    short = [Request(torch.tensor([1, 2, 3]), 8) for _ in range(3)]
    engine = Engine(lm, 64, 4, 8, max_num_batched_tokens=8)
    outputs = engine.run(short + [long])
    assert all(torch.equal(o, alone(lm, r)) for o, r in zip(outputs, short + [long]))
    assert max(engine.batched) == 8  # never more tokens in a step
    # the long prompt was prefilled in chunks while the short ones decoded: each
    # decoding request got a token at every step
    assert math.ceil(30 / 5) <= long.first_step + 1 <= 30
    assert all(engine.latency(r).tpot_steps == 1.0 for r in short)
    whole = Engine(lm, 64, 4, 8)
    whole.run(fresh(short + [long]))
    assert max(whole.batched) > 8  # a whole prefill is one long forward pass


def test_prefix_caching_shares_full_blocks_by_hash_and_saves_work():
    lm = model("rope-gqa")
    system = torch.arange(12) % V  # a shared system prompt: 3 full blocks of 4
    requests = [Request(torch.cat([system, torch.tensor([i, i + 1])]), 3, arrival=i)
                for i in range(5)]  # fmt: skip
    work = {}
    for caching in (False, True):
        engine = Engine(lm, 32, 4, 4, enable_prefix_caching=caching)
        served = fresh(requests)
        for r, out in zip(served, engine.run(served)):
            assert torch.equal(out, alone(lm, r))
        work[caching] = engine.computed_tokens
        if caching:  # every request after the first found the system prompt's 3 blocks
            assert [r.cached for r in served] == [0, 12, 12, 12, 12]
        assert engine.cache.num_free_blocks == 32
    assert work[True] == work[False] - 4 * 12


def test_unheld_published_blocks_are_evicted_least_recently_released_first():
    pool = PagedKVCache(4, 2, num_layers=1, num_kv_heads=1, head_dim=2)
    a, b = pool.new_sequence(), pool.new_sequence()
    pool.extend([a], 4), pool.extend([b], 2)
    pool.publish(a, [1, 2, 3, 4]), pool.publish(b, [5, 6])
    first, second = pool.tables[a]
    pool.free_sequence(b)  # released first
    pool.free_sequence(a)
    assert pool.match_prefix([1, 2, 3, 4]) == [first, second]  # still findable
    c = pool.new_sequence()
    pool.share_prefix(c, pool.match_prefix([1, 2, 9]))  # takes [1, 2]'s block back
    assert pool.tables[c] == [first] and int(pool.ref_count[first]) == 1
    pool.extend([c], 4)  # 2 new blocks: the never-used one, then b's (released before a's)
    assert pool.match_prefix([5, 6]) == [] and pool.match_prefix([1, 2, 3, 4]) == [first, second]
    pool.extend([c], 2)  # the last free block: a's second one is evicted
    assert pool.match_prefix([1, 2, 3, 4]) == [first]
    assert pool.match_prefix([1, 7]) == []  # tokens are compared, not only hashes
    pool.free_sequence(c)
    assert pool.num_free_blocks == 4


def test_the_watermark_leaves_room_to_grow():
    lm = model("rope-gqa")
    rng = random.Random(0)
    jobs = [(torch.tensor([rng.randrange(V) for _ in range(rng.randint(2, 10))]),
             rng.randint(4, 20)) for _ in range(12)]  # fmt: skip
    preemptions = {}
    for watermark in (0.0, 0.25):
        engine = Engine(lm, 16, 4, 6, watermark=watermark)
        requests = [Request(p, n) for p, n in jobs]
        for r, out in zip(requests, engine.run(requests)):
            assert torch.equal(out, alone(lm, r))
        preemptions[watermark] = engine.preemptions
    assert preemptions[0.25] < preemptions[0.0]


def test_sliding_layers_release_the_blocks_out_of_the_window():
    lm = model("sliding")  # window 5, every layer sliding
    engine = Engine(lm, 64, 2, 4, max_num_batched_tokens=6)
    requests = [Request(torch.arange(n) % V, 20) for n in (3, 9, 14)]
    for r, out in zip(requests, engine.run(requests)):
        assert torch.equal(out, alone(lm, r))
    # each sequence holds at most the window's blocks (+1 partial, +1 new)
    assert max(b for _, b in engine.trace) <= 3 * (-(-5 // 2) + 2)
    assert engine.cache.num_free_blocks == 64
    full = Engine(model("rope-gqa"), 64, 2, 4, max_num_batched_tokens=6)
    full.run(fresh(requests))
    assert max(b for _, b in full.trace) > max(b for _, b in engine.trace)


def test_latency_in_steps_and_seconds():
    lm = model("learned")
    engine = Engine(lm, 32, 4, 2)
    requests = [Request(torch.tensor([1, 2, 3]), 4), Request(torch.tensor([4]), 1),
                Request(torch.tensor([5, 6]), 3, arrival=2)]  # fmt: skip
    engine.run(requests)
    first = engine.latency(requests[0])
    # admitted at step 0: its prefill's token and a decode token, then one per step
    assert first.ttft_steps == 1 and first.tpot_steps == 2 / 3
    assert first.ttft_seconds > 0 and first.tpot_seconds > 0
    assert math.isnan(engine.latency(requests[1]).tpot_steps)  # one token: no gap
    assert engine.latency(requests[2]).ttft_steps >= 1
    with pytest.raises(ValueError, match="no token"):
        engine.latency(Request(torch.tensor([1]), 1))


def test_clear_errors():
    lm = model("learned")
    with pytest.raises(ValueError, match="max_len"):
        Engine(lm, 8, 4, max_num_batched_tokens=41)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        Engine(lm, 8, 4, max_num_batched_tokens=0)
    with pytest.raises(ValueError, match="watermark"):
        Engine(lm, 8, 4, watermark=1.0)
    with pytest.raises(TypeError, match="enable_prefix_caching"):
        Engine(lm, 8, 4, enable_prefix_caching=1)
    hybrid = model("linear-mla")
    with pytest.raises(ValueError, match="prefix caching needs blocks"):  # a state per sequence
        Engine(hybrid, 8, 4, enable_prefix_caching=True)
    hybrid.blocks.layers[1].self_attn = torch.nn.Identity()  # no cache protocol: named
    with pytest.raises(ValueError, match="layer 1 .* cannot be served"):
        Engine(hybrid, 8, 4)


def test_each_group_holds_what_its_layers_keep():
    """Per-group block tables: the full group keeps every block, the sliding
    group only its window's, the linear layer one slot of fixed size."""
    lm = model("linear-sliding-full")  # window 5
    engine = Engine(lm, 64, 2, 1)
    one = Request(torch.arange(1, 4), 30)
    engine.submit(one)
    held = []
    while not one.finished:
        engine.step()
        if one.seq is not None:
            held.append((one.computed, engine.cache.nbytes_of(one.seq)))
    assert torch.equal(one.tokens(), alone(lm, one))
    assert engine.cache.names == ["linear", "sliding", "full"]
    _, sliding, full = engine.cache.groups
    assert len({h["linear"] for _, h in held}) == 1 and held[0][1]["linear"] > 0
    assert max(h["sliding"] for _, h in held) <= (-(-5 // 2) + 1) * sliding.block_nbytes
    for computed, h in held:
        assert h["full"] == -(-computed // 2) * full.block_nbytes
    assert engine.cache.all_free()
