"""Tests for attention_lib.backends: the table of backends and the lib/torch backends."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attention_lib import MultiHeadAttention, available_backends, tiled_attention
from attention_lib.backends import BACKENDS, lib_backend, torch_backend


def test_the_table_names_three_backends() -> None:
    assert available_backends() == ("lib", "torch", "tiled")
    assert BACKENDS == {"lib": lib_backend, "torch": torch_backend, "tiled": tiled_attention}


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("q_len,k_len", [(5, 5), (3, 6), (6, 3)])
def test_backends_agree(is_causal, with_mask, q_len, k_len) -> None:
    torch.manual_seed(1)
    q = torch.randn(2, 3, q_len, 8, dtype=torch.float64)
    k = torch.randn(2, 3, k_len, 8, dtype=torch.float64)
    v = torch.randn(2, 3, k_len, 4, dtype=torch.float64)
    keep = None
    if with_mask:
        keep = torch.rand(2, 1, q_len, k_len) > 0.4
        keep[0, 0, 1] = False  # a fully masked row
    kwargs = {"dropout_p": 0.0, "is_causal": is_causal, "scale": 0.3}
    expected = lib_backend(q, k, v, keep, **kwargs)
    for name, backend in BACKENDS.items():
        out = backend(q, k, v, keep, **kwargs)
        torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10, msg=name)
        if with_mask:
            assert torch.all(out[0, :, 1] == 0), name  # the fully masked row
    if not with_mask:
        reference = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=0.3)
        torch.testing.assert_close(expected, reference, atol=1e-10, rtol=1e-10)


def test_torch_backend_dropout() -> None:
    q = torch.randn(1, 2, 4, 8)
    out = torch_backend(q, q, q, None, dropout_p=0.5, is_causal=False, scale=None)
    assert not torch.allclose(
        out, torch_backend(q, q, q, None, dropout_p=0.0, is_causal=False, scale=None)
    )


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
