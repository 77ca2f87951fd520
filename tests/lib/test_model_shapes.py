"""Tiny models shaped like today's LLMs, built from per-layer specs (issue 34): each
decodes (prefill + one token at a time) exactly as its full pass, on every backend
that computes its layers; and the model validates once per call, not per layer."""

from __future__ import annotations

import pytest
import torch

from attention_lib import CausalLM, KVCache, LatentKVCache, generate
from attention_lib.backends import available_backends
from attention_lib.gated_deltanet import LayerStateCache
from attention_lib.layer_types import LAYER_TYPES, LayerSpec, LayerType
from attention_lib.serving import Engine, Request

V, D, HEADS = 23, 32, 4

#: name -> (layer specs, model options): the layer patterns of the published configs.
SHAPES = {
    # DeepSeek-V3.2: MLA with the lightning indexer (DSA) in every layer
    "deepseek-v3.2": (
        [
            LayerSpec("dsa", index_topk=3, q_lora_rank=16),
            LayerSpec("dsa", index_topk=3, q_lora_rank=16, absorb=True),
        ],
        {"positional": "rope"},
    ),
    # Qwen3-Next: 3 Gated DeltaNet layers : 1 gated full-attention layer with QK-norm
    "qwen3-next": (
        ["linear"] * 3 + [LayerSpec("full", qk_norm=True, gate=True)],
        {"positional": "rope", "num_kv_heads": 2},
    ),
    # Gemma 3: 5 sliding-window layers : 1 full layer, QK-norm everywhere
    "gemma3": (
        [LayerSpec("sliding", window=4)] * 5 + ["full"],
        {"positional": "rope", "qk_norm": True, "num_kv_heads": 1},
    ),
    # gpt-oss: attention sinks, sliding and full layers alternating
    "gpt-oss": (
        [LayerSpec("sliding", window=3), "full"] * 2,
        {"positional": "rope", "sink": True, "num_kv_heads": 2},
    ),
    # Llama 4: 3 chunked layers : 1 full layer without RoPE (NoPE)
    "llama4": (
        [LayerSpec("chunked", chunk_size=4)] * 3 + [LayerSpec("full", rope_base=None)],
        {"positional": "rope"},
    ),
}


def _model(name: str, backend: str = "lib") -> CausalLM:
    specs, options = SHAPES[name]
    torch.manual_seed(0)
    model = CausalLM(V, D, HEADS, len(specs), max_len=32, layer_types=specs, backend=backend,
                     **options)  # fmt: skip
    return model.double().eval()


def _backends(name: str) -> list[str]:
    return ["lib"] if name == "gpt-oss" else available_backends()  # sinks: lib only


@pytest.mark.parametrize(
    "name, backend", [(n, b) for n in SHAPES for b in _backends(n)]
)  # fmt: skip
def test_prefill_and_decode_equal_the_full_pass(name, backend) -> None:
    model = _model(name, backend)
    tokens = torch.randint(V, (2, 13), generator=torch.Generator().manual_seed(1))
    cache = KVCache()
    with torch.no_grad():
        full = model(tokens)
        steps = [model(tokens[:, :5], cache=cache)]
        steps += [model(tokens[:, i : i + 1], cache=cache) for i in range(5, 13)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-10, rtol=0)
    assert cache.position == 13
    assert [type(layer) for layer in cache.layers] == [
        type(layer.make_cache()) for layer in model.blocks.layers
    ]
    assert all(layer.nbytes > 0 for layer in cache.layers)


def test_the_layers_are_built_from_their_specs() -> None:
    qwen, llama, gemma = _model("qwen3-next"), _model("llama4"), _model("gemma3")
    assert qwen.layer_types == ("linear",) * 3 + ("full",)
    last = qwen.blocks.layers[3].self_attn
    assert last.W_g is not None and last.q_norm is not None and last.num_kv_heads == 2
    assert [layer.self_attn.rope_base for layer in llama.blocks.layers] == [10000.0] * 3 + [None]
    assert [layer.self_attn.window for layer in gemma.blocks.layers] == [4] * 5 + [None]
    assert qwen.layer_specs[3] == LayerSpec("full", gate=True, qk_norm=True)  # a value
    with pytest.raises(AttributeError):
        qwen.layer_specs[3].kind = "sliding"  # frozen


def test_a_deepseek_v32_shaped_model_generates_through_its_latent_cache() -> None:
    model = _model("deepseek-v3.2")
    prompt = torch.randint(V, (2, 4), generator=torch.Generator().manual_seed(2))
    cached = generate(model, prompt, 8)
    assert torch.equal(cached, generate(model, prompt, 8, use_cache=False))
    cache = KVCache()
    with torch.no_grad():
        model(prompt, cache=cache)
    assert all(isinstance(layer, LatentKVCache) for layer in cache.layers)
    assert cache.layers[0].numbers_per_token == 16 + 4 + 8  # latent, RoPE key, index key
    ragged = generate(model, [prompt[0], prompt[1, 1:]], 3)  # a padding mask on MLA
    assert torch.equal(ragged[0], cached[0, :7])


