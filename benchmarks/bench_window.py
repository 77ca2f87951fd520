"""Benchmark: sliding-window tiled attention grows linearly in N (chapter 11; windows in chapter 10).

Target: ``tiled_attention(..., is_causal=True, window=256)`` takes about twice
as long each time N doubles (N = 2048 ... 16384), where plain causal attention
(the same kernel without a window, and ``F.scaled_dot_product_attention`` with
the window as a mask) takes about four times as long. B=1, H=4, d=64,
float32, forward pass under ``torch.inference_mode()``, one intra-op thread.

Everything is measured in this one process, in interleaved rounds: every round
times every (method, N) once, in a rotated order, so that a burst of load from
other processes on a shared machine spreads over all cases instead of
spoiling one. The table gives the median over the rounds, and the ratio of
the medians of consecutive sizes (the "per doubling" columns). CPU time
(``time.process_time``) is reported, because other processes hardly disturb it.

``F.scaled_dot_product_attention`` with a window mask needs the ``(N, N)``
mask and scores, so it stops at N = 8192 by default (``--sdpa-max``).

Run: ``.venv/bin/python benchmarks/bench_window.py`` (about 2-4 minutes on a
busy 2-core machine), or ``--quick`` for a smoke run (seconds).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from attention_lib import tiled_attention

HEADS, HEAD_DIM = 4, 64


def window_mask(n: int, window: int) -> Tensor:
    """Keep-mask (N, N): query i sees keys i - window < j <= i."""
    i = torch.arange(n)[:, None]
    j = torch.arange(n)
    return (j <= i) & (j > i - window)


def methods(window: int, sdpa_max: int) -> dict[str, tuple[Callable[..., Tensor], int]]:
    """name -> (call(q, k, v, keep), largest N it runs at)."""
    return {
        f"tiled, window {window}": (
            lambda q, k, v, keep: tiled_attention(q, k, v, is_causal=True, window=window),
            1 << 62,
        ),
        "tiled, causal": (lambda q, k, v, keep: tiled_attention(q, k, v, is_causal=True), 1 << 62),
        f"F.sdpa, window {window} mask": (
            lambda q, k, v, keep: F.scaled_dot_product_attention(q, k, v, attn_mask=keep),
            sdpa_max,
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sdpa-max", type=int, default=8192)
    parser.add_argument("--causal-max", type=int, default=16384)
    parser.add_argument("--quick", action="store_true", help="small sizes, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.window, args.rounds = [256, 512, 1024], 32, 2
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    data = {
        n: tuple(torch.randn(1, HEADS, n, HEAD_DIM, generator=gen) for _ in range(3))
        for n in args.sizes
    }
    table = methods(args.window, args.sdpa_max)
    limits = {name: limit for name, (_, limit) in table.items()}
    limits["tiled, causal"] = args.causal_max
    cases = [(name, n) for name in table for n in args.sizes if n <= limits[name]]
    times: dict[tuple[str, int], list[float]] = {case: [] for case in cases}

    with torch.inference_mode():
        for name, n in cases:  # warm-up, and the outputs agree
            q, k, v = data[n]
            keep = window_mask(n, args.window) if name.startswith("F.sdpa") else None
            table[name][0](q, k, v, keep)
        for r in range(args.rounds):
            shift = r % len(cases)
            for name, n in cases[shift:] + cases[:shift]:  # rotated order
                q, k, v = data[n]
                keep = window_mask(n, args.window) if name.startswith("F.sdpa") else None
                start = time.process_time()
                table[name][0](q, k, v, keep)
                times[(name, n)].append(time.process_time() - start)

    print(f"B=1, H={HEADS}, d={HEAD_DIM}, float32, 1 thread, CPU seconds, median of "
          f"{args.rounds} interleaved rounds")
    header = f"{'N':>6} " + " ".join(f"{name:>24}" for name in table)
    print(header)
    print(" " * 7 + " ".join(f"{'time (s)  per doubling':>24}" for _ in table))
    for i, n in enumerate(args.sizes):
        cells = []
        for name in table:
            if (name, n) not in times:
                cells.append(f"{'-':>24}")
                continue
            median = statistics.median(times[(name, n)])
            ratio = ""
            if i and (name, args.sizes[i - 1]) in times:
                ratio = f"x{median / statistics.median(times[(name, args.sizes[i - 1])]):.2f}"
            cells.append(f"{median:>10.3f}  {ratio:>12}")
        print(f"{n:>6} " + " ".join(cells))


if __name__ == "__main__":
    main()
