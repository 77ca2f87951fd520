"""Tests for attention_lib.vision (chapter 19), against 🤗 transformers' Qwen2-VL,
Qwen3-VL, Gemma 3 and BART modules on tiny random configs (nothing downloaded)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download: tiny configs only

import pytest
import torch
from transformers import BartConfig, Gemma3TextConfig, Qwen2VLConfig, Qwen3VLConfig
from transformers.models.bart.modeling_bart import BartDecoderLayer
from transformers.models.gemma3.modeling_gemma3 import (
    create_masks_for_vision_model,
    get_block_sequence_ids_for_mask,
)
from transformers.models.qwen2_vl.modeling_qwen2_vl import (
    Qwen2VLModel,
    Qwen2VLRotaryEmbedding,
    Qwen2VLVisionRotaryEmbedding,
)
from transformers.models.qwen3_vl.modeling_qwen3_vl import (
    Qwen3VLModel,
    Qwen3VLTextRotaryEmbedding,
)

from attention_lib import (
    MultiHeadAttention,
    PatchEmbedding,
    VisionTransformer,
    mrope,
    mrope_positions,
    patch_positions,
    patchify,
    rope_2d,
    tokens_per_image,
    vision_mask,
)
from attention_lib.rope import apply_rope, rope_cos_sin

TEXT_CONFIG = {
    "hidden_size": 32,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "num_hidden_layers": 1,
    "intermediate_size": 32,
    "vocab_size": 64,
}


def qwen2_vl(sections=(2, 3, 3)):
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(sections)}
    vision = {
        "depth": 1,
        "embed_dim": 32,
        "num_heads": 2,
        "hidden_size": 32,
        "mlp_ratio": 1,
        "spatial_merge_size": 2,
        "patch_size": 2,
        "temporal_patch_size": 1,
    }
    return Qwen2VLConfig(text_config={**TEXT_CONFIG, "rope_parameters": rope}, vision_config=vision)


def qwen3_vl(sections=(6, 5, 5)):
    rope = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "mrope_section": list(sections),
        "mrope_interleaved": True,
    }
    vision = {
        "depth": 1,
        "hidden_size": 32,
        "num_heads": 2,
        "intermediate_size": 32,
        "out_hidden_size": 64,
        "spatial_merge_size": 2,
        "patch_size": 2,
        "temporal_patch_size": 1,
        "num_position_embeddings": 16,
        "deepstack_visual_indexes": [],
    }
    text = {**TEXT_CONFIG, "hidden_size": 64, "head_dim": 32, "rope_parameters": rope}
    return Qwen3VLConfig(text_config=text, vision_config=vision)


# text, an image of 2 x 3 merged tokens, text; then text, two images of 2 x 2
TYPES = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0], [0, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1]])
GRIDS = torch.tensor([[1, 4, 6], [1, 4, 4], [1, 4, 4]])  # (t, h, w) in patches


def test_patchify_is_a_strided_convolution():
    torch.manual_seed(0)
    images = torch.randn(2, 3, 8, 12, dtype=torch.float64)
    conv = torch.nn.Conv2d(3, 5, 4, stride=4, dtype=torch.float64)
    mine = patchify(images, 4) @ conv.weight.flatten(1).T + conv.bias  # (2, 6, 5)
    assert torch.allclose(mine, conv(images).flatten(2).transpose(1, 2), atol=1e-12)
    assert patch_positions(2, 3).tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]


def test_vit_shapes_and_bidirectional_weights():
    torch.manual_seed(0)
    model = VisionTransformer(8, 4, 3, 16, 2, 2, 5, dtype=torch.float64)
    logits, weights = model(torch.randn(3, 3, 8, 8, dtype=torch.float64), need_weights=True)
    assert logits.shape == (3, 5) and weights.shape == (3, 2, 2, 5, 5)
    assert (weights[..., 0, -1] > 0).all()  # the class token sees the last patch: no mask


@pytest.mark.parametrize(
    "bad",
    [
        lambda: patchify(torch.randn(1, 3, 10, 8), 4),
        lambda: PatchEmbedding(10, 4, 3, 8),
        lambda: rope_2d(torch.zeros(5, 3, dtype=torch.long), 8),
        lambda: rope_2d(torch.zeros(5, 2, dtype=torch.long), 6),
        lambda: mrope(torch.zeros(2, 5, dtype=torch.long), 16, (2, 3, 3)),
        lambda: mrope(torch.zeros(3, 5, dtype=torch.long), 16, (2, 3, 2)),
        lambda: mrope_positions(TYPES, GRIDS[:, :2]),
        lambda: mrope_positions(TYPES, GRIDS, merge=1),  # the runs do not hold the grids
        lambda: vision_mask(TYPES[0]),
        lambda: tokens_per_image(100, 56, 14, merge=2),
    ],
)
def test_bad_inputs_raise_value_error(bad):
    with pytest.raises(ValueError):
        bad()


@pytest.mark.parametrize(
    "bad",
    [
        lambda: patchify(torch.zeros(1, 3, 8, 8, dtype=torch.long), 4),
        lambda: rope_2d(torch.zeros(5, 2), 8),
        lambda: mrope(torch.zeros(3, 5), 16, (2, 3, 3)),
        lambda: vision_mask(TYPES.bool()),
    ],
)
def test_bad_types_raise_type_error(bad):
    with pytest.raises(TypeError):
        bad()


def test_rope_2d_is_qwen2_vl_vision_rotary():
    config = qwen2_vl().vision_config
    positions = patch_positions(3, 5)  # (15, 2)
    cos, sin = Qwen2VLVisionRotaryEmbedding(config)(torch.zeros(1), positions)
    mine_cos, mine_sin = rope_2d(positions, 32 // 2)  # head_dim 16
    assert cos.shape == (15, 16)
    assert (cos - torch.cat([mine_cos, mine_cos], -1)).abs().max() < 1e-6
    assert (sin - torch.cat([mine_sin, mine_sin], -1)).abs().max() < 1e-6


@pytest.mark.parametrize("interleaved", [False, True])
def test_mrope_is_transformers_rotary(interleaved):
    torch.manual_seed(0)
    if interleaved:
        rotary, d_head, sections = Qwen3VLTextRotaryEmbedding(qwen3_vl().text_config), 32, (6, 5, 5)
    else:
        rotary, d_head, sections = Qwen2VLRotaryEmbedding(qwen2_vl().text_config), 16, (2, 3, 3)
    positions = torch.randint(0, 300, (3, 2, 9))
    cos, sin = rotary(torch.zeros(1), positions)  # (B, L, d_head)
    mine_cos, mine_sin = mrope(positions, d_head, sections, interleaved=interleaved)
    assert (cos[..., : d_head // 2] - mine_cos).abs().max() < 1e-5
    assert (sin[..., d_head // 2 :] - mine_sin).abs().max() < 1e-5
    # text: three equal ids are 1-D RoPE, exactly
    text = torch.arange(40).expand(3, 1, 40)
    cos, sin = mrope(text, d_head, sections, interleaved=interleaved)
    plain = rope_cos_sin(torch.arange(40)[None], d_head, base=10000.0, dtype=torch.float64)
    assert torch.equal(cos, plain[0]) and torch.equal(sin, plain[1])
    q = torch.randn(1, 40, d_head, dtype=torch.float64)
    from attention_lib.rope import rotate_pairs

    assert torch.equal(rotate_pairs(q, cos, sin), apply_rope(q, torch.arange(40)))


@pytest.mark.parametrize("make", [qwen2_vl, qwen3_vl])
def test_mrope_positions_is_get_rope_index(make):
    model = (Qwen2VLModel if make is qwen2_vl else Qwen3VLModel)(make())
    ids = torch.arange(TYPES.shape[1]).expand(2, -1)
    theirs, _ = model.get_rope_index(ids, TYPES, image_grid_thw=GRIDS)
    assert torch.equal(mrope_positions(TYPES, GRIDS, merge=2), theirs)
    text = torch.zeros(1, 6, dtype=torch.long)
    assert torch.equal(mrope_positions(text, GRIDS[:0]), torch.arange(6).expand(3, 1, 6))


def test_vision_mask_is_gemma3s():
    config = Gemma3TextConfig(**TEXT_CONFIG, head_dim=16, sliding_window=4)
    config._attn_implementation = "sdpa"
    types = torch.tensor(
        [[0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0], [0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0]]
    )
    masks = create_masks_for_vision_model(
        config=config,
        inputs_embeds=torch.zeros(2, 12, 32),
        attention_mask=None,
        cache=None,
        position_ids=None,
        block_sequence_ids=get_block_sequence_ids_for_mask(types),
    )
    assert torch.equal(vision_mask(types), masks["full_attention"])
    assert not vision_mask(types)[0, 0, 1, 2] and vision_mask(types)[0, 0, 2, 4]


def test_cross_attention_is_barts():
    torch.manual_seed(0)
    config = BartConfig(d_model=16, decoder_attention_heads=4, decoder_ffn_dim=16, vocab_size=32)
    config._attn_implementation = "eager"
    layer = BartDecoderLayer(config, layer_idx=0).encoder_attn.double().eval()
    mine = MultiHeadAttention(16, 4, dtype=torch.float64)
    for ours, theirs in [
        ("W_q", "q_proj"),
        ("W_k", "k_proj"),
        ("W_v", "v_proj"),
        ("W_o", "out_proj"),
    ]:
        getattr(mine, ours).load_state_dict(getattr(layer, theirs).state_dict())
    target, source = torch.randn(2, 5, 16).double(), torch.randn(2, 7, 16).double()
    out, weights = layer(target, key_value_states=source, attention_mask=None)
    my_out, my_weights = mine(target, source, source, need_weights=True)
    assert (out - my_out).abs().max() < 1e-12 and (weights - my_weights).abs().max() < 1e-12


def test_tokens_per_image():
    assert tokens_per_image(448, 448, 14, merge=2) == 256
    assert tokens_per_image(24, 24, 4) == 36
