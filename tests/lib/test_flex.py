"""attention_lib.flex (chapter 20): every mask_mod equals the library's keep-mask and 🤗
transformers' masking_utils, called as its models call them; every score_mod equals the
library's attention (soft-capping, sinks) or the model that introduced it (ALiBi:
BLOOM); FlexAttention with each BlockMask equals F.scaled_dot_product_attention with
the dense mask, eager and compiled."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import (
    AuxRequest,
    and_masks,
    create_block_mask,
    flex_attention,
)
from transformers import LlamaConfig
from transformers.masking_utils import (
    chunked_causal_mask_function,
    create_causal_mask,
    find_packed_sequence_indices,
    sliding_window_causal_mask_function,
)
from transformers.models.bloom.modeling_bloom import build_alibi_tensor

from attention_lib import (
    alibi_slopes,
    causal_mask,
    dense_mask,
    document_ids,
    document_positions,
    flex,
    padding_mask,
    scaled_dot_product_attention,
    tile_kinds,
    top_k_keys,
    with_sink,
)
from attention_lib.dsa import top_k_mask

# Eager flex_attention warns that it is not the fused kernel: that path is the point here.
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def llama_config():
    config = LlamaConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=1)
    config._attn_implementation = "sdpa"
    return config


@pytest.mark.parametrize("q_len, k_len", [(6, 6), (1, 9), (3, 8), (8, 3)])
def test_causal_with_an_offset_is_the_library_mask_and_transformers(q_len, k_len, hf_sdpa_mask):
    offset = k_len - q_len  # the queries after the cache
    mine = dense_mask(flex.causal(offset), q_len, k_len)[0, 0]
    assert torch.equal(mine, causal_mask(q_len, k_len, offset=offset))
    if offset >= 0:  # transformers' queries start at q_offset of the same keys
        hf = hf_sdpa_mask(lambda b, h, q, k: k <= q, q_len, k_len, q_offset=offset)
        assert torch.equal(mine, hf)


@pytest.mark.parametrize("offset", [0, 3])
def test_sliding_window_and_chunks_are_the_library_masks_and_transformers(offset, hf_sdpa_mask):
    q_len, k_len = 12 - offset, 12
    for mod, lib, hf in [
        (
            flex.sliding_window(4, offset),
            causal_mask(q_len, k_len, offset=offset, window=4),
            sliding_window_causal_mask_function(4),
        ),
        (
            flex.chunked(5, offset),
            causal_mask(q_len, k_len, offset=offset, chunk=5),
            chunked_causal_mask_function(5, torch.zeros(1, dtype=torch.long)),
        ),
    ]:
        mine = dense_mask(mod, q_len, k_len)[0, 0]
        assert torch.equal(mine, lib)
        assert torch.equal(mine, hf_sdpa_mask(hf, q_len, k_len, q_offset=offset))


def test_causal_and_padding_is_the_library_mask_and_create_causal_mask():
    lengths = [5, 2, 7]
    mod = and_masks(flex.causal(), flex.padding(lengths))
    mine = dense_mask(mod, 7, batch=3)  # (3, 1, 7, 7)
    assert torch.equal(mine, padding_mask(lengths, 7) & causal_mask(7))
    attention_mask = padding_mask(lengths, 7)[:, 0, 0].long()  # (B, L): 1 = real token
    x = torch.zeros(3, 7, 32)
    hf = create_causal_mask(llama_config(), x, attention_mask, cache=None)
    assert torch.equal(mine, hf)


def test_documents_are_transformers_packed_sequences():
    ids = document_ids([3, 5, 1, 4])  # (13,)
    positions = document_positions(ids)  # restart at every document
    assert positions.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0, 0, 1, 2, 3]
    assert torch.equal(find_packed_sequence_indices(positions[None])[0], ids)
    mine = dense_mask(flex.document(ids), 13)
    x = torch.zeros(1, 13, 32)
    hf = create_causal_mask(llama_config(), x, None, cache=None, position_ids=positions[None])
    assert torch.equal(mine, hf)
    # each document's block is its own causal mask, nothing across documents
    by_hand = torch.block_diag(*[causal_mask(n) for n in (3, 5, 1, 4)])
    assert torch.equal(mine[0, 0], by_hand)


def test_documents_per_row_and_a_padded_tail():
    ids = torch.stack([document_ids([2, 4], total=8), document_ids([5], total=8)])
    assert ids[0, -2:].tolist() == [-1, -1] and ids[1, 5:].tolist() == [-1] * 3
    mine = dense_mask(flex.document(ids), 8, batch=2)[:, 0]  # (2, 8, 8)
    for row, lengths in zip(mine, [(2, 4, 2), (5, 3)]):
        assert torch.equal(row, torch.block_diag(*[causal_mask(n) for n in lengths]))


def test_prefix_lm_is_transformers_block_sequence_ids():
    mine = dense_mask(flex.prefix_lm(4), 10)
    blocks = torch.tensor([[0] * 4 + [-1] * 6])  # the prefix is one block, the rest causal
    x = torch.zeros(1, 10, 32)
    hf = create_causal_mask(llama_config(), x, None, cache=None, block_sequence_ids=blocks)
    assert torch.equal(mine, hf)
    assert torch.equal(dense_mask(flex.prefix_lm(0), 10)[0, 0], causal_mask(10))


def test_tree_mask_is_the_ancestor_relation():
    parents = [-1, 0, 0, 1, 1, 2, 5]
    mine = dense_mask(flex.tree(parents), 7)[0, 0]
    for i in range(7):
        seen, node = set(), i
        while node >= 0:
            seen.add(node)
            node = parents[node]
        assert mine[i].nonzero().flatten().tolist() == sorted(seen)
    chain = dense_mask(flex.tree([-1, 0, 1, 2]), 4)[0, 0]  # a chain is causal
    assert torch.equal(chain, causal_mask(4))


def test_from_keep_reads_a_top_k_mask():
    torch.manual_seed(0)
    scores = torch.randn(2, 3, 6, 6).masked_fill(~causal_mask(6), float("-inf"))
    keep = top_k_mask(*top_k_keys(scores, 2), 6)  # (2, 3, 6, 6)
    assert torch.equal(dense_mask(flex.from_keep(keep), 6, batch=2, heads=3), keep)
    one = dense_mask(flex.from_keep(causal_mask(5)), 5)
    assert torch.equal(one[0, 0], causal_mask(5))


def qkv(length=40, heads=2, dtype=torch.float64):
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(2, heads, length, 8, generator=gen, dtype=dtype) for _ in range(3)]


MASKS = {
    "causal": flex.causal(),
    "window": flex.sliding_window(7),
    "chunked": flex.chunked(8),
    "documents": flex.document(document_ids([9, 20, 11])),
    "prefix": flex.prefix_lm(10),
    "tree": flex.tree([-1] + [i // 2 for i in range(39)]),
}


@pytest.mark.parametrize("name", MASKS)
def test_flex_attention_equals_sdpa_and_the_library_with_the_dense_mask(name):
    q, k, v = qkv()
    keep = dense_mask(MASKS[name], 40)
    block = create_block_mask(MASKS[name], None, None, 40, 40, device="cpu", BLOCK_SIZE=16)
    out = flex_attention(q, k, v, block_mask=block)
    assert (out - F.scaled_dot_product_attention(q, k, v, attn_mask=keep)).abs().max() < 1e-12
    assert (out - scaled_dot_product_attention(q, k, v, keep)[0]).abs().max() < 1e-12


def test_softcap_is_the_library_softcap():
    q, k, v = qkv()
    q = q * 4  # large scores, so that the cap bites
    out = flex_attention(q, k, v, score_mod=flex.softcap(5.0))
    assert (out - scaled_dot_product_attention(q, k, v, softcap=5.0)[0]).abs().max() < 1e-12
    assert (out - F.scaled_dot_product_attention(q, k, v)).abs().max() > 1e-3


def test_sink_from_the_log_sum_exp_is_the_library_sink():
    q, k, v = qkv()
    sink = torch.tensor([0.5, -1.0], dtype=torch.float64)
    block = create_block_mask(flex.causal(), None, None, 40, 40, device="cpu")
    out, aux = flex_attention(q, k, v, block_mask=block, return_aux=AuxRequest(lse=True))
    mine = with_sink(out, aux.lse, sink)
    lib = scaled_dot_product_attention(q, k, v, is_causal=True, sink=sink)[0]
    assert (mine - lib).abs().max() < 1e-12


@pytest.mark.parametrize("heads", [1, 4, 6, 8, 12])
def test_alibi_slopes_and_bias_are_blooms(heads):
    attention_mask = torch.ones(1, 9)
    bloom = build_alibi_tensor(attention_mask, heads, torch.float32)  # (H, 1, 9): slope * j
    slopes = alibi_slopes(heads)  # float64 powers rounded once; BLOOM's powers are float32
    assert ((slopes - bloom[:, 0, 1]).abs() / slopes).max() < 1e-6
    q, k, v = qkv(9, heads, torch.float32)
    block = create_block_mask(flex.causal(), None, None, 9, 9, device="cpu")
    mine = flex_attention(q, k, v, score_mod=flex.alibi(alibi_slopes(heads)), block_mask=block)
    bias = bloom.view(1, heads, 1, 9).masked_fill(~causal_mask(9), float("-inf"))
    # BLOOM adds slope * j; ALiBi's slope * (j - i) differs by slope * i in each row,
    # which the softmax does not see
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    assert (mine - theirs).abs().max() < 1e-5


def test_tile_kinds_of_causal_and_sliding_window():
    causal_tiles = tile_kinds(
        create_block_mask(flex.causal(), None, None, 64, 64, device="cpu", BLOCK_SIZE=16)
    )
    expected = torch.ones(4, 4, dtype=torch.long).tril(-1) + 2 * torch.eye(4, dtype=torch.long)
    assert torch.equal(causal_tiles[0, 0], expected)  # full below, masked on the diagonal
    window = create_block_mask(
        flex.sliding_window(16), None, None, 64, 64, device="cpu", BLOCK_SIZE=16
    )
    kinds = tile_kinds(window)[0, 0]
    assert kinds.diagonal().tolist() == [2] * 4 and kinds.diagonal(-1).tolist() == [2] * 3
    assert (kinds.tril(-2) == 0).all()  # the window never reaches two tiles back
    ragged = create_block_mask(flex.causal(), None, None, 40, 40, device="cpu", BLOCK_SIZE=16)
    assert tile_kinds(ragged).shape == (1, 1, 3, 3)


def test_bad_arguments_get_clear_errors():
    with pytest.raises(ValueError, match="window"):
        flex.sliding_window(0)
    with pytest.raises(TypeError, match="chunk_size"):
        flex.chunked(2.5)
    with pytest.raises(TypeError, match="offset"):
        flex.causal("3")
    with pytest.raises(ValueError, match="lengths"):
        flex.padding([3, -1])
    with pytest.raises(TypeError, match="doc_ids"):
        flex.document(torch.zeros(4))
    with pytest.raises(ValueError, match="doc_ids"):
        flex.document(torch.zeros(1, 2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="total"):
        document_ids([3, 4], total=5)
    with pytest.raises(ValueError, match="parents"):
        flex.tree([-1, 2, 0])
    with pytest.raises(TypeError, match="keep"):
        flex.from_keep(torch.ones(3, 3))
    with pytest.raises(ValueError, match="cap"):
        flex.softcap(-1.0)
    with pytest.raises(TypeError, match="slopes"):
        flex.alibi(torch.ones(2, 2))
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(0)
    with pytest.raises(TypeError, match="mask_mod"):
        dense_mask(flex.softcap(2.0), 4)  # a score_mod is not a mask_mod
    with pytest.raises(ValueError, match="q_len"):
        dense_mask(flex.causal(), -1)
    with pytest.raises(ValueError, match="lse"):
        with_sink(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 4), torch.zeros(2))
    with pytest.raises(TypeError, match="BlockMask"):
        tile_kinds(causal_mask(4))


def test_compiled_flex_attention_matches_eager():
    """The compiled kernel (inductor's CPU code) skips the tiles the BlockMask skips and
    gives the same output; the first compile takes about 40 s on a 2-core machine."""
    q, k, v = qkv(256, 2, torch.float32)
    ids = document_ids([100, 60, 96])
    block = create_block_mask(flex.document(ids), None, None, 256, 256, device="cpu")
    compiled = torch.compile(flex_attention, dynamic=False)
    eager = flex_attention(q, k, v, block_mask=block, score_mod=flex.softcap(20.0))
    out = compiled(q, k, v, block_mask=block, score_mod=flex.softcap(20.0))
    assert (out - eager).abs().max() < 1e-5
