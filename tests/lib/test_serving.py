"""The continuous-batching engine (chapter 12): over random request mixes
(prompt and output lengths, arrival order, block sizes, eos, pool sizes) no
request's tokens change against generating it alone, and every block is freed."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from attention_lib import CausalLM, generate
from attention_lib.serving import Engine, Request

V = 23


@pytest.fixture(scope="module", params=["learned", "rope"])
def lm(request) -> CausalLM:
    torch.manual_seed(7)
    options = {"num_kv_heads": 2} if request.param == "rope" else {}
    return CausalLM(V, 32, 4, 2, 40, positional=request.param, **options).eval()


def alone(lm: CausalLM, r: Request) -> torch.Tensor:
    """What generate() gives the request by itself (cut after its eos)."""
    return generate(lm, [r.prompt], r.max_new_tokens, eos_token_id=r.eos_token_id)[0]


def random_requests(rng: random.Random, n: int, eos: int | None) -> list[Request]:
    out = []
    for _ in range(n):
        prompt = torch.tensor([rng.randrange(V) for _ in range(rng.randint(1, 12))])
        out.append(Request(prompt, rng.randint(1, 14), eos, arrival=rng.randint(0, 10)))
    rng.shuffle(out)  # submitted in any order; served by arrival
    return out


def test_random_mixes_keep_every_request_s_tokens_and_free_every_block(lm):
    preempted = 0
    for seed in range(8):
        rng = random.Random(seed)
        eos = rng.choice([None, 3, 5])
        block = rng.choice([1, 2, 4, 7])
        num_blocks = rng.choice([-(-27 // block), 2 * -(-27 // block), 64])  # tight to roomy
        requests = random_requests(rng, rng.randint(1, 9), eos)
        engine = Engine(
            lm, num_blocks, block, rng.randint(1, 6), policy=rng.choice(["continuous", "static"])
        )
        outputs = engine.run(requests)
        for r, out in zip(requests, outputs):
            assert torch.equal(out, alone(lm, r)), (seed, r)
        assert engine.cache.num_free_blocks == num_blocks
        assert engine.cache.all_free()
        assert max(b for _, b in engine.trace) <= num_blocks
        assert max(n for n, _ in engine.trace) <= engine.max_batch_size
        preempted += engine.preemptions
    assert preempted > 0  # the tight pools did run out of blocks


def test_a_sliding_window_model_is_served_exactly():
    """The paged batch keeps every key; the model's window mask (counted in key
    columns, which are contiguous per row after the left padding) hides the old
    ones, as generate()'s rolling cache drops them."""
    torch.manual_seed(7)
    lm = CausalLM(V, 32, 4, 2, 40, positional="rope", num_kv_heads=2, window=4).eval()
    requests = random_requests(random.Random(3), 7, eos=None)
    engine = Engine(lm, 12, 4, 3)
    for r, out in zip(requests, engine.run(requests)):
        assert torch.equal(out, alone(lm, r))
    assert engine.cache.num_free_blocks == 12


def test_continuous_batching_takes_fewer_steps_than_static(lm):
    rng = random.Random(11)
    requests = [
        Request(torch.tensor([rng.randrange(V) for _ in range(rng.randint(2, 8))]), n)
        for n in [2, 14, 3, 12, 2, 13, 4, 11]
    ]
    steps, results = {}, {}
    for policy in ("continuous", "static"):
        engine = Engine(lm, 64, 4, 4, policy=policy)
        fresh = [Request(r.prompt, r.max_new_tokens) for r in requests]
        results[policy] = engine.run(fresh)
        steps[policy] = engine.steps
        occupancy = [0] + [n for n, _ in engine.trace]
        admissions = sum(b > a for a, b in itertools.pairwise(occupancy))
        if policy == "static":  # a batch is never topped up while it runs: 2 batches of 4
            assert admissions == 2
    assert steps["continuous"] < steps["static"]
    for a, b in zip(results["continuous"], results["static"]):
        assert torch.equal(a, b)


def test_clear_errors(lm):
    engine = Engine(lm, 4, 2, 2)
    with pytest.raises(TypeError, match="Request"):
        engine.submit(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="cannot fit"):
        engine.submit(Request(torch.tensor([1, 2, 3]), 8))  # 11 tokens > 4 blocks of 2
    with pytest.raises(ValueError, match="vocab_size"):
        engine.submit(Request(torch.tensor([V]), 2))
    with pytest.raises(ValueError, match="not empty"):
        engine.submit(Request(torch.tensor([], dtype=torch.long), 2))
    with pytest.raises(TypeError, match="torch.Tensor"):
        engine.submit(Request([1, 2], 2))
    with pytest.raises(TypeError, match="eos_token_id"):  # would never match: never stop
        engine.submit(Request(torch.tensor([1, 2]), 2, eos_token_id=1.0))
    with pytest.raises(ValueError, match="arrival"):
        engine.submit(Request(torch.tensor([1, 2]), 2, arrival=-1))
    assert not engine.waiting  # nothing refused was queued
    with pytest.raises(ValueError, match="policy"):
        Engine(lm, 4, 2, policy="fifo")
    with pytest.raises(TypeError, match="CausalLM"):
        Engine(torch.nn.Linear(2, 2), 4, 2)
    with pytest.raises(TypeError, match="num_blocks"):
        Engine(lm, 4.0, 2)
