"""Tests for attention_lib.encoder: positional encodings, feed-forward block,
pre-LN encoder layer and stack, and the per-position classifier."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attention_lib import (
    Encoder,
    EncoderLayer,
    FeedForward,
    MultiHeadAttention,
    SinusoidalPositionalEncoding,
    TokenClassifier,
    padding_mask,
    sinusoidal_positional_encoding,
)


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# --- sinusoidal positional encoding ----------------------------------------------------


@pytest.mark.parametrize("max_len, d_model", [(5, 6), (7, 5), (1, 1), (3, 2)])
def test_positional_encoding_matches_the_formula_entry_by_entry(max_len: int, d_model: int) -> None:
    pe = sinusoidal_positional_encoding(max_len, d_model, dtype=torch.float64)
    assert pe.shape == (max_len, d_model) and pe.dtype == torch.float64
    for p in range(max_len):
        for j in range(d_model):
            angle = p / 10000 ** ((j - j % 2) / d_model)
            expected = math.sin(angle) if j % 2 == 0 else math.cos(angle)
            assert pe[p, j].item() == pytest.approx(expected, abs=1e-12), (p, j)


def test_positional_encoding_first_row_and_range() -> None:
    pe = sinusoidal_positional_encoding(100, 16)
    assert pe.dtype == torch.float32
    assert torch.equal(pe[0], torch.tensor([0.0, 1.0] * 8))
    assert pe.abs().max() <= 1.0
    # Every (sin, cos) pair lies on the unit circle: row norm sqrt(d_model / 2).
    torch.testing.assert_close(pe.norm(dim=-1), torch.full((100,), math.sqrt(8.0)))
    # Rows are distinct: each position has its own code.
    assert torch.cdist(pe, pe).add(torch.eye(100)).min() > 1e-3


def test_positional_encoding_dot_product_depends_only_on_distance() -> None:
    pe = sinusoidal_positional_encoding(40, 32, dtype=torch.float64)
    gram = pe @ pe.T  # (40, 40)
    for k in range(-5, 6):
        diag = torch.diagonal(gram, offset=k)
        torch.testing.assert_close(diag, diag[:1].expand_as(diag))


def test_positional_encoding_shift_is_a_rotation() -> None:
    d_model, k = 8, 3
    pe = sinusoidal_positional_encoding(20, d_model, dtype=torch.float64)
    omega = 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    rotation = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i, w in enumerate(omega):
        c, s = math.cos(k * w), math.sin(k * w)
        # (sin(a + b), cos(a + b)) = R(b) (sin a, cos a)
        rotation[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, s], [-s, c]])
    torch.testing.assert_close(pe[:-k] @ rotation.T, pe[k:])


def test_positional_encoding_bad_input() -> None:
    with pytest.raises(TypeError, match="max_len"):
        sinusoidal_positional_encoding(4.0, 8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="d_model"):
        sinusoidal_positional_encoding(4, 0)
    with pytest.raises(ValueError, match="base"):
        sinusoidal_positional_encoding(4, 8, base=1.0)
    with pytest.raises(TypeError, match="base"):
        sinusoidal_positional_encoding(4, 8, base="1e4")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dtype"):
        sinusoidal_positional_encoding(4, 8, dtype=torch.int64)
    with pytest.raises(TypeError, match="dtype"):
        sinusoidal_positional_encoding(4, 8, dtype="float32")  # type: ignore[arg-type]


def test_positional_encoding_module_adds_the_table_and_has_no_parameters() -> None:
    module = SinusoidalPositionalEncoding(8, max_len=10)
    assert n_params(module) == 0 and "pe" not in module.state_dict()
    x = torch.randn(2, 6, 8)
    torch.testing.assert_close(module(x), x + sinusoidal_positional_encoding(6, 8))
    assert module(x.double()).dtype == torch.float64
    positions = torch.tensor([3, 4, 5, 6, 7, 8])  # after 3 cached positions
    torch.testing.assert_close(module(x, positions), x + sinusoidal_positional_encoding(9, 8)[3:])


# --- feed-forward block ------------------------------------------------------------------


def test_feed_forward_is_position_wise_and_counts_its_parameters() -> None:
    torch.manual_seed(0)
    ffn = FeedForward(8, 32)
    assert n_params(ffn) == 2 * 8 * 32 + 32 + 8
    x = torch.randn(3, 5, 8)
    out = ffn(x)
    assert out.shape == (3, 5, 8)
    # Each position on its own gives the same result: the block never mixes positions.
    torch.testing.assert_close(out[1, 2], ffn(x[1, 2]))
    expected = ffn.linear2(torch.relu(ffn.linear1(x)))
    torch.testing.assert_close(out, expected)


def test_feed_forward_bad_input() -> None:
    with pytest.raises(ValueError, match="d_ff"):
        FeedForward(8, 0)
    with pytest.raises(ValueError, match="dropout"):
        FeedForward(8, 16, dropout=1.0)


# --- encoder layer and stack ----------------------------------------------------------------


def test_encoder_layer_is_pre_ln_with_residuals() -> None:
    torch.manual_seed(1)
    layer = EncoderLayer(16, 4, d_ff=24).eval()
    x = torch.randn(2, 5, 16)
    out, weights = layer(x, need_weights=True)
    assert out.shape == (2, 5, 16) and weights.shape == (2, 4, 5, 5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 5))
    h = layer.norm1(x)
    mid = x + layer.self_attn(h, h, h)
    expected = mid + layer.ffn(layer.norm2(mid))
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(layer(x), out)  # need_weights=False: the tensor alone


def test_encoder_stacks_layers_and_ends_with_layer_norm() -> None:
    torch.manual_seed(2)
    encoder = Encoder(16, 2, num_layers=3, d_ff=20).eval()
    x = torch.randn(2, 7, 16)
    out, weights = encoder(x, need_weights=True)
    assert out.shape == (2, 7, 16) and weights.shape == (2, 3, 2, 7, 7)
    h = x
    for i, layer in enumerate(encoder.layers):
        h, w = layer(h, need_weights=True)
        torch.testing.assert_close(weights[:, i], w)
    torch.testing.assert_close(out, encoder.norm(h))
    assert isinstance(encoder(x), torch.Tensor)


def test_encoder_layer_gradcheck() -> None:
    torch.manual_seed(3)
    layer = EncoderLayer(8, 2, d_ff=8).double().eval()
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    mask = padding_mask([3, 2])
    assert torch.autograd.gradcheck(lambda t: layer(t, mask), (x,), fast_mode=True)


def test_torch_backend_gives_the_same_encoder_output() -> None:
    torch.manual_seed(4)
    lib = Encoder(16, 4, num_layers=2).eval()
    fused = Encoder(16, 4, num_layers=2, backend="torch").eval()
    fused.load_state_dict(lib.state_dict())
    x = torch.randn(3, 6, 16)
    mask = padding_mask([6, 4, 1])
    torch.testing.assert_close(fused(x, mask), lib(x, mask), atol=1e-5, rtol=1e-5)


def test_dropout_acts_only_in_training_mode() -> None:
    torch.manual_seed(5)
    layer = EncoderLayer(16, 4, dropout=0.5)
    x = torch.randn(2, 5, 16)
    layer.eval()
    torch.testing.assert_close(layer(x), layer(x))
    layer.train()
    assert not torch.allclose(layer(x), layer(x))


# --- masking ------------------------------------------------------------------------------


def test_padding_mask_gives_padded_keys_zero_weight_in_every_layer_and_head() -> None:
    torch.manual_seed(6)
    encoder = Encoder(16, 4, num_layers=2).eval()
    lengths = [5, 3, 1]
    x = torch.randn(3, 5, 16)
    _, weights = encoder(x, padding_mask(lengths), need_weights=True)  # (B, layers, H, L, L)
    for b, n in enumerate(lengths):
        assert torch.all(weights[b, ..., n:] == 0), b
        torch.testing.assert_close(weights[b, ..., :n].sum(-1), torch.ones(2, 4, 5))


def test_real_positions_do_not_depend_on_padding_content() -> None:
    torch.manual_seed(7)
    encoder = Encoder(16, 4, num_layers=2).eval()
    lengths = [6, 4, 2]
    mask = padding_mask(lengths)
    x = torch.randn(3, 6, 16)
    garbage = x.clone()
    for b, n in enumerate(lengths):
        garbage[b, n:] = 100 * torch.randn(6 - n, 16)
    out, out_garbage = encoder(x, mask), encoder(garbage, mask)
    for b, n in enumerate(lengths):
        torch.testing.assert_close(out_garbage[b, :n], out[b, :n])
        # ... and equal to running the unpadded sequence alone, without any mask.
        torch.testing.assert_close(encoder(x[b : b + 1, :n])[0], out[b, :n], atol=1e-5, rtol=1e-5)
    # Without the mask the padding leaks into the real positions.
    assert not torch.allclose(encoder(garbage)[1, :4], out[1, :4], atol=1e-3)


def test_classifier_with_padding_mask_ignores_padding_tokens() -> None:
    torch.manual_seed(8)
    model = TokenClassifier(7, d_model=16, num_heads=2, max_len=8).eval()
    tokens = torch.randint(7, (2, 8))
    other = tokens.clone()
    other[0, 5:] = (other[0, 5:] + 1) % 7
    mask = padding_mask([5, 8])
    torch.testing.assert_close(model(other, mask)[0, :5], model(tokens, mask)[0, :5])
    torch.testing.assert_close(model(tokens[:1, :5])[0], model(tokens, mask)[0, :5])


# --- parameter counts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "d_model, num_heads, num_layers, d_ff",
    [(64, 4, 2, 128), (64, 1, 2, 128), (32, 8, 3, None), (12, 3, 1, 7)],
)
def test_encoder_parameter_count_formula(
    d_model: int, num_heads: int, num_layers: int, d_ff: int | None
) -> None:
    encoder = Encoder(d_model, num_heads, num_layers, d_ff)
    f = 4 * d_model if d_ff is None else d_ff
    d = d_model
    per_layer = 4 * d * d + 2 * d * f + f + 9 * d
    assert n_params(encoder) == num_layers * per_layer + 2 * d
    assert Encoder.num_parameters(d_model, num_layers, d_ff) == n_params(encoder)


def test_encoder_parameter_count_of_the_chapter_model() -> None:
    # d_model=64, 4 heads, 2 layers, d_ff=128: worked out by hand in chapter 7.
    attention = 4 * (64 * 64 + 64)  # 16,640
    ffn = 64 * 128 + 128 + 128 * 64 + 64  # 16,576
    norms = 2 * 2 * 64  # 256
    assert n_params(Encoder(64, 4, 2, 128)) == 2 * (attention + ffn + norms) + 2 * 64 == 67_072


@pytest.mark.parametrize("positional, extra", [("sinusoidal", 0), (None, 0), ("learned", 16 * 32)])
def test_classifier_parameter_count(positional: str | None, extra: int) -> None:
    model = TokenClassifier(
        10, 7, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_len=16, positional=positional
    )
    expected = 10 * 32 + Encoder.num_parameters(32, 2, 64) + (32 * 7 + 7) + extra
    assert n_params(model) == expected


# --- the classifier -------------------------------------------------------------------------


def test_classifier_shapes_and_weights() -> None:
    torch.manual_seed(9)
    model = TokenClassifier(11, 5, d_model=16, num_heads=4, num_layers=3, max_len=12).eval()
    tokens = torch.randint(11, (4, 9))
    logits, weights = model(tokens, need_weights=True)
    assert logits.shape == (4, 9, 5) and weights.shape == (4, 3, 4, 9, 9)
    torch.testing.assert_close(weights.sum(-1), torch.ones(4, 3, 4, 9))
    torch.testing.assert_close(model(tokens), logits)
    assert isinstance(model.encoder.layers[0].self_attn, MultiHeadAttention)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", None])
def test_only_the_model_without_positions_is_permutation_equivariant(
    positional: str | None,
) -> None:
    torch.manual_seed(10)
    model = TokenClassifier(9, d_model=16, num_heads=2, max_len=10, positional=positional).eval()
    tokens = torch.randint(9, (3, 10))
    perm = torch.randperm(10)
    permuted_then_model = model(tokens[:, perm])
    model_then_permuted = model(tokens)[:, perm]
    equivariant = torch.allclose(permuted_then_model, model_then_permuted, atol=1e-5)
    assert equivariant == (positional is None)


def test_classifier_bad_input() -> None:
    model = TokenClassifier(5, d_model=8, num_heads=2, max_len=6)
    with pytest.raises(TypeError, match="tokens"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="tokens"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len"):
        model(torch.zeros(1, 7, dtype=torch.long))
    with pytest.raises(ValueError, match="vocab_size"):
        model(torch.tensor([[0, 5]]))
    with pytest.raises(ValueError, match="positional"):
        TokenClassifier(5, positional="rotary")
    with pytest.raises(ValueError, match="num_heads must divide d_model"):
        TokenClassifier(5, d_model=10, num_heads=4)
    with pytest.raises(TypeError, match="vocab_size"):
        TokenClassifier(5.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="d_model"):
        TokenClassifier(5, d_model=16.0, positional=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_layers"):
        Encoder(8, 2, 0)
    with pytest.raises(ValueError, match="mask"):
        model(torch.zeros(1, 4, dtype=torch.long), torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="need_weights"):
        model(torch.zeros(1, 4, dtype=torch.long), need_weights=1)


# --- public entry points validate, building blocks pass down --------------------------


@pytest.mark.parametrize("module", ["layer", "encoder"])
def test_layer_stacks_are_checked_by_their_attention(module: str) -> None:
    # EncoderLayer and Encoder are building blocks that check nothing themselves (a
    # wrong x fails in their first LayerNorm); the MultiHeadAttention inside
    # validates the mask, the flags and the cache it is given, with clear errors.
    door = EncoderLayer(8, 2) if module == "layer" else Encoder(8, 2, 2)
    x = torch.randn(2, 4, 8)
    with pytest.raises(ValueError, match="mask"):
        door(x, padding_mask([5, 3]))
    with pytest.raises(ValueError, match="mask"):
        door(x, torch.ones(2, 4, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="need_weights"):
        door(x, need_weights="yes")
    if module == "encoder":
        with pytest.raises(TypeError, match="cache"):
            door(x, cache=[])


def test_no_global_or_thread_local_validation_switch() -> None:
    import pathlib

    import attention_lib

    package = pathlib.Path(attention_lib.__file__).parent
    for path in package.rglob("*.py"):
        text = path.read_text()
        for switch in ("ContextVar", "threading.local", "trusted_inputs", "inputs_trusted"):
            assert switch not in text, (path.name, switch)


def test_forward_hooks_of_the_submodules_run() -> None:
    # Chapter 7 ablates blocks with forward hooks.
    torch.manual_seed(0)
    model = TokenClassifier(7, d_model=8, num_heads=2, num_layers=2).eval()
    tokens = torch.randint(7, (3, 5))
    calls = []

    def zero(module, inputs, output):
        calls.append(type(module).__name__)
        return torch.zeros_like(output)

    before = model(tokens)
    layer = model.encoder.layers[1]
    hooks = [layer.self_attn.register_forward_hook(zero), layer.ffn.register_forward_hook(zero)]
    try:
        ablated = model(tokens)
    finally:
        for hook in hooks:
            hook.remove()
    assert calls == ["MultiHeadAttention", "FeedForward"]
    assert not torch.allclose(ablated, before)
    assert torch.equal(model(tokens), before)


def test_a_hook_can_call_a_module_as_a_user_would() -> None:
    # Before: inside a model's forward a process-wide "trusted" flag was set, so a 0/1
    # float mask that works in a direct call raised an opaque TypeError in a hook.
    torch.manual_seed(0)
    model = TokenClassifier(7, d_model=8, num_heads=2, num_layers=2).eval()
    probe = MultiHeadAttention(8, 2).eval()
    x = torch.randn(1, 3, 8)
    keep = torch.tensor([[1.0, 0.0, 1.0]] * 3)  # a 0/1 float keep-mask
    direct = probe(x, x, x, keep)
    seen = []
    hook = model.encoder.layers[0].ffn.register_forward_hook(
        lambda module, inputs, output: seen.append(probe(x, x, x, keep))
    )
    with torch.no_grad():
        model(torch.randint(7, (1, 4)))
    hook.remove()
    assert torch.equal(seen[0], direct)
