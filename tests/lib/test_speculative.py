"""Speculative decoding, the exact acceptance rule and tree attention (chapter 13)."""

from __future__ import annotations

import math

import pytest
import torch

from attention_lib import CausalLM, KVCache, PagedKVCache, generate
from attention_lib.speculative import (
    acceptance_distribution,
    expected_tokens,
    prompt_lookup,
    speculative_decode,
    tree_mask,
    verify_guesses,
)

V = 23
TARGETS = {  # every kind of per-layer cache the verification must roll back
    "full": {},
    "gqa-rope": {"positional": "rope", "num_kv_heads": 2},
    "sliding": {"positional": "rope", "window": 5},  # a rolling cache that drops tokens
    "chunked": {"positional": "rope", "layer_types": ["chunked", "full"], "chunk_size": 4},
    "linear": {"positional": "rope", "layer_types": ["linear", "full"]},  # a state
    "mla": {"positional": "rope", "layer_types": ["mla", "full"]},
}


def lm(seed: int = 0, d_model: int = 32, layers: int = 2, **options) -> CausalLM:
    torch.manual_seed(seed)
    return CausalLM(V, d_model, 4, layers, 64, **options).double().eval()


def ids(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(V, (1, n), generator=torch.Generator().manual_seed(seed))


def bernstein(p: torch.Tensor, n: int, delta: float) -> torch.Tensor:
    """The count deviation ``t`` that a binomial ``(n, p)`` count exceeds with
    probability at most ``delta`` (Bernstein's inequality,
    ``P(|S - np| >= t) <= 2 exp(-t^2 / (2 (n p (1 - p) + t / 3)))``): sound for
    small ``p`` too, where a normal approximation is not."""
    log = math.log(2 / delta)
    return log / 3 + (log**2 / 9 + 2 * log * n * p * (1 - p)).sqrt()


def repetitive(n: int) -> torch.Tensor:
    """A prompt that repeats itself (prompt lookup finds matches)."""
    return ids(7).repeat(1, n // 7 + 1)[:, :n]


@pytest.mark.parametrize("name", list(TARGETS))
@pytest.mark.parametrize("k", [1, 3])
def test_greedy_speculative_tokens_equal_greedy_generate(name, k) -> None:
    target, prompt = lm(**TARGETS[name]), ids(6)
    greedy = generate(target, prompt, 25)
    for draft in (lm(seed=2, d_model=16, layers=1), lm(seed=3, d_model=16, **TARGETS[name])):
        assert torch.equal(generate(target, prompt, 25, assistant_model=draft,
                                    num_assistant_tokens=k), greedy)  # fmt: skip
    # the target as its own draft: every guess accepted, k + 1 tokens per pass
    tokens, stats = speculative_decode(target, prompt, 24, assistant_model=target,
                                       num_assistant_tokens=k)  # fmt: skip
    assert torch.equal(tokens, greedy[:, :-1]) and stats.acceptance_rate == 1
    assert stats.verifications == math.ceil(24 / (k + 1))
    looked = generate(target, repetitive(20), 25, prompt_lookup_num_tokens=k)
    assert torch.equal(looked, generate(target, repetitive(20), 25))


def test_prompt_lookup_copies_after_the_first_match() -> None:
    t = torch.tensor([5, 1, 2, 3, 9, 1, 2, 4, 7, 1, 2])
    assert prompt_lookup(t, 2).tolist() == [3, 9]  # after the first "1 2"
    assert prompt_lookup(torch.tensor([4, 8, 4]), 3).tolist() == [8, 4]  # a 1-gram
    assert prompt_lookup(torch.tensor([1, 2, 3]), 3).numel() == 0
    tokens, stats = speculative_decode(lm(), repetitive(30), 20, prompt_lookup_num_tokens=4)
    assert stats.drafted > 0 and tokens.shape == (1, 50)


def test_eos_stops_speculative_decoding_where_generate_stops() -> None:
    target, draft, prompt = lm(), lm(seed=4, d_model=16), ids(5)
    greedy = generate(target, prompt, 20)
    eos = int(greedy[0, 10])
    want = generate(target, prompt, 20, eos_token_id=eos)
    got = generate(target, prompt, 20, eos_token_id=eos, assistant_model=target)
    assert torch.equal(got, want[:, : want.shape[1]]) and int(got[0, -1]) == eos
    assert torch.equal(generate(target, prompt, 20, eos_token_id=eos, assistant_model=draft), got)


@pytest.mark.parametrize("mode", ["assistant", "lookup"])
def test_tokens_equal_transformers_assisted_generation(mode) -> None:
    transformers = pytest.importorskip("transformers")

    def llama(seed: int, layers: int, width: int):
        torch.manual_seed(seed)
        config = transformers.LlamaConfig(
            vocab_size=V, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        )  # fmt: skip
        return transformers.LlamaForCausalLM(config).double().eval()

    theirs_target, theirs_draft = llama(0, 2, 32), llama(1, 1, 16)
    target, draft = CausalLM.from_hf(theirs_target), CausalLM.from_hf(theirs_draft)
    prompt = repetitive(12)
    options = (
        {"assistant_model": theirs_draft, "num_assistant_tokens": 3}
        if mode == "assistant"
        else {"prompt_lookup_num_tokens": 3}
    )
    with torch.no_grad():
        theirs = theirs_target.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False,
            pad_token_id=0, **options,
        )  # fmt: skip
    if mode == "assistant":
        options["assistant_model"] = draft
    eos = theirs_target.generation_config.eos_token_id  # transformers stops there
    assert torch.equal(generate(target, prompt, 20, eos_token_id=eos, **options), theirs)


def test_the_acceptance_rule_gives_the_target_distribution_exactly() -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        p = torch.rand(7, generator=g, dtype=torch.float64) ** 3
        q = torch.rand(7, generator=g, dtype=torch.float64) ** 3
        p[int(torch.randint(7, (), generator=g))] = 0  # tokens one side never proposes
        p, q = p / p.sum(), q / q.sum()
        assert (acceptance_distribution(p, q) - p).abs().max() < 1e-9
    assert (acceptance_distribution(p, p) - p).abs().max() < 1e-15  # all accepted


def test_sampled_frequencies_follow_the_target_within_a_stated_bound() -> None:
    """N draws of one verification step (one guess from q, then the rule): each
    token's count is within Bernstein's bound of N p (a false alarm below
    1e-6 for the whole test)."""
    g = torch.Generator().manual_seed(1)
    p = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0], dtype=torch.float64)
    q = torch.tensor([0.1, 0.2, 0.2, 0.3, 0.2], dtype=torch.float64)
    p2 = torch.tensor([0.2, 0.2, 0.2, 0.2, 0.2], dtype=torch.float64)
    n, counts = 20000, torch.zeros(5, dtype=torch.float64)
    for _ in range(n):
        guess = torch.multinomial(q, 1, generator=g)
        a, token = verify_guesses(torch.stack([p, p2]), guess, q[None], generator=g)
        counts[int(guess) if a else token] += 1
    assert ((counts - n * p).abs() <= bernstein(p, n, 1e-6 / 5)).all(), (counts / n, p)
    assert counts[4] == 0  # a token the target never emits is never emitted


