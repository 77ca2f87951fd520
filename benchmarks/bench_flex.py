"""Benchmark: FlexAttention eager and compiled against SDPA with the dense mask (chapter 20).

For a few of the book's masks (``attention_lib.flex``: causal, a sliding window,
packed documents) and lengths, times three ways of computing the same attention:

- ``sdpa, dense mask``: ``F.scaled_dot_product_attention`` with the dense
  keep-mask (``attention_lib.dense_mask``);
- ``flex, eager``: ``flex_attention`` outside ``torch.compile``, PyTorch's reference
  path, which computes every score;
- ``flex, compiled``: ``torch.compile(flex_attention)``, the fused kernel that skips
  the tiles the ``BlockMask`` skips.

B=1, H=4, d=64, float32, forward pass under ``torch.inference_mode()``, one
intra-op thread. Every round times every (mask, N, method) once, in a rotated
order, so that load from other processes spreads over all cases; the table gives
the median CPU time (``time.process_time``) over the rounds and the ratios of the
medians to ``sdpa, dense mask``. The first call of the compiled kernel for each
shape (the compilation, done in worker processes) is timed apart, by the wall
clock, and reported in its own column. Each output is checked against SDPA's.

Run: ``.venv/bin/python benchmarks/bench_flex.py`` (several minutes on a busy
2-core machine: most of it compiles), or ``--quick`` for a smoke run.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from attention_lib import dense_mask, document_ids, flex

HEADS, HEAD_DIM = 4, 64


def masks(n: int, window: int) -> dict[str, flex.MaskMod]:
    """The masks timed at length ``n``: causal, a window, documents of n/8 .. n/2."""
    quarter = n // 4
    return {
        "causal": flex.causal(),
        f"window {window}": flex.sliding_window(window),
        "documents": flex.document(
            document_ids([quarter, 2 * quarter, quarter // 2, quarter // 2])
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small sizes, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.window, args.rounds = [256, 512], 64, 2
    warnings.filterwarnings("ignore", message="flex_attention called without")
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    compiled = torch.compile(flex_attention, dynamic=False)
    cases: dict[tuple[str, int], tuple[Tensor, ...]] = {}
    blocks, dense, first_compile = {}, {}, {}
    for n in args.sizes:
        qkv = tuple(torch.randn(1, HEADS, n, HEAD_DIM, generator=gen) for _ in range(3))
        for name, mod in masks(n, args.window).items():
            cases[(name, n)] = qkv
            blocks[(name, n)] = create_block_mask(mod, None, None, n, n, device="cpu")
            dense[(name, n)] = dense_mask(mod, n)
    methods: dict[str, Callable[[tuple[str, int]], Tensor]] = {
        "sdpa, dense mask": lambda c: F.scaled_dot_product_attention(*cases[c], attn_mask=dense[c]),
        "flex, eager": lambda c: flex_attention(*cases[c], block_mask=blocks[c]),
        "flex, compiled": lambda c: compiled(*cases[c], block_mask=blocks[c]),
    }
    times: dict[tuple[str, tuple[str, int]], list[float]] = {}
    with torch.inference_mode():
        for case in cases:  # warm-up: the compilations, and the outputs agree
            reference = methods["sdpa, dense mask"](case)
            for method, call in methods.items():
                start = time.perf_counter()
                out = call(case)
                if method == "flex, compiled":
                    first_compile[case] = time.perf_counter() - start
                assert (out - reference).abs().max() < 1e-4, (method, case)
        order = [(m, c) for c in cases for m in methods]
        for r in range(args.rounds):
            shift = (r * 7) % len(order)
            for method, case in order[shift:] + order[:shift]:  # rotated order
                start = time.process_time()
                methods[method](case)
                times.setdefault((method, case), []).append(time.process_time() - start)

    print(
        f"B=1, H={HEADS}, d={HEAD_DIM}, float32, 1 thread, CPU seconds, median of "
        f"{args.rounds} interleaved rounds; first compile by the wall clock"
    )
    print(
        f"{'mask':>12} {'N':>6} {'skipped':>8} {'sdpa (s)':>9} {'eager (s)':>10} "
        f"{'compiled (s)':>13} {'eager/sdpa':>11} {'compiled/sdpa':>14} {'compile (s)':>12}"
    )
    for case in cases:
        name, n = case
        sdpa, eager, fused = (statistics.median(times[(m, case)]) for m in methods)
        skipped = blocks[case].sparsity() / 100
        print(
            f"{name:>12} {n:>6} {skipped:>8.2f} {sdpa:>9.4f} {eager:>10.4f} {fused:>13.4f} "
            f"{eager / sdpa:>11.2f} {fused / sdpa:>14.2f} {first_compile[case]:>12.1f}"
        )


if __name__ == "__main__":
    main()
