"""The mixer and cache protocols (attention_lib.protocols, issue 34): every mixer x
cache kind answers the same questions, and prefill + decode == the full pass."""

from __future__ import annotations

import pytest
import torch

from attention_lib import (
    ChunkKVCache,
    KVCache,
    LatentKVCache,
    LayerKVCache,
    MultiHeadAttention,
    MultiHeadLatentAttention,
    PagedKVCache,
)
from attention_lib.gated_deltanet import GatedDeltaNet, LayerStateCache
from attention_lib.protocols import LayerCache, Step, TokenMixer

D, H, L, PREFILL, B = 16, 2, 11, 4, 2


def _mla(**options):
    sizes = {"kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 6}
    return MultiHeadLatentAttention(D, H, **sizes, **options)


#: name -> (mixer factory, cache factory); the mixer's own make_cache unless given.
MIXERS = {
    "full": (lambda: MultiHeadAttention(D, H, rope_base=100.0), None),
    "full-gqa-qknorm-gate": (
        lambda: MultiHeadAttention(
            D, H * 2, num_kv_heads=2, rope_base=100.0, qk_norm=True, gate=True
        ),
        None,
    ),
    "sliding-rolling": (lambda: MultiHeadAttention(D, H, window=3, rope_base=100.0), None),
    "sliding-sink-logit": (lambda: MultiHeadAttention(D, H, window=3, sink=True), None),
    "chunked": (lambda: MultiHeadAttention(D, H, chunk_size=3), None),
    "mla": (lambda: _mla(), None),
    "mla-absorbed": (lambda: _mla(absorb=True, q_lora_rank=8), None),
    "dsa": (lambda: _mla(index_topk=3, index_heads=2, index_head_dim=8), None),
    "dsa-absorbed": (lambda: _mla(index_topk=3, index_head_dim=8, absorb=True), None),
    "gated-deltanet": (lambda: GatedDeltaNet(D, H), None),
    "paged": (lambda: MultiHeadAttention(D, H, rope_base=100.0), "paged"),
}


def _build(name: str):
    torch.manual_seed(0)
    make_mixer, kind = MIXERS[name]
    return make_mixer().double().eval(), kind


class _Paged:
    """A one-layer paged pool driven step by step, as the serving engine does."""

    def __init__(self, mixer: MultiHeadAttention) -> None:
        self.pool = PagedKVCache(16, 2, num_layers=1, num_kv_heads=mixer.num_kv_heads,
                                 head_dim=mixer.d_k, dtype=torch.float64)  # fmt: skip
        self.seqs = [self.pool.new_sequence() for _ in range(B)]

    def step(self, n: int) -> tuple[Step, LayerCache]:
        batch = self.pool.extend(self.seqs, n)
        return Step(batch.positions, keep=batch.mask[:, None, None]), batch.layer(0)


def _run(mixer, kind, x: torch.Tensor, splits: list[int]):
    """Feed ``x`` in pieces of ``splits`` tokens through one cache; the outputs and
    the cache."""
    paged = _Paged(mixer) if kind == "paged" else None
    cache = None if paged else mixer.make_cache()
    outs, start = [], 0
    for n in splits:
        if paged:
            step, cache = paged.step(n)
        else:
            step = Step(torch.arange(start, start + n))
        with torch.no_grad():
            outs.append(mixer(x[:, start : start + n], step=step, kv_cache=cache))
        start += n
    return torch.cat(outs, 1), cache


@pytest.mark.parametrize("name", MIXERS)
def test_every_mixer_and_cache_follow_the_protocols(name) -> None:
    mixer, kind = _build(name)
    assert isinstance(mixer, TokenMixer)
    x = torch.randn(B, L, D, dtype=torch.float64)
    full, _ = _run(mixer, kind, x, [L])
    if kind != "paged":  # the checked public call gives the same numbers
        with torch.no_grad():
            public = mixer(x, is_causal=True) if "mla" in name or "dsa" in name else None
            if public is None:
                public = mixer(x, x, x, is_causal=True)
        torch.testing.assert_close(public, full, atol=1e-12, rtol=0)
    streamed, cache = _run(mixer, kind, x, [PREFILL] + [1] * (L - PREFILL))
    torch.testing.assert_close(streamed, full, atol=1e-10, rtol=0)  # prefill + decode
    assert isinstance(cache, LayerCache)
    assert cache.position == L
    held = {"sliding-rolling": 3, "sliding-sink-logit": 3, "chunked": L % 3,
            "gated-deltanet": 0}.get(name, L)  # fmt: skip
    assert len(cache) == held
    assert cache.nbytes > 0
    per_token = cache.numbers_per_token
    if name == "gated-deltanet":
        assert per_token == 0  # a fixed-size state
    else:
        assert per_token > 0 and cache.nbytes >= B * held * per_token * 8


@pytest.mark.parametrize("name", [n for n in MIXERS if n != "paged"])
def test_select_keeps_and_reorders_batch_rows(name) -> None:
    mixer, kind = _build(name)
    x = torch.randn(B + 1, L, D, dtype=torch.float64)
    full, _ = _run(mixer, kind, x, [L])
    _, cache = _run(mixer, kind, x[:, : L - 1], [L - 1])
    rows = torch.tensor([2, 0])  # drop row 1, swap the others
    cache.select(rows)
    with torch.no_grad():
        last = mixer(x[rows, L - 1 :], step=Step(torch.arange(L - 1, L)), kv_cache=cache)
    torch.testing.assert_close(last, full[rows, L - 1 :], atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", [n for n in MIXERS if n != "paged"])
def test_crop_forgets_the_last_tokens_or_says_why_not(name) -> None:
    mixer, kind = _build(name)
    x = torch.randn(B, L, D, dtype=torch.float64)
    full, _ = _run(mixer, kind, x, [L])
    _, cache = _run(mixer, kind, x[:, :6], [6])
    draft = torch.randn(B, 2, D, dtype=torch.float64)  # two drafted tokens, rejected
    with torch.no_grad():
        mixer(draft, step=Step(torch.arange(6, 8)), kv_cache=cache)
    if name in ("sliding-rolling", "sliding-sink-logit", "gated-deltanet"):
        with pytest.raises(ValueError, match="crop"):
            cache.crop(2)  # a rolling cache has dropped tokens; a state mixed them in
        return
    cache.crop(2)
    assert cache.position == 6
    with torch.no_grad():
        rest = mixer(x[:, 6:], step=Step(torch.arange(6, L)), kv_cache=cache)
    torch.testing.assert_close(rest, full[:, 6:], atol=1e-10, rtol=0)
    with pytest.raises(ValueError, match="crop"):
        cache.crop(len(cache) + 1)


def test_a_paged_layer_refuses_select_and_crop_and_counts_its_bytes() -> None:
    mixer, _ = _build("paged")
    _, layer = _run(mixer, "paged", torch.randn(B, 3, D, dtype=torch.float64), [3])
    assert layer.nbytes == layer.batch.nbytes  # one layer: its share is all
    for call in (lambda: layer.select(torch.tensor([0])), lambda: layer.crop(1)):
        with pytest.raises(ValueError, match="PagedKVCache"):
            call()


def test_every_cache_class_follows_the_cache_protocol() -> None:
    for cache in (LayerKVCache(), LayerKVCache(4, 1), ChunkKVCache(4), LatentKVCache(),
                  LayerStateCache()):  # fmt: skip
        assert isinstance(cache, LayerCache)
        assert (cache.position, len(cache), cache.nbytes, cache.numbers_per_token) == (0,) * 4
    assert isinstance(KVCache().layer(0), LayerCache)


def test_a_step_builds_each_rope_table_once() -> None:
    step = Step(torch.arange(5))
    first = step.rope(8, 10000.0, torch.float32)
    assert step.rope(8, 10000.0, torch.float32) is first  # shared by every layer
    assert step.rope(4, 10000.0, torch.float32) is not first
    keep = torch.tensor([[False, True, True, True]])[:, None, None]
    assert Step(torch.arange(2), keep=keep).keep_for(3).shape[-1] == 3
