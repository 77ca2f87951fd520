"""Tests for attention_lib.distributed: ring attention and Ulysses on torch.distributed.

Oracle: ``F.scaled_dot_product_attention`` and autograd in one process, on the
whole sequence. The distributed runs are real: ``launch`` spawns 4 processes in
a gloo group on 127.0.0.1 once for the whole file, and every case runs in it
(P = 4 on the whole group, P = 2 on the subgroup of ranks 0 and 1), so the
file pays for one start-up. The byte counts are checked against the sizes of
the shards, derived here independently of the library.
"""

from __future__ import annotations

import itertools
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.multiprocessing import ProcessRaisedException

from attention_lib import distributed as D
from attention_lib.distributed import (
    Case,
    launch,
    ring_attention,
    ring_blocks_per_rank,
    run_cases,
    ulysses_attention,
    zigzag_merge,
    zigzag_split,
)

ROOT = Path(__file__).resolve().parents[2]
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}
SHAPE = (2, 4, 32, 8)  # (B, H, N, D): N divisible by 2P for P = 2, 4; H by P
METHODS = [("ring", "contiguous"), ("ring", "zigzag"), ("ulysses", "contiguous")]

PARITY = [
    Case(method, SHAPE, causal, layout, dtype, seed=i, world_size=p)
    for i, (p, (method, layout), causal, dtype) in enumerate(
        itertools.product((2, 4), METHODS, (False, True), (torch.float64, torch.float32))
    )
]
ALLGATHER = [
    Case("allgather", SHAPE, causal, world_size=p) for p in (2, 4) for causal in (False, True)
]
REFUSED = [
    Case("ring", (1, 4, 30, 8), world_size=4),  # N = 30: shard lengths 8, 8, 7, 7
    Case("ulysses", (1, 4, 30, 8), True, world_size=4),
    Case("ulysses", (1, 6, 32, 8), world_size=4),  # H = 6 heads over 4 ranks
    Case("ring", (1, 4, 12, 8), layout="contiguous", world_size=4),  # fine: the group goes on
]
HALF = [Case(m, SHAPE, True, lay, torch.bfloat16, world_size=4) for m, lay in METHODS]
# Ulysses x ring on a 2 x 2 grid of the 4 ranks: rows of U = 2, rings of R = 2
USP = [
    Case("usp", SHAPE, causal, dtype=dtype, seed=100 + i)
    for i, (causal, dtype) in enumerate(
        itertools.product((False, True), (torch.float64, torch.float32))
    )
]
USP_REFUSED = Case("usp", (1, 3, 32, 8))  # H = 3 heads over rows of 2
CASES = PARITY + ALLGATHER + REFUSED + HALF + USP + [USP_REFUSED]


@pytest.fixture(scope="module")
def runs():
    """Every case, run once in one spawned group of 4: ``{case: per-rank results}``."""
    per_rank = launch(run_cases, 4, CASES, timeout=240.0)
    return {case: [r[i] for r in per_rank] for i, case in enumerate(CASES)}


def _ranks(results):
    return [r for r in results if r is not None]


# --------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("case", PARITY + ALLGATHER, ids=str)
def test_gathered_output_and_gradients_equal_one_process_sdpa(runs, case):
    ranks = _ranks(runs[case])
    assert len(ranks) == case.world_size
    got = D.gather(case, ranks)
    q, k, v, g = case.inputs()
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=case.is_causal)
    want_grads = torch.autograd.grad(want, (q, k, v), g)
    for name, expected in zip(("out", "dq", "dk", "dv"), (want, *want_grads)):
        assert got[name].shape == expected.shape
        torch.testing.assert_close(got[name], expected.detach(), rtol=0, atol=TOL[case.dtype])


@pytest.mark.parametrize("case", HALF, ids=str)
def test_bfloat16_shards_are_computed_in_float32_and_cast_back(runs, case):
    got = D.gather(case, _ranks(runs[case]))
    q, k, v, _ = (t.double() for t in case.inputs())
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert got["out"].dtype == torch.bfloat16
    # one bfloat16 rounding of the output (8 bits of mantissa), not an accumulation in it
    torch.testing.assert_close(got["out"].double(), want, rtol=2**-8, atol=2**-8)


def test_the_distributed_result_is_not_one_of_its_shards(runs):
    # The check above could pass if each rank attended only to its own shard:
    # without communication, the output would differ from the oracle.
    case = PARITY[0]
    q, k, v, _ = case.inputs()
    local = torch.cat(
        [F.scaled_dot_product_attention(*(t.chunk(2, 2)[r] for t in (q, k, v))) for r in (0, 1)],
        dim=2,
    )
    assert (D.gather(case, _ranks(runs[case]))["out"] - local).abs().max() > 0.1


# --------------------------------------------------------------------------- communication


