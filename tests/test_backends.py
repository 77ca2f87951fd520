"""Tests for attention_lib.backends: the registry and the lib/torch backends."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attention_lib import MultiHeadAttention, available_backends, get_backend, register_backend
from attention_lib import backends
from attention_lib.backends import lib_backend, torch_backend



def test_registry_names() -> None:
    names = available_backends()
    assert names[:2] == ("lib", "torch")
    assert get_backend("lib") is lib_backend and get_backend("torch") is torch_backend


@pytest.mark.parametrize("name", ["flash", "", None, "LIB"])
def test_get_backend_unknown(name) -> None:
    with pytest.raises(ValueError, match=r"backend must be one of 'lib', 'torch'.*got " + repr(name).replace("'", "'")):
        get_backend(name)


def test_register_backend_and_use_in_mha() -> None:
    calls = []

    def recording(q, k, v, mask, *, dropout_p, is_causal, scale):
        calls.append((q.shape, k.shape, v.shape, mask, dropout_p, is_causal, scale))
        return lib_backend(q, k, v, mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale)

    register_backend("recording", recording)
    try:
        assert "recording" in available_backends()
        with pytest.raises(ValueError, match=r"backend 'recording' is already registered"):
            register_backend("recording", recording)
        register_backend("recording", recording, overwrite=True)
        torch.manual_seed(0)
        mha = MultiHeadAttention(16, 4, backend="recording").eval()
        x = torch.randn(2, 5, 16)
        out = mha(x, x, x, is_causal=True)
        assert calls == [((2, 4, 5, 4), (2, 4, 5, 4), (2, 4, 5, 4), None, 0.0, True, None)]
        mha.backend = "lib"
        torch.testing.assert_close(out, mha(x, x, x, is_causal=True))
        # need_weights never goes through the backend (it cannot return weights)
        mha.backend = "recording"
        mha(x, x, x, need_weights=True)
        assert len(calls) == 1
    finally:
        del backends._BACKENDS["recording"]
    assert "recording" not in available_backends()


@pytest.mark.parametrize(
    "name,fn,exc,match",
    [
        ("", lib_backend, TypeError, r"name must be a non-empty str, got ''"),
        (3, lib_backend, TypeError, r"name must be a non-empty str, got 3"),
        ("x", "not callable", TypeError, r"fn must be callable, got str"),
        ("lib", lib_backend, ValueError, r"backend 'lib' is already registered"),
    ],
)
def test_register_backend_bad_input(name, fn, exc, match) -> None:
    with pytest.raises(exc, match=match):
        register_backend(name, fn)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32, torch.int64])
@pytest.mark.parametrize("q_len,k_len", [(5, 5), (3, 6), (6, 3)])
def test_backends_agree(is_causal, mask_dtype, q_len, k_len) -> None:
    torch.manual_seed(1)
    q = torch.randn(2, 3, q_len, 8, dtype=torch.float64)
    k = torch.randn(2, 3, k_len, 8, dtype=torch.float64)
    v = torch.randn(2, 3, k_len, 4, dtype=torch.float64)
    mask = (torch.rand(2, 1, q_len, k_len) > 0.4).to(mask_dtype)
    mask[0, 0, 1] = 0  # a fully masked row
    kwargs = {"dropout_p": 0.0, "is_causal": is_causal, "scale": 0.3}
    ours = lib_backend(q, k, v, mask, **kwargs)
    fused = torch_backend(q, k, v, mask, **kwargs)
    torch.testing.assert_close(fused, ours, atol=1e-10, rtol=1e-10)
    assert torch.all(fused[0, :, 1] == 0)
    # the float 0/1 mask is NOT passed to torch as an additive bias
    if mask_dtype == torch.float32:
        as_bias = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.double(), scale=0.3)
        assert not torch.allclose(as_bias, fused)
    for name in ("lib", "torch"):
        torch.testing.assert_close(get_backend(name)(q, k, v, None, **kwargs),
                                   F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=0.3),
                                   atol=1e-10, rtol=1e-10)


def test_torch_backend_dropout_and_bad_input() -> None:
    q = torch.randn(1, 2, 4, 8)
    out = torch_backend(q, q, q, None, dropout_p=0.5, is_causal=False, scale=None)
    assert not torch.allclose(out, torch_backend(q, q, q, None, dropout_p=0.0, is_causal=False, scale=None))
    with pytest.raises(ValueError, match=r"dropout_p must be a float in \[0, 1\), got 1.5"):
        torch_backend(q, q, q, None, dropout_p=1.5, is_causal=False, scale=None)
    with pytest.raises(ValueError, match=r"additive bias"):
        torch_backend(q, q, q, torch.zeros(4, 4) - 1e9, dropout_p=0.0, is_causal=False, scale=None)
    with pytest.raises(ValueError, match=r"same last dim d_k"):
        torch_backend(q, q[..., :4], q, None, dropout_p=0.0, is_causal=False, scale=None)
    with pytest.raises(ValueError, match=r"mask of shape \(3, 4\) does not broadcast"):
        torch_backend(q, q, q, torch.ones(3, 4, dtype=torch.bool), dropout_p=0.0, is_causal=False, scale=None)


@pytest.mark.parametrize("is_causal", [False, True])
def test_mha_tiled_backend_matches_lib(is_causal) -> None:
    """Chapter 8's tiled attention plugs into MultiHeadAttention like the others."""
    assert "tiled" in available_backends()
    torch.manual_seed(2)
    mha = MultiHeadAttention(16, 4, backend="tiled", dtype=torch.float64).eval()
    x, mem = torch.randn(2, 9, 16, dtype=torch.float64), torch.randn(2, 11, 16, dtype=torch.float64)
    mask = torch.rand(2, 1, 9, 11) > 0.3
    tiled = mha(x, mem, mem, mask, is_causal=is_causal)
    mha.backend = "lib"
    torch.testing.assert_close(tiled, mha(x, mem, mem, mask, is_causal=is_causal), atol=1e-10, rtol=1e-10)
