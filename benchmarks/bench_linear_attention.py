"""Linear attention and the gated delta rule: one operator, three schedules (chapter 18).

Times ``linear_attention`` (quadratic, chunked, recurrent) and ``gated_delta_rule``
(one chunk = the quadratic form, chunks of 64, token by token) on one sequence of N
tokens, and prints each schedule's time divided by the chunked schedule's, measured
side by side: every round calls every schedule once, in a rotating order, on one
thread, by CPU time (``time.process_time``); the tables report medians over rounds.
Also prints the peak tensor memory of one call (``attention_lib.TensorMemory``).

Usage::

    python benchmarks/bench_linear_attention.py            # N = 512, 1024, 2048; 5 rounds
    python benchmarks/bench_linear_attention.py --quick    # N = 256, 512, 2 rounds
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from attention_lib import TensorMemory, gated_delta_rule, linear_attention

B, H, D, CHUNK = 1, 4, 32, 64


def inputs(n: int):
    gen = torch.Generator().manual_seed(n)
    q, k, v = torch.randn(3, B, H, n, D, generator=gen)
    g = -F.softplus(torch.randn(B, H, n, generator=gen))
    beta = torch.rand(B, H, n, generator=gen)
    return q, F.normalize(k, dim=-1), v, g, beta


def cases(n: int) -> dict:
    q, k, v, g, beta = inputs(n)
    return {
        "linear, quadratic": lambda: linear_attention(q, k, v),
        "linear, chunked": lambda: linear_attention(q, k, v, schedule="chunked", chunk_size=CHUNK),
        "linear, recurrent": lambda: linear_attention(q, k, v, schedule="recurrent"),
        "delta, one chunk": lambda: gated_delta_rule(q, k, v, g, beta, chunk_size=n),
        "delta, chunked": lambda: gated_delta_rule(q, k, v, g, beta, chunk_size=CHUNK),
        "delta, recurrent": lambda: gated_delta_rule(q, k, v, g, beta),
    }


def cpu_time(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sizes = [256, 512] if args.quick else [512, 1024, 2048]
    rounds = 2 if args.quick else args.rounds
    torch.set_num_threads(1)
    print(f"B={B}, H={H}, d={D}, chunk {CHUNK}, float32, 1 thread, CPU time, {rounds} rounds")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    times: dict[int, dict[str, list[float]]] = {}
    with torch.inference_mode():
        for n in sizes:
            for fn in cases(n).values():
                fn()  # warm-up
        for r in range(rounds):
            for n in sizes:
                calls = list(cases(n).items())
                calls = calls[r % len(calls) :] + calls[: r % len(calls)]  # rotate
                for name, fn in calls:
                    times.setdefault(n, {}).setdefault(name, []).append(cpu_time(fn))
    names = list(cases(sizes[0]))
    print("\nmedian time (ms), and / the chunked schedule of the same operator")
    print(f"{'N':>6}" + "".join(f"{name:>22}" for name in names))
    for n in sizes:
        med = {name: statistics.median(times[n][name]) for name in names}
        row = []
        for name in names:
            base = med["linear, chunked" if name.startswith("linear") else "delta, chunked"]
            row.append(f"{med[name] * 1e3:10.1f} ({med[name] / base:5.2f}x)")
        print(f"{n:6d}" + "".join(f"{cell:>22}" for cell in row))
    print("\npeak tensor memory of one call (MiB)")
    print(f"{'N':>6}" + "".join(f"{name:>22}" for name in names))
    for n in sizes:
        row = []
        for fn in cases(n).values():
            with torch.inference_mode(), TensorMemory() as memory:
                fn()
            row.append(memory.peak_mib)
        print(f"{n:6d}" + "".join(f"{mib:22.2f}" for mib in row))


if __name__ == "__main__":
    main()