def _shard_bytes(case):
    b, h, n, d = case.shape
    return b * h * (n // case.world_size) * d * torch.empty((), dtype=case.dtype).element_size()


@pytest.mark.parametrize("case", PARITY + ALLGATHER, ids=str)
def test_bytes_sent_per_rank(runs, case):
    p, s = case.world_size, _shard_bytes(case)
    forward = {
        "ring": 2 * (p - 1) * s,  # K and V shards, P - 1 hops
        "ulysses": 4 * (p - 1) * s // p,  # (P - 1) / P of Q, K, V and of the output
        "allgather": 2 * (p - 1) * s,  # my K and V shards to every other rank
    }[case.method]
    backward = {
        "ring": 2 * (p - 1) * s + 2 * p * s,  # K, V again; dK, dV P hops (home)
        "ulysses": 4 * (p - 1) * s // p,  # the same all-to-alls, reversed
        "allgather": 2 * (p - 1) * s,  # each rank's dK, dV pieces to their owners
    }[case.method]
    for result in _ranks(runs[case]):
        assert result["forward"].bytes_sent == forward
        assert result["total"].bytes_sent - result["forward"].bytes_sent == backward


@pytest.mark.parametrize("case", USP, ids=str)
def test_ulysses_times_ring_on_a_2x2_grid_equals_one_process_sdpa(runs, case):
    ranks = _ranks(runs[case])
    assert len(ranks) == 4 and "error" not in ranks[0]
    got, want = D.gather(case, ranks), D.reference(case)
    for name in ("out", "dq", "dk", "dv"):
        assert (got[name] - want[name]).abs().max() < TOL[case.dtype], name


@pytest.mark.parametrize("case", USP, ids=str)
def test_ulysses_times_ring_bytes_sent_per_rank(runs, case):
    b, h, n, d = case.shape
    u, r = 2, 2  # the grid: rows (Ulysses) of U, columns (rings) of R
    s = b * h * (n // (u * r)) * d * torch.empty((), dtype=case.dtype).element_size()
    forward = 4 * (u - 1) * s // u + 2 * (r - 1) * s  # row all-to-alls + the column's ring
    backward = 4 * (u - 1) * s // u + 2 * (r - 1) * s + 2 * r * s
    for result in _ranks(runs[case]):
        assert result["forward"].bytes_sent == forward
        assert result["total"].bytes_sent - result["forward"].bytes_sent == backward
    p = u * r  # between Ulysses' and the ring's forward bytes on the same 4 ranks
    assert 4 * (p - 1) * s // p < forward < 2 * (p - 1) * s


def test_ulysses_times_ring_refuses_heads_not_divisible_by_the_row_on_every_rank(runs):
    errors = [r["error"] for r in runs[USP_REFUSED]]
    assert len(errors) == 4 and len(set(errors)) == 1
    assert "H must be divisible by P = 2, got H = 3" in errors[0]


def test_ulysses_sends_less_than_the_ring_and_falls_with_p(runs):
    def sent(method, p):
        (case,) = [
            c
            for c in PARITY
            if (c.method, c.world_size, c.dtype, c.layout)
            == (method, p, torch.float64, "contiguous")
            and not c.is_causal
        ]
        return runs[case][0]["forward"].bytes_sent

    assert sent("ulysses", 2) == sent("ring", 2)  # 2 shards either way at P = 2
    assert sent("ulysses", 4) < sent("ring", 4)
    # at a fixed N, ring traffic per rank grows as (P - 1) / P, Ulysses' falls as (P - 1) / P^2
    assert sent("ring", 4) / sent("ring", 2) == pytest.approx((3 / 4) / (1 / 2))
    assert sent("ulysses", 4) / sent("ulysses", 2) == pytest.approx((3 / 16) / (1 / 4))


# --------------------------------------------------------------------------- memory and work


def test_peak_kv_memory_per_rank_falls_as_one_over_p(runs):
    def peak(method, p, layout="contiguous"):
        (case,) = [c for c in CASES if (c.method, c.world_size, c.layout) == (method, p, layout)
                   and c.is_causal and c.dtype == torch.float64 and c.shape == SHAPE]  # fmt: skip
        results = _ranks(runs[case])
        return {r["forward"].peak_kv_bytes for r in results}, {
            r["total"].peak_kv_bytes for r in results
        }

    s2 = _shard_bytes(Case(shape=SHAPE, world_size=2))
    fwd2, total2 = peak("ring", 2)
    fwd4, total4 = peak("ring", 4)
    assert fwd2 == {4 * s2}  # its K, V block and the next one arriving
    assert total2 == {8 * s2}  # ... and, backward, their dK, dV
    assert fwd4 == {4 * s2 // 2} and total4 == {8 * s2 // 2}  # half of it at twice the ranks
    # gathering first holds the whole sequence's K and V on every rank, whatever P
    full = 2 * 2 * s2
    assert peak("allgather", 2)[0] == peak("allgather", 4)[0] == {full}


def test_measured_peak_memory_of_the_ring_falls_with_p_and_gathering_first_does_not(runs):
    # Chapter 11's TensorMemory sees every tensor the forward pass allocates, not
    # only the K/V blocks that CommStats counts.
    def peak(method, layout, p):
        (case,) = [c for c in CASES if (c.method, c.layout, c.world_size) == (method, layout, p)
                   and c.is_causal and c.dtype == torch.float64 and c.shape == SHAPE]  # fmt: skip
        return max(r["peak_bytes"] for r in _ranks(runs[case]))

    whole_kv = 2 * math.prod(SHAPE) * 8  # the whole sequence's K and V, float64
    for layout in ("contiguous", "zigzag"):
        assert peak("ring", layout, 4) < 0.65 * peak("ring", layout, 2)
    for p in (2, 4):
        assert peak("allgather", "contiguous", p) >= whole_kv
    assert peak("allgather", "contiguous", 4) > 1.5 * peak("ring", "contiguous", 4)


def test_blocks_computed_per_rank(runs):
    assert ring_blocks_per_rank(4, is_causal=True) == [1, 2, 3, 4]  # rank r does r + 1
    assert ring_blocks_per_rank(4, is_causal=True, layout="zigzag") == [2.25] * 4
    assert ring_blocks_per_rank(3, is_causal=False, layout="zigzag") == [3] * 3
    for case in PARITY:
        if case.method == "ring":
            want = ring_blocks_per_rank(
                case.world_size, is_causal=case.is_causal, layout=case.layout
            )
            assert [r["forward"].blocks for r in _ranks(runs[case])] == want


# --------------------------------------------------------------------------- refusals


def test_uneven_split_and_indivisible_heads_are_refused_on_every_rank(runs):
    uneven_ring, uneven_ulysses, heads, after = (runs[c] for c in REFUSED)
    for results in (uneven_ring, uneven_ulysses):
        messages = {r["error"] for r in results}
        assert len(messages) == 1  # every rank, the same message
        (message,) = messages
        assert message.startswith("ValueError") and "divisible by P = 4" in message
        assert "[8, 8, 7, 7]" in message
    (message,) = {r["error"] for r in heads}
    assert len(heads) == 4 and "H = 6" in message and "divisible by P" in message
    # the group did not hang or break: the next case ran on every rank
    assert all("out" in r for r in after)


def test_local_checks_and_layout_helpers():
    x = torch.arange(16.0).reshape(1, 1, 16, 1)
    shards = zigzag_split(x, 4)
    assert [s.flatten().tolist() for s in shards[:2]] == [[0, 1, 14, 15], [2, 3, 12, 13]]
    assert torch.equal(zigzag_merge(shards), x)
    with pytest.raises(ValueError, match="world_size"):
        zigzag_split(torch.zeros(1, 1, 12, 1), 4)
    with pytest.raises(ValueError, match="shards"):
        zigzag_merge([torch.zeros(1, 1, 3, 1)])
    with pytest.raises(TypeError, match="query"):
        ring_attention("q", x, x)
    with pytest.raises(ValueError, match="query"):
        ulysses_attention(x[0], x[0], x[0])
    with pytest.raises(ValueError, match="layout"):
        ring_blocks_per_rank(2, layout="striped")


# --------------------------------------------------------------------------- launching


def test_a_worker_that_hangs_is_stopped_by_the_timeout():
    start = time.monotonic()
    # the worker sleeps for 10 minutes: whatever the load, 3 s cannot be enough
    with pytest.raises(TimeoutError, match="timeout=3 s"):
        launch(time.sleep, 1, 600, timeout=3.0)
    assert time.monotonic() - start < 60


def test_an_error_in_a_worker_reaches_the_caller():
    with pytest.raises(ProcessRaisedException, match="world_size"):
        launch(zigzag_split, 1, torch.zeros(4), "two", timeout=60.0)


@pytest.mark.skipif(shutil.which("torchrun", path=os.path.dirname(sys.executable)) is None,
                    reason="no torchrun next to this Python")  # fmt: skip
def test_the_command_line_entry_under_torchrun():
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    port = str(D.free_port())
    command = [torchrun, "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", port, "-m", "attention_lib.distributed"]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=180, cwd=ROOT, env=env
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "P = 2, backend gloo" in result.stdout
    assert "all exact" in result.stdout
    assert len(result.stdout.splitlines()) == len(D.torchrun_cases(2)) + 2  # a line per case


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (NCCL)")
def test_nccl_on_gpus():
    cases = [Case("ring", SHAPE, True, "zigzag"), Case("ulysses", SHAPE, True)]
    per_rank = launch(run_cases, 2, cases, backend="nccl", timeout=240.0)
    for i, case in enumerate(cases):
        got, want = D.gather(case, [r[i] for r in per_rank]), D.reference(case)
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=0, atol=TOL[case.dtype])
