"""Ragged batches (chapter 12): generate() on prompts of different lengths, left
padding, per-sequence positions and eos; anchored on 🤗 transformers' generate
with left padding (a tiny random Llama, nothing downloaded)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from attention_lib import CausalLM, KVCache, generate

V = 29


def model(positional: str, **options) -> CausalLM:
    torch.manual_seed(3)
    return CausalLM(V, 32, 4, 2, 48, positional=positional, **options).eval()


def prompts(lengths: list[int], seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, V, (n,), generator=g) for n in lengths]


def alone(lm: CausalLM, ps: list[torch.Tensor], n: int, **kwargs) -> list[torch.Tensor]:
    return [generate(lm, p[None], n, **kwargs)[0] for p in ps]


def left_pad(ps: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(p) for p in ps)
    ids = torch.stack([torch.cat([p.new_zeros(longest - len(p)), p]) for p in ps])
    mask = torch.stack([torch.arange(longest) >= longest - len(p) for p in ps]).long()
    return ids, mask


CASES = [
    ("learned", {}),
    ("sinusoidal", {}),
    ("rope", {}),
    ("rope", {"num_kv_heads": 2, "window": 5}),  # GQA, and a window with a rolling cache
]


@pytest.mark.parametrize("positional, options", CASES)
@pytest.mark.parametrize("use_cache", [True, False])
def test_every_sequence_gets_the_tokens_it_gets_alone(positional, options, use_cache):
    lm = model(positional, **options)
    for seed in range(3):
        ps = prompts([7, 1, 12, 4][seed:] + [2, 9][:seed], seed)
        out = generate(lm, ps, 14, use_cache=use_cache)
        want = alone(lm, ps, 14)
        assert [len(o) for o in out] == [len(p) + 14 for p in ps]
        for o, w in zip(out, want):
            assert torch.equal(o, w)


@pytest.mark.parametrize("positional, options", CASES[:3])
def test_padded_tensor_with_mask_equals_the_list(positional, options):
    lm = model(positional, **options)
    ps = prompts([3, 8, 5])
    ids, mask = left_pad(ps)
    out = generate(lm, ids, 9, attention_mask=mask)
    assert out.shape == (3, 8 + 9)
    for row, m, want in zip(out, mask, generate(lm, ps, 9)):
        assert torch.equal(row[int((m == 0).sum()) :], want)


def test_logits_of_a_padded_batch_match_each_sequence_alone():
    lm = model("rope", num_kv_heads=2)
    ps = prompts([2, 6, 4])
    ids, mask = left_pad(ps)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    cache = KVCache()
    with torch.no_grad():
        batched = lm(ids, cache=cache, mask=mask, positions=positions)[:, -1]  # (B, V)
        nxt = batched.argmax(-1, keepdim=True)
        mask2 = torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], 1)
        step = lm(nxt, cache=cache, mask=mask2, positions=positions[:, -1:] + 1)[:, -1]
        for row, p in enumerate(ps):
            single = lm(torch.cat([p, nxt[row]])[None])  # (1, T, V)
            torch.testing.assert_close(batched[row], single[0, -2], atol=1e-5, rtol=0)
            torch.testing.assert_close(step[row], single[0, -1], atol=1e-5, rtol=0)


def test_equal_lengths_keep_the_old_behaviour():
    lm = model("learned")
    ps = prompts([5, 5, 5])
    stacked = torch.stack(ps)
    old = generate(lm, stacked, 10)
    assert torch.equal(old, torch.stack(generate(lm, ps, 10)))
    assert torch.equal(old, generate(lm, stacked, 10, attention_mask=torch.ones_like(stacked)))


@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_each_sequence_stops_at_its_eos(positional):
    lm = model(positional)
    ps = prompts([4, 9, 2, 6], seed=5)
    full = alone(lm, ps, 16)
    eos = int(full[0][len(ps[0]) + 3])  # the 4th new token of the first sequence
    out = generate(lm, ps, 16, eos_token_id=eos)
    stopped = 0
    for o, f, p in zip(out, full, ps):
        new = f[len(p) :]
        hits = (new == eos).nonzero()
        cut = len(new) if not len(hits) else int(hits[0]) + 1
        stopped += cut < len(new)
        assert torch.equal(o, f[: len(p) + cut])
    assert stopped >= 1
    # a tensor prompt: finished rows repeat eos; generation ends when all have
    ids, mask = left_pad(ps)
    padded = generate(lm, ids, 16, attention_mask=mask, eos_token_id=eos)
    n = padded.shape[1] - ids.shape[1]
    assert n == max(len(o) - len(p) for o, p in zip(out, ps))  # ends when the last stops
    for row, f, p in zip(padded, full, ps):
        want = f[len(p) : len(p) + n].clone()
        hits = (want == eos).nonzero()
        if len(hits):
            want[int(hits[0]) :] = eos  # a finished row repeats its eos
        assert torch.equal(row[ids.shape[1] :], want)


def test_eos_everywhere_stops_early():
    lm = model("learned")
    ps = prompts([3, 5])
    first = [int(o[len(p)]) for o, p in zip(alone(lm, ps, 1), ps)]
    if first[0] == first[1]:
        out = generate(lm, torch.stack([ps[0], ps[0]]), 10, eos_token_id=first[0])
        assert out.shape[1] == 4
    out = generate(lm, [ps[0]], 10, eos_token_id=first[0])
    assert len(out[0]) == len(ps[0]) + 1


def test_clear_errors():
    lm = model("learned")
    ps = prompts([3, 5])
    ids, mask = left_pad(ps)
    with pytest.raises(ValueError, match="left padding"):
        generate(lm, ids, 2, attention_mask=mask.flip(1))  # right padding
    with pytest.raises(ValueError, match="tensor prompt"):
        generate(lm, ps, 2, attention_mask=mask)
    with pytest.raises(ValueError, match="empty"):
        generate(lm, [], 2)
    with pytest.raises(ValueError, match="1-D"):
        generate(lm, [ids], 2)
    with pytest.raises(TypeError, match="torch.Tensor"):
        generate(lm, [[1, 2]], 2)
    with pytest.raises(ValueError, match="vocab_size"):
        generate(lm, [torch.tensor([1, V])], 2)
    with pytest.raises(TypeError, match="eos_token_id"):
        generate(lm, ps, 2, eos_token_id=1.0)
    with pytest.raises(ValueError, match="positions"):
        lm(ids, positions=torch.full_like(ids, 48))
    with pytest.raises(ValueError, match="sink_tokens"):  # StreamingLLM's cache: refused
        lm(ids, cache=KVCache(window=4, sink_tokens=1), mask=mask)
    with pytest.raises(ValueError, match="mask"):
        lm(ids, mask=mask[:, 1:])  # must cover every token


# ---- the anchor: 🤗 transformers' generate with left padding ----


def tiny_llama() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(4)
    return LlamaForCausalLM(config).eval()


def test_transformers_generate_with_left_padding_equals_one_at_a_time():
    """The behaviour generate(list) reproduces: 🤗 transformers pads on the left,
    masks the padding, counts positions from each prompt's first real token
    (position_ids = attention_mask.cumsum(-1) - 1), and each row's greedy tokens
    are those of the prompt alone."""
    hf = tiny_llama()
    ps = prompts([3, 9, 6], seed=7)
    ids, mask = left_pad(ps)
    options = {"max_new_tokens": 10, "do_sample": False, "eos_token_id": None, "pad_token_id": 0}
    with torch.no_grad():
        batched = hf.generate(input_ids=ids, attention_mask=mask, **options)
        for row, p in enumerate(ps):
            single = hf.generate(input_ids=p[None], attention_mask=torch.ones(1, len(p)), **options)
            assert torch.equal(batched[row, ids.shape[1] :], single[0, len(p) :])
            assert torch.equal(batched[row, ids.shape[1] - len(p) :], single[0])


def test_generate_feeds_the_model_what_transformers_feeds_llama():
    """The same ragged batch through both paths, with the tiny Llama's shape (RoPE,
    4 heads, 2 KV heads, width 32): at every step our generate() hands CausalLM the
    token ids, padding mask and positions that transformers' generate hands
    LlamaForCausalLM (position_ids from the mask, as its generation utils make
    them), and each path's rows equal its own one-at-a-time tokens."""
    hf = tiny_llama()
    c = hf.config
    torch.manual_seed(4)
    ours = CausalLM(
        V,
        c.hidden_size,
        c.num_attention_heads,
        2,
        64,
        positional="rope",
        num_kv_heads=c.num_key_value_heads,
    ).eval()
    ps = prompts([3, 9, 6], seed=7)
    ids, mask = left_pad(ps)
    seen = {"hf": [], "ours": []}

    def spy(name: str, ids_key: str, mask_key: str, pos_key: str):
        def hook(module, args, kwargs):
            tokens = kwargs.get(ids_key, args[0] if args else None)
            seen[name].append((tokens, kwargs[mask_key], kwargs[pos_key]))

        return hook

    handles = [
        hf.register_forward_pre_hook(
            spy("hf", "input_ids", "attention_mask", "position_ids"), with_kwargs=True
        ),
        ours.register_forward_pre_hook(
            spy("ours", "tokens", "mask", "positions"), with_kwargs=True
        ),
    ]
    try:
        options = {"do_sample": False, "eos_token_id": None, "pad_token_id": 0}
        with torch.no_grad():
            theirs = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, **options)
        mine = generate(ours, ps, 6)
    finally:
        for h in handles:
            h.remove()
    assert len(seen["hf"]) == len(seen["ours"]) == 6
    for step, ((t_hf, m_hf, p_hf), (t, m, p)) in enumerate(zip(seen["hf"], seen["ours"])):
        assert t.shape == t_hf.shape and m.shape == m_hf.shape == (3, ids.shape[1] + step)
        assert torch.equal(m.long(), m_hf.long())  # the same padding mask
        assert torch.equal(p, p_hf[:, -p.shape[1] :])  # positions from each first token
        if step == 0:
            assert torch.equal(t, t_hf)  # the same left-padded prompt
    for row, p in enumerate(ps):
        assert torch.equal(mine[row], generate(ours, p[None], 6)[0])
        single = hf.generate(
            input_ids=p[None], attention_mask=torch.ones(1, len(p)), max_new_tokens=6, **options
        )
        assert torch.equal(theirs[row, ids.shape[1] - len(p) :], single[0])
