"""Mamba-2's SSD (chapter 18) against 🤗 transformers 5.24's Mamba-2.

Oracle: ``mamba2_chunk_scan`` and ``mamba2_selective_state_update`` (the torch
paths of ``Mamba2Mixer``: the chunked scan of a prefill and the one-token state
update of decoding), called as the mixer calls them (raw ``dt`` with
``dt_bias`` and ``dt_softplus=True``, ``A = -exp(A_log)``, grouped ``B`` and
``C``, ``D``, an initial state), on copies of our tensors. They compute in
float32: matched within 1e-5. Our three schedules agree in float64 within
1e-10.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download

import pytest
import torch
import torch.nn.functional as F
from transformers.models.mamba2 import modeling_mamba2 as mamba2

from attention_lib.mamba2 import mamba2_scan, ssd, ssd_mask


def close(a: torch.Tensor, b: torch.Tensor, tol: float) -> None:
    torch.testing.assert_close(a, b, atol=tol, rtol=tol, check_dtype=False)


def inputs(batch: int, H: int, G: int, L: int, N: int, P: int, seed: int = 0):
    """Mamba-2's inputs in our layout (batch, H or G, L, ...), float64."""
    torch.manual_seed(seed)
    x = torch.randn(batch, H, L, P, dtype=torch.float64)
    dt_raw = torch.randn(batch, H, L, dtype=torch.float64)
    dt_bias = torch.randn(H, dtype=torch.float64) * 0.5
    A = -torch.empty(H, dtype=torch.float64).uniform_(1, 16)  # -exp(A_log), the init's range
    B, C = torch.randn(2, batch, G, L, N, dtype=torch.float64).unbind(0)
    D = torch.randn(H, dtype=torch.float64)
    state = torch.randn(batch, H, N, P, dtype=torch.float64)
    return x, dt_raw, dt_bias, A, B, C, D, state


