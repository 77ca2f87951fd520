"""Half precision in attention_lib.linear_attention and GatedDeltaNet (issue 33 item 3).

float16 and bfloat16 inputs are computed in float32 and rounded back once, so
the output is as close to the exact answer (float64 on the same rounded
inputs) as rounding that exact answer once: a float16 state summed over 256
tokens lost ~10x that (recurrent linear attention: 1.96e-3 of the output's
RMS, the gated delta rule 1.06e-3, against 2.1e-4 for one rounding). Also:
fla's calling convention (float16 q, k, v with float32 g, beta, state).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attention_lib.gated_deltanet import GatedDeltaNet, LayerStateCache
from attention_lib.linear_attention import gated_delta_rule, linear_attention

HALF = [torch.float16, torch.bfloat16]
#: the largest error allowed, relative to the output's RMS: a little above one
#: rounding of the exact output (measured 2.1e-4 for float16, 1.7e-3 for bfloat16)
BOUND = {torch.float16: 3e-4, torch.bfloat16: 2.5e-3}

gen = torch.Generator().manual_seed(0)
B, H, L, D = 2, 4, 256, 64
Q, K, V = torch.randn(3, B, H, L, D, generator=gen).unbind(0)
G = -0.1 * torch.rand(B, H, L, generator=gen)  # (B, H, L) log-decay
BETA = torch.rand(B, H, L, generator=gen)
STATE = 0.1 * torch.randn(B, H, D, D, generator=gen)  # (B, H, d_k, d_v)


def rel_rms(x: torch.Tensor, exact: torch.Tensor) -> float:
    """RMS of ``x - exact`` over the RMS of ``exact``."""
    return ((x.double() - exact).pow(2).mean().sqrt() / exact.pow(2).mean().sqrt()).item()


def check_rounded_once(out: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype) -> None:
    """``out`` (in ``dtype``) is within the bound, and within 1.25x of rounding
    the exact answer to ``dtype`` once."""
    assert out.dtype == dtype
    error, once = rel_rms(out, exact), rel_rms(exact.to(dtype), exact)
    assert error < BOUND[dtype], f"{error:.2e} >= {BOUND[dtype]:.0e}"
    assert error < 1.25 * once, f"{error:.2e}: not one rounding ({once:.2e})"


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("feature_map", ["elu+1", "identity"])
@pytest.mark.parametrize("schedule", ["quadratic", "chunked", "recurrent"])
def test_linear_attention_in_half_precision_rounds_once(dtype, feature_map, schedule) -> None:
    q, k, v = (t.to(dtype) for t in (Q, K, V))
    exact = linear_attention(q.double(), k.double(), v.double(), feature_map=feature_map)
    out = linear_attention(q, k, v, feature_map=feature_map, schedule=schedule)
    check_rounded_once(out, exact, dtype)


def unit_keys(dtype):
    return Q.to(dtype), F.normalize(K, dim=-1).to(dtype), V.to(dtype)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("chunk_size", [None, 16, 64])
def test_gated_delta_rule_in_half_precision_rounds_once(dtype, chunk_size) -> None:
    q, k, v = unit_keys(dtype)
    g, beta, state = G.to(dtype), BETA.to(dtype), STATE.to(dtype)
    exact, exact_state = gated_delta_rule(
        *(t.double() for t in (q, k, v, g, beta)), initial_state=state.double(),
        output_final_state=True,
    )  # fmt: skip
    out, final = gated_delta_rule(
        q, k, v, g, beta, chunk_size=chunk_size, initial_state=state, output_final_state=True
    )  # every input in half precision (the chunked form's triangular solve too)
    check_rounded_once(out, exact, dtype)
    assert final.dtype == torch.float32  # the state keeps float32's digits, as fla's does
    assert rel_rms(final, exact_state) < 1e-5


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("chunk_size", [None, 64])
def test_gated_delta_rule_takes_fla_float32_gates_and_state(dtype, chunk_size) -> None:
    q, k, v = unit_keys(dtype)  # flash-linear-attention: half q, k, v; float32 g, beta, state
    exact = gated_delta_rule(
        *(t.double() for t in (q, k, v, G, BETA)), initial_state=STATE.double()
    )
    for given in ({"g": G}, {"beta": BETA}, {"initial_state": STATE}):
        args = {"g": G.to(dtype), "beta": BETA.to(dtype), "initial_state": STATE.to(dtype)}
        args.update(given)  # one of them float32, the others half
        out = gated_delta_rule(q, k, v, chunk_size=chunk_size, **args)
        assert out.dtype == dtype
    out = gated_delta_rule(q, k, v, G, BETA, chunk_size=chunk_size, initial_state=STATE)
    check_rounded_once(out, exact, dtype)


def test_gated_delta_rule_names_an_argument_on_another_device() -> None:
    q, k, v = unit_keys(torch.float32)
    for name in ("g", "beta", "initial_state"):
        args = {"g": G, "beta": BETA, "initial_state": STATE}
        args[name] = torch.empty_like(args[name], device="meta")
        with pytest.raises(ValueError, match=f"same device, got query cpu.* {name} meta"):
            gated_delta_rule(q, k, v, **args)


@pytest.mark.parametrize("dtype", HALF)
def test_the_layer_continues_from_its_cache_in_half_precision(dtype) -> None:
    torch.manual_seed(3)
    layer = GatedDeltaNet(32, 4, chunk_size=8).eval().to(dtype)
    x = torch.randn(2, 20, 32).to(dtype)
    cache = LayerStateCache()
    with torch.no_grad():
        whole = layer(x)
        parts = [layer(x[:, :12], kv_cache=cache)]  # prefill 12, then one token at a time
        parts += [layer(x[:, t : t + 1], kv_cache=cache) for t in range(12, 20)]
    assert cache.state.dtype == torch.float32
    assert rel_rms(torch.cat(parts, dim=1), whole.double()) < 4 * BOUND[dtype]
    with pytest.raises(ValueError, match="kv_cache"):  # a float32 x cannot continue it
        layer.float()(torch.randn(3, 1, 32), kv_cache=cache)