def test_speculative_sampling_matches_the_target_over_whole_sequences() -> None:
    """The first two tokens after a prompt: the count of every pair within
    Bernstein's bound of the target's exact pair probabilities (a false
    alarm below 1e-6 for the whole test)."""
    target, draft, prompt = lm(d_model=16, layers=1), lm(seed=5, d_model=16, layers=1), ids(3)
    with torch.no_grad():
        first = target(prompt)[0, -1].softmax(-1)  # (V,)
        pairs = torch.cat([prompt.repeat(V, 1), torch.arange(V)[:, None]], 1)
        second = target(pairs)[:, -1].softmax(-1)  # (V, V)
    exact = first[:, None] * second  # (V, V)
    g, n = torch.Generator().manual_seed(2), 2000
    counts = torch.zeros(V, V, dtype=torch.float64)
    for _ in range(n):
        out = generate(target, prompt, 2, do_sample=True, generator=g, assistant_model=draft,
                       num_assistant_tokens=2)  # fmt: skip
        counts[int(out[0, -2]), int(out[0, -1])] += 1
    assert ((counts - n * exact).abs() <= bernstein(exact, n, 1e-6 / V**2)).all()


def test_expected_tokens_per_verification() -> None:
    assert expected_tokens(0.0, 4) == 1 and expected_tokens(1.0, 4) == 5
    assert abs(expected_tokens(0.5, 2) - 1.75) < 1e-15
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens(1.5, 2)


def test_tree_forward_equals_one_forward_per_branch() -> None:
    parents = [-1, 0, 0, 1, 1, 2, -1, 6]  # two roots, branching
    target, prompt = lm(positional="rope", num_kv_heads=2), ids(5)
    keep, positions = tree_mask(parents, past=5)
    assert positions.tolist() == [5, 6, 6, 7, 7, 7, 5, 6]
    nodes = ids(len(parents), seed=9)
    cache = KVCache()
    with torch.no_grad():
        target(prompt, cache=cache)
        tree = target(nodes, cache=cache, mask=keep[None], positions=positions)[0]
    for leaf in (3, 4, 5, 7):
        path = [leaf]
        while parents[path[0]] >= 0:
            path.insert(0, parents[path[0]])
        with torch.no_grad():
            branch = target(torch.cat([prompt, nodes[:, path]], 1))[0, 5:]
        assert (tree[path] - branch).abs().max() < 1e-12