SHAPES = [(1, 1, 1, 1, 4, 4), (2, 4, 2, 7, 8, 4), (1, 4, 1, 37, 16, 8), (2, 2, 2, 70, 8, 16)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_equals_transformers_chunk_scan(shape) -> None:
    x, dt_raw, dt_bias, A, B, C, D, state = inputs(*shape)
    their = {"x": x.transpose(1, 2), "dt": dt_raw.transpose(1, 2)}  # (batch, L, H, ...)
    with torch.no_grad():
        want, want_state = mamba2.mamba2_chunk_scan(
            their["x"].float().clone(), their["dt"].float().clone(), A.float().clone(),
            B.transpose(1, 2).float().clone(), C.transpose(1, 2).float().clone(),
            chunk_size=16, D=D.float().clone(), dt_bias=dt_bias.float().clone(),
            initial_states=state.transpose(-2, -1).float().clone(), dt_softplus=True,
            dt_limit=(0.0, float("inf")), return_final_states=True,
        )  # fmt: skip
    dt = F.softplus(dt_raw + dt_bias[:, None])  # what the scan does with dt_bias, dt_softplus
    for schedule in ("chunked", "recurrent", "quadratic"):
        out, final = mamba2_scan(
            x, dt, A, B, C, D, schedule=schedule, chunk_size=16, initial_state=state,
            output_final_state=True,
        )  # fmt: skip
        close(out, want.transpose(1, 2), 1e-5)
        close(final, want_state.transpose(-2, -1), 1e-5)  # theirs is (batch, H, P, N)


@pytest.mark.parametrize("shape", SHAPES[:2], ids=str)
def test_decoding_equals_transformers_state_update(shape) -> None:
    x, dt_raw, dt_bias, A, B, C, D, state = inputs(*shape, seed=1)
    *_, N, P = shape
    theirs = state.transpose(-2, -1).float().clone()  # (batch, H, P, N), updated in place
    ours = state
    for t in range(x.shape[2]):
        with torch.no_grad():
            want = mamba2.mamba2_selective_state_update(
                theirs, x[:, :, t].float().clone(),
                dt_raw[:, :, t, None].expand(-1, -1, P).float().clone(),
                A[:, None, None].expand(-1, P, N).float().clone(),
                B[:, :, t].float().clone(), C[:, :, t].float().clone(),
                D[:, None].expand(-1, P).float().clone(), z=None,
                dt_bias=dt_bias[:, None].expand(-1, P).float().clone(), dt_softplus=True,
            )  # fmt: skip
        dt = F.softplus(dt_raw[:, :, t : t + 1] + dt_bias[:, None])
        got, ours = mamba2_scan(
            x[:, :, t : t + 1], dt, A, B[:, :, t : t + 1], C[:, :, t : t + 1], D,
            schedule="recurrent", initial_state=ours, output_final_state=True,
        )  # fmt: skip
        close(got[:, :, 0], want, 1e-5)
        close(ours, theirs.transpose(-2, -1), 1e-5)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("chunk_size", [1, 5, 16, 64])
def test_three_schedules_agree_in_float64(shape, chunk_size) -> None:
    x, _, _, _, B, C, _, state = inputs(*shape, seed=2)
    H = x.shape[1]
    q, k = (t.repeat_interleave(H // B.shape[1], dim=1) for t in (C, B))
    g = -torch.rand(x.shape[:3], dtype=torch.float64)
    kw = {"initial_state": state, "output_final_state": True}
    want = ssd(q, k, x, g, schedule="quadratic", **kw)
    for got in (
        ssd(q, k, x, g, schedule="recurrent", **kw),
        ssd(q, k, x, g, schedule="chunked", chunk_size=chunk_size, **kw),
    ):
        for a, b in zip(got, want):
            close(a, b, 1e-10)


def test_ssd_is_masked_linear_attention() -> None:
    torch.manual_seed(3)
    q, k, v = torch.randn(3, 2, 3, 9, 4, dtype=torch.float64).unbind(0)
    g = -torch.rand(2, 3, 9, dtype=torch.float64)
    mask = ssd_mask(g)  # (2, 3, 9, 9)
    assert (mask.triu(1) == 0).all() and torch.allclose(
        mask.diagonal(dim1=-2, dim2=-1), g.new_ones(1)
    )
    close(ssd(q, k, v, g), (q @ k.transpose(-2, -1) * mask) @ v, 1e-12)
    close(ssd(q, k, v, torch.zeros_like(g)), (q @ k.transpose(-2, -1)).tril() @ v, 1e-12)


def test_half_precision_computes_in_float32() -> None:
    torch.manual_seed(4)
    q, k, v = torch.randn(3, 1, 2, 19, 8).unbind(0)
    g = -torch.rand(1, 2, 19)
    got = ssd(q.bfloat16(), k.bfloat16(), v.bfloat16(), g, chunk_size=8)
    assert got.dtype == torch.bfloat16
    close(got, ssd(q, k, v, g, chunk_size=8), 5e-2)


def test_refuses_bad_input() -> None:
    x, dt_raw, _, A, B, C, _, _ = inputs(1, 4, 2, 5, 4, 4)
    dt = F.softplus(dt_raw)
    with pytest.raises(ValueError, match="dt > 0 and A < 0"):
        mamba2_scan(x, dt, -A, B, C)
    with pytest.raises(ValueError, match="divide the 4 heads"):
        mamba2_scan(x, dt, A, B[:, :1].expand(-1, 3, -1, -1), C)
    with pytest.raises(ValueError, match="log-decay"):
        ssd(C, B, x[:, :2], dt[:, :2])
    with pytest.raises(ValueError, match="schedule"):
        ssd(C, B, x[:, :2], -dt[:, :2], schedule="fast")
    with pytest.raises(ValueError, match=r"\(B, H, L\)"):
        ssd(C, B, x[:, :2], -dt[:, :2, :3])


# --- the layer: Mamba2.from_hf against Mamba2Mixer ---------------------------------------


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("length", [1, 5, 21])  # one token, < and > an 8-token chunk
def test_mamba2_layer_from_hf_equals_mamba2_mixer_prefill_and_decode(groups, length) -> None:
    """Called as ``Mamba2Block`` calls it, with the model's own cache (the
    convolution and the SSM state) for a prefill then 6 tokens."""
    from transformers import DynamicCache, Mamba2Config

    from attention_lib.gated_deltanet import LayerStateCache
    from attention_lib.mamba2 import Mamba2

    torch.manual_seed(length)
    cfg = Mamba2Config(
        hidden_size=16, num_heads=4, head_dim=8, state_size=8, n_groups=groups,
        conv_kernel=4, chunk_size=8, vocab_size=16, num_hidden_layers=1, use_bias=True,
    )  # fmt: skip
    theirs = mamba2.Mamba2Mixer(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for p in theirs.parameters():  # random, not the init's ones/zeros
            p.copy_(torch.randn_like(p) * 0.3)
    ours = Mamba2.from_hf(theirs)
    x = torch.randn(2, length + 6, 16)
    steps = [slice(0, length)] + [slice(t, t + 1) for t in range(length, length + 6)]
    mine, their_cache = LayerStateCache(), DynamicCache(config=cfg)
    with torch.no_grad():
        got = torch.cat([ours(x[:, s], kv_cache=mine) for s in steps], dim=1)
        expected = torch.cat(
            [theirs(x[:, s], cache=their_cache, attention_mask=None) for s in steps], dim=1
        )
        whole = ours(x)
    assert expected.abs().mean() > 0.05  # a real signal
    close(got, expected, 1e-5)
    close(whole, expected, 1e-5)  # prefill + decode == one pass
    channels = 32 + 2 * groups * 8  # x, B, C
    assert mine.nbytes == 2 * 4 * 8 * 8 * 4 + 2 * channels * 3 * 4  # state + conv inputs
    with pytest.raises(TypeError, match="Mamba2Mixer"):
        Mamba2.from_hf(torch.nn.Linear(2, 2))
