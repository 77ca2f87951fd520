"""Tests for attention_lib.MultiHeadAttention (oracle: torch.nn.MultiheadAttention)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attention_lib import (
    MultiHeadAttention,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)


D_MODEL, HEADS = 16, 4
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available"),
    ),
]
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def torch_and_ours(dtype=torch.float32, bias=True, backend="lib", seed=0):
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(D_MODEL, HEADS, bias=bias, batch_first=True, dtype=dtype).eval()
    if bias:  # torch initialises biases to 0: make them matter
        with torch.no_grad():
            ref.in_proj_bias.normal_()
            ref.out_proj.bias.normal_()
    return ref, MultiHeadAttention.from_torch(ref, backend=backend).eval()


def random_inputs(kind, dtype, batch=3, q_len=5, k_len=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, q_len, D_MODEL, generator=g, dtype=dtype)
    if kind == "self":
        return x, x, x
    mem = torch.randn(batch, k_len, D_MODEL, generator=g, dtype=dtype)
    return x, mem, torch.randn(batch, k_len, D_MODEL, generator=g, dtype=dtype)


def torch_masks(kind, batch, q_len, k_len, seed=2):
    """Our keep-mask and the equivalent (attn_mask, key_padding_mask) for nn.MultiheadAttention.

    No query row is fully masked (nn.MultiheadAttention returns NaN there).
    """
    g = torch.Generator().manual_seed(seed)
    attn_keep = torch.rand(q_len, k_len, generator=g) > 0.4
    attn_keep[:, 0] = True
    lengths = torch.randint(1, k_len + 1, (batch,), generator=g)
    pad_keep = padding_mask(lengths, k_len)  # (B, 1, 1, Lk)
    per_head = torch.rand(batch, HEADS, q_len, k_len, generator=g) > 0.4
    per_head[..., 0] = True
    if kind == "none":
        return None, {}
    if kind == "attn_2d":
        return attn_keep, {"attn_mask": ~attn_keep}  # torch: True = blocked
    if kind == "padding":
        return pad_keep, {"key_padding_mask": ~pad_keep[:, 0, 0]}
    if kind == "both":
        ours = attn_keep & pad_keep  # (B, 1, Lq, Lk)
        return ours, {"attn_mask": ~attn_keep, "key_padding_mask": ~pad_keep[:, 0, 0]}
    if kind == "per_head":
        return per_head, {"attn_mask": ~per_head.reshape(batch * HEADS, q_len, k_len)}
    if kind == "batch_1":
        ours = per_head[:, :1]  # (B, 1, Lq, Lk)
        return ours, {
            "attn_mask": ~ours.expand(-1, HEADS, -1, -1).reshape(batch * HEADS, q_len, k_len)
        }
    if kind == "float01":
        return attn_keep.float(), {"attn_mask": ~attn_keep}
    raise AssertionError(kind)


MASK_KINDS = ["none", "attn_2d", "padding", "both", "per_head", "batch_1", "float01"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("attention", ["self", "cross"])
@pytest.mark.parametrize("mask_kind", MASK_KINDS)
def test_parity_with_nn_multihead_attention(dtype, attention, mask_kind) -> None:
    ref, ours = torch_and_ours(dtype)
    q, k, v = random_inputs(attention, dtype)
    batch, q_len, k_len = q.shape[0], q.shape[1], k.shape[1]
    mask, torch_kwargs = torch_masks(mask_kind, batch, q_len, k_len)
    tol = TOL[dtype]

    expected, expected_avg = ref(q, k, v, need_weights=True, **torch_kwargs)
    _, expected_heads = ref(q, k, v, need_weights=True, average_attn_weights=False, **torch_kwargs)
    out, weights = ours(q, k, v, mask, need_weights=True)
    assert out.shape == (batch, q_len, D_MODEL) and weights.shape == (batch, HEADS, q_len, k_len)
    torch.testing.assert_close(out, expected, atol=tol, rtol=tol)
    torch.testing.assert_close(weights.mean(dim=1), expected_avg, atol=tol, rtol=tol)
    torch.testing.assert_close(weights, expected_heads, atol=tol, rtol=tol)
    for backend in ("lib", "torch"):
        ours.backend = backend
        torch.testing.assert_close(ours(q, k, v, mask), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("backend", ["lib", "torch"])
@pytest.mark.parametrize("q_len,k_len", [(6, 6), (4, 7), (7, 4)])
def test_causal_parity(backend, q_len, k_len) -> None:
    ref, ours = torch_and_ours(torch.float64, backend=backend)
    q, k, v = random_inputs("cross", torch.float64, q_len=q_len, k_len=k_len)
    keep = causal_mask(q_len, k_len)
    expected, expected_w = ref(q, k, v, attn_mask=~keep)
    torch.testing.assert_close(ours(q, k, v, is_causal=True), expected, atol=1e-10, rtol=1e-10)
    out, w = ours(q, k, v, is_causal=True, need_weights=True)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(w.mean(1), expected_w, atol=1e-10, rtol=1e-10)
    # combined with a padding mask
    pad = padding_mask(torch.tensor([k_len, k_len - 1, k_len]), k_len)
    expected, _ = ref(q, k, v, attn_mask=~keep, key_padding_mask=~pad[:, 0, 0])
    torch.testing.assert_close(ours(q, k, v, pad, is_causal=True), expected, atol=1e-10, rtol=1e-10)


def test_no_bias_and_from_torch_copies() -> None:
    ref, ours = torch_and_ours(bias=False)
    assert ours.W_q.bias is None and ours.W_o.bias is None
    q, k, v = random_inputs("cross", torch.float32)
    torch.testing.assert_close(ours(q, k, v), ref(q, k, v)[0])
    ref, ours = torch_and_ours()
    d = D_MODEL
    assert torch.equal(ours.W_k.weight, ref.in_proj_weight[d : 2 * d])
    assert torch.equal(ours.W_v.bias, ref.in_proj_bias[2 * d :])
    assert torch.equal(ours.W_o.weight, ref.out_proj.weight)
    # a copy, not a view: changing ours leaves torch's module alone
    with torch.no_grad():
        ours.W_q.weight.zero_()
    assert ref.in_proj_weight[:d].abs().sum() > 0


def test_attributes_are_linear_layers() -> None:
    mha = MultiHeadAttention(D_MODEL, HEADS)
    for name in ("W_q", "W_k", "W_v", "W_o"):
        layer = getattr(mha, name)
        assert isinstance(layer, nn.Linear)
        assert (layer.in_features, layer.out_features) == (D_MODEL, D_MODEL)
    assert mha.d_k == D_MODEL // HEADS and mha.backend == "lib"
    assert not hasattr(mha, "d_head")  # one name for the head width: chapter 6's d_k
    assert "backend='lib'" in repr(mha)


def test_fused_self_attention_projection_equals_separate() -> None:
    _, ours = torch_and_ours(torch.float64)
    x, _, _ = random_inputs("self", torch.float64)
    fused, w_fused = ours(x, x, x, need_weights=True)
    separate, w_separate = ours(x, x.clone(), x.clone(), need_weights=True)
    torch.testing.assert_close(fused, separate, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(w_fused, w_separate, atol=1e-12, rtol=1e-12)


def test_heads_are_independent_slices() -> None:
    """Head h only uses rows h*d_k:(h+1)*d_k of W_q/W_k/W_v (the view+transpose split)."""
    _, ours = torch_and_ours(torch.float64)
    q, k, v = random_inputs("cross", torch.float64)
    _, weights = ours(q, k, v, need_weights=True)
    d_k = ours.d_k
    for h in range(HEADS):
        rows = slice(h * d_k, (h + 1) * d_k)
        qh = q @ ours.W_q.weight[rows].T + ours.W_q.bias[rows]
        kh = k @ ours.W_k.weight[rows].T + ours.W_k.bias[rows]
        vh = v @ ours.W_v.weight[rows].T + ours.W_v.bias[rows]
        _, wh = scaled_dot_product_attention(qh, kh, vh)
        torch.testing.assert_close(weights[:, h], wh)


@pytest.mark.parametrize("backend", ["lib", "torch"])
def test_fully_masked_rows_no_nan(backend) -> None:
    _, ours = torch_and_ours(torch.float64, backend=backend)
    q, k, v = (t.requires_grad_() for t in random_inputs("cross", torch.float64))
    mask = torch.ones(q.shape[0], 1, q.shape[1], k.shape[1], dtype=torch.bool)
    mask[0, 0, 2] = False
    mask[1] = False
    out = ours(q, k, v, mask)
    assert torch.isfinite(out).all()
    # a query with nothing to attend to gets a zero attention output, i.e. W_o's bias
    torch.testing.assert_close(out[0, 2], ours.W_o.bias)
    torch.testing.assert_close(out[1], ours.W_o.bias.expand(q.shape[1], -1))
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    assert all(torch.isfinite(p.grad).all() for p in ours.parameters())


@pytest.mark.parametrize("backend", ["lib", "torch"])
def test_dropout_only_in_train_mode(backend) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(D_MODEL, HEADS, dropout=0.5, backend=backend)
    plain = MultiHeadAttention(D_MODEL, HEADS, dropout=0.0)
    plain.load_state_dict(mha.state_dict())
    x, k, v = random_inputs("cross", torch.float32)
    mha.eval()
    state = torch.get_rng_state()
    torch.testing.assert_close(mha(x, k, v), plain(x, k, v))
    assert torch.equal(torch.get_rng_state(), state), "eval mode must not draw random numbers"
    _, clean = mha(x, k, v, need_weights=True)
    mha.train()
    assert not torch.allclose(mha(x, k, v), plain(x, k, v))
    _, weights = mha(x, k, v, need_weights=True)
    dropped = weights == 0
    assert dropped.any() and not dropped.all()
    # every weight that survives dropout is the clean weight rescaled by 1 / (1 - p)
    torch.testing.assert_close(weights[~dropped], clean[~dropped] / (1 - 0.5))


@settings(max_examples=15, deadline=None)
@given(
    seq_len=st.integers(2, 8), seed=st.integers(0, 2**16), backend=st.sampled_from(["lib", "torch"])
)
def test_self_attention_permutation_equivariant(seq_len: int, seed: int, backend: str) -> None:
    torch.manual_seed(seed)
    mha = MultiHeadAttention(D_MODEL, HEADS, backend=backend, dtype=torch.float64).eval()
    x = torch.randn(2, seq_len, D_MODEL, dtype=torch.float64)
    perm = torch.randperm(seq_len)
    out, w = mha(x, x, x, need_weights=True)
    out_p, w_p = mha(x[:, perm], x[:, perm], x[:, perm], need_weights=True)
    torch.testing.assert_close(mha(x[:, perm], x[:, perm], x[:, perm]), out[:, perm])
    torch.testing.assert_close(out_p, out[:, perm])
    torch.testing.assert_close(w_p, w[:, :, perm][:, :, :, perm])
    torch.testing.assert_close(w.sum(-1), torch.ones(2, HEADS, seq_len, dtype=torch.float64))


@pytest.mark.parametrize("backend", ["lib", "torch"])
def test_gradcheck_fp64(backend) -> None:
    torch.manual_seed(3)
    mha = MultiHeadAttention(4, 2, backend=backend, dtype=torch.float64).eval()
    q = torch.randn(2, 2, 4, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    mask = padding_mask([3, 1], 3)

    def fn(q, kv):
        return mha(q, kv, kv, mask, is_causal=True)

    assert torch.autograd.gradcheck(fn, (q, kv))
    # and with respect to the parameters (self-attention, fused projection)
    params = dict(mha.named_parameters())
    names = list(params)

    def fn_params(*values):
        out = torch.func.functional_call(mha, dict(zip(names, values)), (q, q, q))
        return out

    values = tuple(p.detach().requires_grad_() for p in params.values())
    assert torch.autograd.gradcheck(fn_params, values, fast_mode=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("backend", ["lib", "torch"])
def test_dtypes_and_devices(dtype, device, backend) -> None:
    ref, ours64 = torch_and_ours(torch.float64)
    q, k, v = random_inputs("cross", torch.float64)
    mask, torch_kwargs = torch_masks("both", q.shape[0], q.shape[1], k.shape[1])
    expected, _ = ref(q, k, v, **torch_kwargs)
    ours = ours64.to(device=device, dtype=dtype)
    ours.backend = backend
    out, w = ours(
        *(t.to(device=device, dtype=dtype) for t in (q, k, v)), mask.to(device), need_weights=True
    )
    assert out.dtype == w.dtype == dtype and out.device.type == device
    out_fast = ours(*(t.to(device=device, dtype=dtype) for t in (q, k, v)), mask.to(device))
    tol = 5e-2 if dtype == torch.bfloat16 else TOL[dtype] * 10
    torch.testing.assert_close(out.double().cpu(), expected, atol=tol, rtol=tol)
    torch.testing.assert_close(out_fast.double().cpu(), expected, atol=tol, rtol=tol)


X = torch.randn(2, 5, D_MODEL)
Y = torch.randn(2, 6, D_MODEL)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (
            {"d_model": 10, "num_heads": 4},
            ValueError,
            r"num_heads must divide d_model",
        ),
        ({"d_model": 16.0, "num_heads": 4}, TypeError, r"d_model must be an int >= 1, got float"),
        ({"d_model": 16, "num_heads": 0}, ValueError, r"num_heads must be an int >= 1, got 0"),
        (
            {"d_model": 16, "num_heads": 4, "dropout": 1.0},
            ValueError,
            r"dropout",
        ),
        (
            {"d_model": 16, "num_heads": 4, "dropout": "0"},
            TypeError,
            r"dropout",
        ),
        ({"d_model": 16, "num_heads": 4, "bias": 1}, TypeError, r"\bbias\b"),
        (
            {"d_model": 16, "num_heads": 4, "backend": "flash"},
            ValueError,
            r"\bbackend\b",
        ),
        (
            {"d_model": 16, "num_heads": 4, "backend": None},
            TypeError,
            r"\bbackend\b",
        ),
        (
            {"d_model": 16, "num_heads": 4, "block_size": 8},
            ValueError,
            r"backend \(with block_size\)",
        ),
        (
            {"d_model": 16, "num_heads": 4, "backend": "tiled", "block_size": 0},
            ValueError,
            r"block_size",
        ),
        (
            {"d_model": 16, "num_heads": 4, "backend": "tiled", "block_size": 2.0},
            TypeError,
            r"block_size",
        ),
    ],
)
def test_bad_constructor_args(kwargs, exc, match) -> None:
    with pytest.raises(exc, match=match):
        MultiHeadAttention(**kwargs)


MHA = MultiHeadAttention(D_MODEL, HEADS)


@pytest.mark.parametrize(
    "args,kwargs,exc,match",
    [
        ((X[0], X[0], X[0]), {}, ValueError, r"\bquery\b"),
        (
            (X, Y[..., :8], Y),
            {},
            ValueError,
            r"\bkey\b",
        ),
        ((X, Y, Y[:1]), {}, ValueError, r"batch size B"),
        (
            (X, Y, Y[:, :4]),
            {},
            ValueError,
            r"length Lk",
        ),
        (
            (X.long(), Y, Y),
            {},
            TypeError,
            r"\bquery\b",
        ),
        (
            (X.double(), Y.double(), Y.double()),
            {},
            TypeError,
            r"dtype",
        ),
        (
            (X, Y, Y, torch.ones(2, 5, 6, dtype=torch.bool)),
            {},
            ValueError,
            r"mask\[:, None\]",
        ),
        (
            (X, Y, Y, torch.ones(3, 1, 5, 6, dtype=torch.bool)),
            {},
            ValueError,
            r"mask .* broadcast",
        ),
        (
            (X, Y, Y, torch.ones(5, 5, dtype=torch.bool)),
            {},
            ValueError,
            r"mask .* broadcast",
        ),
        ((X, Y, Y, torch.full((5, 6), float("-inf"))), {}, ValueError, r"additive bias"),
        ((X, Y, Y), {"is_causal": 1}, TypeError, r"is_causal"),
        (
            (X, Y, Y),
            {"need_weights": None},
            TypeError,
            r"need_weights",
        ),
        ((X, Y, Y, torch.ones(5, 6, requires_grad=True)), {}, ValueError, r"mask requires grad"),
        (
            (X, Y, Y),
            {"kv_cache": {}},
            TypeError,
            r"kv_cache",
        ),
    ],
)
@pytest.mark.parametrize("backend", ["lib", "torch"])
def test_bad_forward_input(args, kwargs, exc, match, backend) -> None:
    MHA.backend = backend
    with pytest.raises(exc, match=match):
        MHA(*args, **kwargs)


def test_mismatched_devices() -> None:
    with pytest.raises(ValueError, match=r"same device, got .*key meta"):
        MHA(X, Y.to("meta"), Y)
    with pytest.raises(ValueError, match=r"device, got mask meta"):
        MHA(X, Y, Y, torch.ones(5, 6, dtype=torch.bool, device="meta"))


@pytest.mark.parametrize(
    "module,exc,match",
    [
        (nn.Linear(4, 4), TypeError, r"module must be a torch.nn.MultiheadAttention, got Linear"),
        (nn.MultiheadAttention(16, 4), ValueError, r"batch_first=True .* got batch_first=False"),
        (
            nn.MultiheadAttention(16, 4, batch_first=True, kdim=8, vdim=8),
            ValueError,
            r"kdim == vdim == embed_dim=16, got kdim=8 and vdim=8",
        ),
        (
            nn.MultiheadAttention(16, 4, batch_first=True, add_bias_kv=True),
            ValueError,
            r"add_bias_kv=False, got add_bias_kv=True",
        ),
        (
            nn.MultiheadAttention(16, 4, batch_first=True, add_zero_attn=True),
            ValueError,
            r"add_zero_attn=False, got add_zero_attn=True",
        ),
    ],
)
def test_from_torch_rejects(module, exc, match) -> None:
    with pytest.raises(exc, match=match):
        MultiHeadAttention.from_torch(module)


def test_from_torch_keeps_dropout_mode_and_backend() -> None:
    ref = nn.MultiheadAttention(16, 4, dropout=0.25, batch_first=True, dtype=torch.float64)
    ours = MultiHeadAttention.from_torch(ref, backend="torch")
    assert ours.training and ours.dropout == 0.25 and ours.backend == "torch"
    assert ours.W_q.weight.dtype == torch.float64
    assert not MultiHeadAttention.from_torch(ref.eval()).training


def test_backend_is_checked_when_assigned() -> None:
    mha = MultiHeadAttention(D_MODEL, HEADS)
    mha.backend = "torch"
    assert mha.backend == "torch"
    with pytest.raises(ValueError, match=r"\bbackend\b"):
        mha.backend = "nope"
    assert mha.backend == "torch"


@pytest.mark.parametrize("block_size", [4, (2, 8)])
def test_tiled_backend_block_size_reaches_tiled_attention(block_size, monkeypatch) -> None:
    from attention_lib import backends

    seen = []
    real = backends.BACKENDS["tiled"]

    def spy(*args, **kwargs):
        seen.append(kwargs.get("block_size"))
        return real(*args, **kwargs)

    monkeypatch.setitem(backends.BACKENDS, "tiled", spy)
    _, lib = torch_and_ours(torch.float64)
    tiled = MultiHeadAttention(
        D_MODEL, HEADS, backend="tiled", block_size=block_size, dtype=torch.float64
    ).eval()
    tiled.load_state_dict(lib.state_dict())
    q, k, v = random_inputs("cross", torch.float64)
    out = tiled(q, k, v, is_causal=True)
    expected_block = (block_size, block_size) if isinstance(block_size, int) else block_size
    assert seen == [expected_block] and tiled.block_size == expected_block
    torch.testing.assert_close(out, lib(q, k, v, is_causal=True), atol=1e-10, rtol=0)
    # without block_size the backend keeps its own default
    MultiHeadAttention(D_MODEL, HEADS, backend="tiled").eval()(
        *random_inputs("self", torch.float32)
    )
    assert seen[-1] is None


@pytest.mark.parametrize("backend", ["lib", "torch"])
def test_float16_overflow_before_scale_stays_finite(backend) -> None:
    # defect 2: q . k overflows float16 before the 1/sqrt(d_k) scale; torch's is finite.
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(256, 2, batch_first=True, dtype=torch.float16).eval()
    with torch.no_grad():
        ref.in_proj_weight.fill_(0.0)
        ref.in_proj_weight[:512].fill_(1.0 / 16)  # q = k = 30 in every feature of both heads
        ref.in_proj_weight[512:].copy_(torch.eye(256, dtype=torch.float16))
        ref.in_proj_bias.zero_()
    ours = MultiHeadAttention.from_torch(ref, backend=backend)
    x = torch.full((1, 4, 256), 1.875, dtype=torch.float16)  # 256 * 1.875 / 16 = 30
    expected, _ = ref(x, x, x, need_weights=False)
    assert expected.isfinite().all()
    out = ours(x, x, x)
    out_w, weights = ours(x, x, x, need_weights=True)
    assert out.isfinite().all() and out_w.isfinite().all() and weights.isfinite().all()
    torch.testing.assert_close(out, expected, atol=1e-2, rtol=1e-2)


def test_from_torch_reads_public_attributes_only() -> None:
    read = set()

    class Spy(nn.MultiheadAttention):
        def __getattribute__(self, name):
            read.add(name)
            return super().__getattribute__(name)

    module = Spy(16, 4, batch_first=True)
    read.clear()
    assert MultiHeadAttention.from_torch(module).d_model == 16
    private = {n for n in read if n.startswith("_") and not n.startswith("__")}
    # nn.Module's own storage of parameters and submodules is all it may touch
    assert private <= {"_parameters", "_buffers", "_modules"}, private
    assert {"kdim", "vdim", "embed_dim", "in_proj_weight"} <= read