def test_mla_and_dsa_layer_options_are_checked() -> None:
    with pytest.raises(ValueError, match="index_topk"):
        CausalLM(V, D, HEADS, 1, layer_types=["dsa"])
    with pytest.raises(ValueError, match="index_topk"):
        CausalLM(V, D, HEADS, 1, layer_types=[LayerSpec("mla", index_topk=2)])
    with pytest.raises(ValueError, match="qk_norm"):
        CausalLM(V, D, HEADS, 1, layer_types=["mla"], qk_norm=True)
    with pytest.raises(TypeError, match="layer_types"):
        CausalLM(V, D, HEADS, 1, layer_types=[3])


def test_a_model_may_bring_its_own_layer_table() -> None:
    from attention_lib import MultiHeadAttention

    def nope(d_model, num_heads, *, dropout, window=None, chunk_size=None, **options):
        return MultiHeadAttention(d_model, num_heads, dropout, **{**options, "rope_base": None})

    table = {**LAYER_TYPES, "nope": LayerType(nope, lambda mixer: mixer.make_cache())}
    torch.manual_seed(0)
    mine = CausalLM(V, D, HEADS, 2, layer_types=["full", "nope"], layer_table=table,
                    positional="rope")  # fmt: skip
    torch.manual_seed(0)
    spec = CausalLM(V, D, HEADS, 2, layer_types=["full", LayerSpec("full", rope_base=None)],
                    positional="rope")  # fmt: skip
    tokens = torch.randint(V, (1, 6))
    with torch.no_grad():
        torch.testing.assert_close(mine(tokens), spec(tokens))
    assert "nope" not in LAYER_TYPES  # nothing global changed
    with pytest.raises(ValueError, match="layer type"):
        CausalLM(V, D, HEADS, 1, layer_types=["nope"])


# --- validation once per call -------------------------------------------------------


def _decode_calls(validation_calls, num_layers: int, **options) -> int:
    torch.manual_seed(0)
    model = CausalLM(V, D, HEADS, num_layers, max_len=32, **options).eval()
    cache = KVCache()
    with torch.no_grad():
        model(torch.randint(V, (2, 5)), cache=cache)
        token = torch.randint(V, (2, 1))
        return validation_calls(lambda: model(token, cache=cache))


@pytest.mark.parametrize(
    "options",
    [{}, {"positional": "rope", "num_kv_heads": 2},
     {"layer_types": ["mla", "sliding", LayerSpec("dsa", index_topk=2), "full"], "window": 4,
      "positional": "rope"},
     {"layer_types": ["linear", "linear", "linear", "full"], "positional": "rope"},
     {"layer_types": ["linear", "chunked", "mla", "sliding"], "window": 4, "chunk_size": 4}],
)  # fmt: skip
def test_one_decoded_token_makes_a_few_validation_calls_whatever_the_depth(
    options, validation_calls
) -> None:
    four = _decode_calls(validation_calls, 4, **options)
    deep_options = dict(options)
    if "layer_types" in options:
        deep_options["layer_types"] = options["layer_types"] * 4
    sixteen = _decode_calls(validation_calls, 16, **deep_options)
    assert four <= 16 and sixteen <= four + 2, (four, sixteen)


def test_generate_and_the_engine_validate_once_per_token(validation_calls) -> None:
    calls = {}
    for layers in (4, 16):
        torch.manual_seed(0)
        model = CausalLM(V, D, HEADS, layers, max_len=32, positional="rope").eval()
        prompt = torch.randint(V, (2, 5))
        one = validation_calls(lambda m=model, p=prompt: generate(m, p, 1))
        three = validation_calls(lambda m=model, p=prompt: generate(m, p, 3))
        engine = Engine(model, num_blocks=16, block_size=4, max_batch_size=2)
        for i in range(2):
            engine.submit(Request(prompt[i], max_new_tokens=6))
        engine.step()  # admits (prefills) both
        calls[layers] = ((three - one) / 2, validation_calls(engine.step))
    assert all(per_token <= 16 and step <= 16 for per_token, step in calls.values()), calls
    assert calls[16][0] <= calls[4][0] + 2 and calls[16][1] <= calls[4][1] + 2, calls


def test_public_modules_called_directly_still_validate(validation_calls) -> None:
    model = CausalLM(V, D, HEADS, 1, max_len=32, positional="rope")
    attention = model.blocks.layers[0].self_attn
    x = torch.randn(1, 3, D)
    assert validation_calls(lambda: attention(x, x, x, is_causal=True)) > 3
    with pytest.raises(ValueError, match="query"):
        attention(x[0], x, x)
    with pytest.raises(TypeError, match="kv_cache"):
        attention(x, x, x, kv_cache=LayerStateCache())
