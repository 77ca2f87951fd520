"""Tests for attention_lib.backends: the table of backends and what each computes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import repeat_kv

from attention_lib import MultiHeadAttention, available_backends, causal_mask
from attention_lib.backends import (
    BACKENDS,
    lib_attention,
    lib_backend,
    tiled_backend,
    torch_backend,
)
from attention_lib.masks import Causal


def test_the_table_names_three_backends() -> None:
    assert available_backends() == ("lib", "torch", "tiled")
    assert BACKENDS == {"lib": lib_backend, "torch": torch_backend, "tiled": tiled_backend}


CAUSAL = [None, Causal(), Causal(2), Causal(-1), Causal(0, 2), Causal(3, 2), Causal(4, 1)]
CAUSAL += [Causal(0, None, 2), Causal(3, None, 2), Causal(2, 3, 3), Causal(5, None, 4)]  # chunks


@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("q_len,k_len", [(5, 5), (3, 6), (6, 3), (1, 7)])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_backends_agree_with_fused_sdpa(causal, with_mask, q_len, k_len, kv_heads) -> None:
    # Every backend, every causal offset and window, grouped heads: the same numbers
    # as F.scaled_dot_product_attention given the mask built in full and enable_gqa.
    torch.manual_seed(1)
    q = torch.randn(2, 4, q_len, 8, dtype=torch.float64)
    k = torch.randn(2, kv_heads, k_len, 8, dtype=torch.float64)
    v = torch.randn(2, kv_heads, k_len, 8, dtype=torch.float64)
    keep = None
    if with_mask:
        keep = torch.rand(2, 1, q_len, k_len) > 0.4
        keep[0, 0, 0] = False  # a fully masked row
    full = torch.ones(q_len, k_len, dtype=torch.bool)
    if causal is not None:
        full = causal_mask(
            q_len, k_len, offset=causal.offset, window=causal.window, chunk=causal.chunk
        )
    full = full if keep is None else full & keep
    reference = F.scaled_dot_product_attention(
        q, k, v, attn_mask=full, scale=0.3, enable_gqa=kv_heads != 4
    ).masked_fill(~full.any(-1, keepdim=True), 0.0)  # torch: NaN or 0 rows, ours 0
    kwargs = {"causal": causal, "dropout_p": 0.0, "scale": 0.3}
    for name, backend in BACKENDS.items():
        options = {"block_size": (2, 3)} if name == "tiled" else {}
        out = backend(q, k, v, keep, **kwargs, **options)
        torch.testing.assert_close(out, reference, atol=1e-10, rtol=1e-10, msg=name)


def test_lib_attention_returns_the_weights_of_every_query_head() -> None:
    torch.manual_seed(2)
    q, k, v = torch.randn(1, 6, 4, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    out, weights = lib_attention(q, k, v, None, causal=Causal(1), dropout_p=0.0, scale=None)
    assert weights.shape == (1, 6, 4, 5)
    expected = torch.softmax(
        (q @ repeat_kv(k, 3).transpose(-2, -1) / 8**0.5).masked_fill(
            ~causal_mask(4, 5, offset=1), float("-inf")
        ),
        -1,
    )
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(out, expected @ repeat_kv(v, 3))


def test_torch_backend_dropout() -> None:
    q = torch.randn(1, 2, 4, 8)
    kwargs = {"causal": None, "scale": None}
    out = torch_backend(q, q, q, None, dropout_p=0.5, **kwargs)
    assert not torch.allclose(out, torch_backend(q, q, q, None, dropout_p=0.0, **kwargs))


@pytest.mark.parametrize("backend", ["lib", "torch", "tiled"])
def test_a_float_keep_mask_reaches_the_backend_as_bool(backend, monkeypatch) -> None:
    # MHA validates and converts the 0/1 mask once; F.sdpa would read a float mask
    # as an additive bias, so the backends are only ever given bool masks.
    seen = []
    real = BACKENDS[backend]

    def spy(q, k, v, keep, **kwargs):
        seen.append(None if keep is None else keep.dtype)
        return real(q, k, v, keep, **kwargs)

    monkeypatch.setitem(BACKENDS, backend, spy)
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, backend=backend, dtype=torch.float64).eval()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    keep = (torch.rand(5, 5) > 0.3).double()
    out = mha(x, x, x, keep)
    assert seen == [torch.bool]
    expected, _ = mha(x, x, x, keep.bool(), need_weights=True)  # never via a backend
    assert seen == [torch.bool]
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=0)
