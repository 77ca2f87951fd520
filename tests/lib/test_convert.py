"""attention_lib.convert: a foreign attention layer is either reproduced or refused.

Oracle: the layer itself (🤗 transformers, tiny random configs, float32, nothing
downloaded), called exactly as its model calls it: ``position_embeddings`` from
the model's rotary embedding class, ``attention_mask`` from
``transformers.masking_utils`` (the model's choice of causal or sliding-window
mask). A converted module must give the layer's output with ``is_causal=True``;
a layer with a feature MultiHeadAttention does not compute must be refused with
a ``ValueError`` naming it, and each refusal is shown to be needed: the module
the converter would build without it gives another output.
"""

from __future__ import annotations

import importlib
import os
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download

import pytest
import torch
from torch import nn
from transformers import DynamicCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.models.llama.modeling_llama import LlamaAttention

from attention_lib import LayerKVCache, MultiHeadAttention

D_MODEL, HEADS, KV_HEADS, D_K = 64, 8, 2, 8
TINY = {  # a tiny config that every family accepts
    "hidden_size": D_MODEL,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": D_K,
    "num_hidden_layers": 4,
    "intermediate_size": 32,
    "vocab_size": 16,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
PREFIX = {
    "llama": "Llama",
    "mistral": "Mistral",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "olmo": "Olmo",
    "olmo2": "Olmo2",
    "granite": "Granite",
    "gemma2": "Gemma2",
    "cohere": "Cohere",
    "helium": "Helium",
    "smollm3": "SmolLM3",
    "gpt_oss": "GptOss",
}
DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 150000.0}
DYNAMIC_ROPE = {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}
# chapter 16's scalings, with lengths at which they change the 11 positions of X
LINEAR_ROPE = {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}
LLAMA3_ROPE = {  # base 100: pair 0 kept, pair 1 on the ramp, pairs 2 and 3 / factor
    "rope_type": "llama3",
    "rope_theta": 100.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
YARN_ROPE = {
    "rope_type": "yarn",
    "rope_theta": 1e4,
    "factor": 4.0,
    "original_max_position_embeddings": 8,
}
NO_SOFTCAP = {"attn_logit_softcapping": None}


class HF:
    """A transformers attention layer with random weights, and its model's rotary
    embedding and mask."""

    def __init__(self, family: str, layer_idx: int = 0, impl: str = "eager", **options):
        modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        prefix = PREFIX[family]
        self.config = getattr(modeling, f"{prefix}Config")(**{**TINY, **options})
        self.config._attn_implementation = impl
        torch.manual_seed(0)
        self.layer = getattr(modeling, f"{prefix}Attention")(self.config, layer_idx=layer_idx)
        self.layer.eval()
        with torch.no_grad():
            for name, p in self.layer.named_parameters():  # biases and norms too
                p.normal_(1.0 if "norm" in name else 0.0, 0.2)
        self.rotary = getattr(modeling, f"{prefix}RotaryEmbedding")(self.config)
        types = getattr(self.config, "layer_types", None)
        if types:  # Qwen2, Gemma 2: a mask per layer type
            self.sliding = types[layer_idx] == "sliding_attention"
        else:  # Mistral: one window for every layer
            self.sliding = getattr(self.config, "sliding_window", None) is not None

    def __call__(self, x: torch.Tensor, cache: DynamicCache | None = None) -> torch.Tensor:
        past = 0 if cache is None else cache.get_seq_length()
        positions = torch.arange(past, past + x.shape[1])[None]  # (1, L)
        make_mask = create_sliding_window_causal_mask if self.sliding else create_causal_mask
        mask = make_mask(
            config=self.config,
            inputs_embeds=x,
            attention_mask=None,
            cache=cache,
            position_ids=positions,
        )
        with torch.no_grad():
            out, _ = self.layer(
                x,
                position_embeddings=self.rotary(x, positions),
                attention_mask=mask,
                cache=cache,
            )
        return out

    def take_projections(self, other: HF) -> HF:
        """Copy another layer's q/k/v/o projections into this one."""
        self.layer.load_state_dict(other.layer.state_dict(), strict=False)
        return self


def ours(module: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return module(x, x, x, is_causal=True)


X = torch.randn(2, 11, D_MODEL, generator=torch.Generator().manual_seed(1))

REPRODUCED = {  # id: (family, layer_idx, config options, what the module must hold)
    "llama": ("llama", 0, {}, {"rope_base": 10000.0}),
    "llama-bias": ("llama", 0, {"attention_bias": True}, {"rope_base": 10000.0}),
    "mistral-window": ("mistral", 0, {"sliding_window": 4}, {"window": 4}),
    "mistral-no-window": ("mistral", 0, {"sliding_window": None}, {"window": None}),
    "olmo": ("olmo", 0, {}, {"rope_base": 10000.0}),
    "granite-multiplier": ("granite", 0, {"attention_multiplier": 0.5}, {"scale": 0.5}),
    "gemma2-sliding-layer": (
        "gemma2",
        0,
        {**NO_SOFTCAP, "query_pre_attn_scalar": 16, "sliding_window": 4},
        {"scale": 0.25, "window": 4},
    ),
    "gemma2-full-layer": (
        "gemma2",
        1,
        {**NO_SOFTCAP, "query_pre_attn_scalar": 16, "sliding_window": 4},
        {"scale": 0.25, "window": None},
    ),
    "cohere-interleaved": ("cohere", 0, {}, {"rope_base": 500000.0}),
    # chapter 16's RoPE scalings: linear, Llama 3.1's and YaRN (Qwen, DeepSeek)
    "llama-linear-rope": (
        "llama",
        0,
        {"rope_parameters": LINEAR_ROPE},
        {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    ),
    "llama3-rope": (
        "llama",
        0,
        {"rope_parameters": LLAMA3_ROPE},
        {
            "rope_base": 100.0,
            "rope_scaling": {k: v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"},
        },
    ),
    "llama-yarn-rope": (
        "llama",
        0,
        {"rope_parameters": YARN_ROPE},
        {"rope_scaling": {k: v for k, v in YARN_ROPE.items() if k != "rope_theta"}},
    ),
    "qwen3-yarn-rope": (
        "qwen3",
        0,
        {"rope_parameters": {**YARN_ROPE, "beta_fast": 8.0, "beta_slow": 2.0}},
        {"window": None},
    ),
    "helium-interleaved": ("helium", 0, {}, {"rope_base": 100000.0}),
    "smollm3-nope-layer": ("smollm3", 3, {}, {"rope_base": None}),
    # chapter 15's features: QK-norm, soft-capping, sinks
    "qwen3-qk-norm": ("qwen3", 0, {}, {"softcap": None}),
    "gemma2-softcap": (
        "gemma2",
        1,
        {"attn_logit_softcapping": 2.0, "query_pre_attn_scalar": 16},
        {"softcap": 2.0, "scale": 0.25},
    ),
    "gemma2-softcap-sliding": (
        "gemma2",
        0,
        {"attn_logit_softcapping": 2.0, "sliding_window": 4},
        {"softcap": 2.0, "window": 4},
    ),
    "gpt-oss-sinks-sliding": (
        "gpt_oss",
        0,
        {"rope_parameters": DEFAULT_ROPE, "sliding_window": 4},
        {"window": 4},
    ),
    "llama-head-dim": ("llama", 0, {"head_dim": 16}, {"d_k": 16}),  # != hidden / heads
    "gpt-oss-sinks-full": (
        "gpt_oss",
        1,
        {"rope_parameters": DEFAULT_ROPE, "sliding_window": 4},
        {"window": None},
    ),
}


def _eager_only(case: str) -> bool:
    """transformers' sdpa refuses soft-capping, and gpt-oss does not support sdpa."""
    family, _, options, _ = REPRODUCED[case]
    return bool(options.get("attn_logit_softcapping")) or family == "gpt_oss"


@pytest.mark.parametrize(
    "case,impl",
    [(c, i) for c in REPRODUCED for i in ("eager", "sdpa") if i == "eager" or not _eager_only(c)],
)
def test_reproduced_layers_equal_the_layer(case, impl):
    family, layer_idx, options, expected = REPRODUCED[case]
    hf = HF(family, layer_idx, impl, **options)
    module = MultiHeadAttention.from_hf_llama(hf.layer)
    assert {name: getattr(module, name) for name in expected} == expected
    assert not module.training and module.num_kv_heads == KV_HEADS
    torch.testing.assert_close(ours(module, X), hf(X), atol=1e-5, rtol=0)


REFUSED = {  # id: (family, config options, a keyword of the message)
    "qwen2-qkv-bias": ("qwen2", {}, "bias"),
    "olmo-clip-qkv": ("olmo", {"clip_qkv": 0.5}, "clip_qkv"),
    "olmo2-qk-norm": ("olmo2", {}, "q_norm"),
    "gemma2-bidirectional": (
        "gemma2",
        {**NO_SOFTCAP, "use_bidirectional_attention": True},
        "bidirectional",
    ),
    "cohere-qk-norm": ("cohere", {"use_qk_norm": True}, "q_norm"),
    "llama-dynamic-rope": (
        "llama",
        {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}},
        "dynamic",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_refused_layers_name_the_feature(case):
    family, options, keyword = REFUSED[case]
    with pytest.raises(ValueError, match=keyword):
        MultiHeadAttention.from_hf_llama(HF(family, **options).layer)


# The refusals are needed: the layer with the feature against the module the
# converter builds from the same projections without it (reproduced exactly).
# (QK-norm per head, soft-capping and sinks are reproduced; the cases below show
# that they matter, and that OLMo 2's and Cohere's QK-norm, refused, do too.)
NEEDED = {  # id: (the layer with the feature, the same computation without it)
    "qk-norm": (("qwen3", {}), ("llama", {})),
    "qk-norm-olmo2": (("olmo2", {}), ("llama", {})),
    "qk-norm-cohere": (("cohere", {"use_qk_norm": True}), ("cohere", {})),
    "clip_qkv": (("olmo", {"clip_qkv": 0.5}), ("olmo", {})),
    "soft-capping": (
        ("gemma2", {"attn_logit_softcapping": 2.0, "query_pre_attn_scalar": D_K}),
        ("gemma2", {**NO_SOFTCAP, "query_pre_attn_scalar": D_K}),
    ),
    "rope_type": (  # dynamic: a larger base once the call is longer than 4 positions
        ("llama", {"rope_parameters": DYNAMIC_ROPE, "max_position_embeddings": 4}),
        ("llama", {}),
    ),
}


@pytest.mark.parametrize("case", NEEDED)
def test_each_refusal_is_needed(case):
    (family, options), (plain_family, plain_options) = NEEDED[case]
    featured = HF(family, **options)
    plain = HF(plain_family, **plain_options).take_projections(featured)
    module = MultiHeadAttention.from_hf_llama(plain.layer)
    torch.testing.assert_close(ours(module, X), plain(X), atol=1e-5, rtol=0)
    assert (ours(module, X) - featured(X)).abs().max() > 1e-2


def test_bidirectional_refusal_is_needed():
    """Gemma 2 with ``use_bidirectional_attention``, under sdpa: the model passes no
    mask and the layer attends to every key."""
    featured = HF("gemma2", impl="sdpa", **NO_SOFTCAP, use_bidirectional_attention=True)
    featured.layer.is_causal = True  # the converter reads the layer as causal...
    module = MultiHeadAttention.from_hf_llama(featured.layer)
    featured.layer.is_causal = False
    assert (ours(module, X) - featured(X)).abs().max() > 1e-2  # ...but it is not


class DoubledAngles(LlamaAttention):
    """A layer whose rotation is not RoPE's (it turns by twice the angles)."""

    def forward(self, hidden_states, position_embeddings, attention_mask, **kwargs):
        cos, sin = position_embeddings
        doubled = (cos * cos - sin * sin, 2 * sin * cos)
        return super().forward(hidden_states, doubled, attention_mask, **kwargs)


def test_a_rotation_other_than_rope_is_refused_and_the_refusal_is_needed():
    plain = HF("llama")
    doubled = HF("llama")
    doubled.layer.__class__ = DoubledAngles
    with pytest.raises(ValueError, match="rotation"):
        MultiHeadAttention.from_hf_llama(doubled.layer)
    module = MultiHeadAttention.from_hf_llama(plain.layer)
    assert (ours(module, X) - doubled(X)).abs().max() > 1e-2


@pytest.mark.parametrize("chunks", [(7, 1, 1, 1, 1), (5, 3, 3)])
def test_a_kv_cache_with_is_causal_matches_the_layer_with_its_cache(chunks):
    """Prefill, then decode one token or a chunk at a time: the new queries are
    aligned after the cached keys, and the sliding window slides."""
    hf = HF("mistral", sliding_window=4)
    module = MultiHeadAttention.from_hf_llama(hf.layer)
    theirs, mine = DynamicCache(config=hf.config), LayerKVCache()
    start = 0
    for size in chunks:
        x = X[:, start : start + size]
        with torch.no_grad():
            got = module(x, x, x, is_causal=True, kv_cache=mine)
        torch.testing.assert_close(got, hf(x, cache=theirs), atol=1e-5, rtol=0)
        start += size


def test_rope_layout_probe_reads_the_layers_function():
    """Cohere's rows are permuted into rotate-half order: the value and output
    projections are copied as they are."""
    hf = HF("cohere")
    module = MultiHeadAttention.from_hf_llama(hf.layer)
    assert torch.equal(module.W_v.weight, hf.layer.v_proj.weight)
    assert not torch.equal(module.W_q.weight, hf.layer.q_proj.weight)
    assert torch.equal(module.W_q.weight.sort(0).values, hf.layer.q_proj.weight.sort(0).values)


def test_not_an_attention_layer_is_a_type_error():
    with pytest.raises(TypeError, match="LlamaAttention"):
        MultiHeadAttention.from_hf_llama(nn.Linear(2, 2))
    layer = HF("llama").layer
    layer.config = SimpleNamespace(hidden_size=D_MODEL)  # no heads, no RoPE parameters
    with pytest.raises(TypeError, match="config"):
        MultiHeadAttention.from_hf_llama(layer)


def test_a_padding_mask_with_is_causal_matches_the_layer():
    hf = HF("mistral", sliding_window=4)
    lengths = torch.tensor([11, 6])
    keep = torch.arange(11)[None] < lengths[:, None]  # (B, L)
    mask = create_sliding_window_causal_mask(
        config=hf.config,
        inputs_embeds=X,
        attention_mask=keep.long(),
        cache=None,
        position_ids=torch.arange(11)[None],
    )
    with torch.no_grad():
        theirs, _ = hf.layer(
            X, position_embeddings=hf.rotary(X, torch.arange(11)[None]), attention_mask=mask
        )
        mine = MultiHeadAttention.from_hf_llama(hf.layer)(
            X, X, X, keep[:, None, None, :], is_causal=True
        )
    valid = keep[..., None].expand_as(mine)  # padded queries: anything
    torch.testing.assert_close(mine[valid], theirs[valid], atol=1e-5, rtol=0)


# --- from_torch --------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [True, False])
def test_from_torch_equals_nn_multihead_attention(bias):
    torch.manual_seed(2)
    torch_mha = nn.MultiheadAttention(D_MODEL, HEADS, bias=bias, batch_first=True).eval()
    module = MultiHeadAttention.from_torch(torch_mha, backend="torch")
    assert module.backend == "torch" and not module.training
    blocked = torch.ones(11, 11, dtype=torch.bool).triu(1)  # torch: True = blocked
    with torch.no_grad():
        theirs, _ = torch_mha(X, X, X, attn_mask=blocked)
        torch.testing.assert_close(module(X, X, X, ~blocked), theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "options, keyword",
    [
        ({"batch_first": False}, "batch_first=True"),
        ({"kdim": 8, "vdim": 8}, "kdim == vdim"),
        ({"add_bias_kv": True}, "add_bias_kv=False"),
        ({"add_zero_attn": True}, "add_zero_attn=False"),
    ],
)
def test_from_torch_refuses_what_it_cannot_reproduce(options, keyword):
    with pytest.raises(ValueError, match=keyword):
        MultiHeadAttention.from_torch(
            nn.MultiheadAttention(16, 4, **{"batch_first": True, **options})
        )
    with pytest.raises(TypeError, match="nn.MultiheadAttention"):
        MultiHeadAttention.from_torch(nn.Linear(4, 4))


def test_from_hf_is_the_general_name() -> None:
    hf = HF("qwen3")
    module = MultiHeadAttention.from_hf(hf.layer)
    assert module.q_norm is not None
    torch.testing.assert_close(ours(module, X), hf(X), atol=1e-5, rtol=0)