def test_tree_mask_and_per_token_masks_refuse_what_they_cannot_do() -> None:
    for bad in ([0], [-1, 1], [-1, 0, 5], [-2]):
        with pytest.raises(ValueError, match="parents"):
            tree_mask(bad)
    keep, positions = tree_mask([-1, 0, 0])
    for name in ("sliding", "linear"):
        with pytest.raises(ValueError, match="per-token mask"):
            lm(**TARGETS[name])(ids(3), mask=keep[None], positions=positions)


@pytest.mark.parametrize("name", list(TARGETS))
def test_rollback_is_as_if_the_rejected_tokens_were_never_seen(name) -> None:
    target, prefix, rejected, rest = lm(**TARGETS[name]), ids(9), ids(3, seed=7), ids(4, seed=8)
    with torch.no_grad():
        want = target(torch.cat([prefix, rest], 1))[0, 9:]
        cache = KVCache(keep_last=target.window)
        target(prefix[:, :7], cache=cache)
        cache.snapshot()  # before the guesses (needed by a state, a rolling cache, a chunk)
        target(torch.cat([prefix[:, 7:], rejected], 1), cache=cache)
        cache.crop(3 + 2)  # back to the snapshot: then read the accepted tokens again
        target(prefix[:, 7:], cache=cache)
        got = target(rest, cache=cache)[0]
    assert cache.position == 13 and (got - want).abs().max() < 1e-12
    if name in ("full", "gqa-rope", "mla"):  # these forget without a snapshot
        with torch.no_grad():
            cache = KVCache()
            target(torch.cat([prefix, rejected], 1), cache=cache)
            cache.crop(3)
            assert (target(rest, cache=cache)[0] - want).abs().max() < 1e-12


def test_a_cache_that_cannot_crop_changes_nothing() -> None:
    target = lm(**TARGETS["linear"])
    cache = KVCache()
    with torch.no_grad():
        target(ids(6), cache=cache)
    held = [dict(vars(layer)) for layer in cache.layers]
    with pytest.raises(ValueError, match="recurrent state"):
        cache.crop(2)  # no snapshot; the full layer could, the state layer cannot
    assert all(vars(layer) == h for layer, h in zip(cache.layers, held))


def test_a_paged_sequence_crops_its_last_tokens() -> None:
    target = lm()
    tokens, rejected = ids(10)[0], ids(3, seed=4)[0]
    pool = PagedKVCache.for_model(target, 16, 4)
    seq = pool.new_sequence()

    def read(new: torch.Tensor) -> torch.Tensor:
        batch = pool.extend([seq], len(new))
        with torch.no_grad():
            return target(new[None], cache=batch, mask=batch.mask, positions=batch.positions)

    read(tokens[:6])
    pool.publish(seq, tokens[:6].tolist())
    read(torch.cat([tokens[6:8], rejected]))  # 11 tokens: three blocks
    free = pool.num_free_blocks
    pool.crop(seq, 3)
    assert pool.lengths[seq] == 8 and pool.num_free_blocks == free + 1
    got = read(tokens[8:])[0]
    with torch.no_grad():
        want = target(tokens[None])[0, 8:]
    assert (got - want).abs().max() < 1e-12
    with pytest.raises(ValueError, match="cannot crop"):
        pool.crop(seq, 11)


def test_bad_speculative_input_is_refused_clearly() -> None:
    target, prompt = lm(), ids(4)
    with pytest.raises(ValueError, match="vocabulary"):
        generate(target, prompt, 3, assistant_model=CausalLM(V + 1, 16, 2, 1, 64))
    with pytest.raises(ValueError, match="num_assistant_tokens"):
        generate(target, prompt, 3, assistant_model=target, num_assistant_tokens=0)
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens"):
        generate(target, prompt, 3, prompt_lookup_num_tokens=0)
    with pytest.raises(ValueError, match="exactly one"):
        speculative_decode(target, prompt, 3, assistant_model=target, prompt_lookup_num_tokens=2)
    with pytest.raises(ValueError, match="one prompt"):
        generate(target, ids(4).repeat(2, 1), 3, assistant_model=target)
    with pytest.raises(TypeError, match="CausalLM"):
        generate(target, prompt, 3, assistant_model="draft")
    with pytest.raises(ValueError, match="max_len"):
        generate(target, prompt, 61, assistant_model=lm(d_model=16))
