"""Benchmark: attention_lib.MultiHeadAttention vs torch.nn.MultiheadAttention.

Forward pass of self-attention at d_model=512, 8 heads, L=512, B=8 (the issue's
setting), under ``torch.inference_mode()`` with ``need_weights=False``. The
candidates are timed interleaved (one call of each per round, in a rotating
order) so that machine noise hits all of them alike; the table shows the median
per candidate and its ratio to ``nn.MultiheadAttention`` measured in the same run
(``ratio`` = ratio of medians, ``paired`` = median of the per-round ratios).

Target: ``MultiHeadAttention(backend="torch")`` ratio <= 1.0. The lib backend
(which materialises the weights) is shown for information.

Run: ``.venv/bin/python benchmarks/bench_mha.py [--rounds N] [--d-model ...]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor, nn

from attention_lib import MultiHeadAttention


def time_interleaved(
    candidates: dict[str, Callable[[], Tensor]], rounds: int, warmup: int
) -> dict[str, list[float]]:
    """Run every candidate once per round (rotating the order); return seconds per call."""
    names = list(candidates)
    for _ in range(warmup):
        for name in names:
            candidates[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            start = time.perf_counter()
            candidates[name]()
            times[name].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    reference = nn.MultiheadAttention(args.d_model, args.heads, batch_first=True).eval()
    ours_torch = MultiHeadAttention.from_torch(reference, backend="torch").eval()
    ours_lib = MultiHeadAttention.from_torch(reference, backend="lib").eval()
    x = torch.randn(args.batch, args.length, args.d_model)

    with torch.inference_mode():
        expected = reference(x, x, x, need_weights=False)[0]
        for name, module in (("torch", ours_torch), ("lib", ours_lib)):
            torch.testing.assert_close(module(x, x, x), expected, atol=1e-4, rtol=1e-4,
                                       msg=lambda m, n=name: f"backend {n}: {m}")
        candidates: dict[str, Callable[[], Tensor]] = {
            "nn.MultiheadAttention": lambda: reference(x, x, x, need_weights=False)[0],
            'MultiHeadAttention(backend="torch")': lambda: ours_torch(x, x, x),
            'MultiHeadAttention(backend="lib")': lambda: ours_lib(x, x, x),
        }
        times = time_interleaved(candidates, args.rounds, args.warmup)

    base = statistics.median(times["nn.MultiheadAttention"])
    print(
        f"MHA forward, self-attention, d_model={args.d_model}, heads={args.heads}, "
        f"L={args.length}, B={args.batch}, inference_mode, need_weights=False, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{args.rounds} interleaved rounds"
    )
    base_times = times["nn.MultiheadAttention"]
    print(f"{'candidate':<38} {'median ms':>10} {'min ms':>8} {'ratio':>7} {'paired':>7}")
    for name, ts in times.items():
        med = statistics.median(ts)
        # paired: median over rounds of (this call / the reference call of the same round)
        paired = statistics.median(t / b for t, b in zip(ts, base_times))
        print(f"{name:<38} {med * 1e3:>10.2f} {min(ts) * 1e3:>8.2f} {med / base:>7.3f} {paired:>7.3f}")
    ratio = statistics.median(times['MultiHeadAttention(backend="torch")']) / base
    verdict = "OK" if ratio <= 1.0 else "TOO SLOW"
    print(f'target: MultiHeadAttention(backend="torch") / nn.MultiheadAttention = '
          f"{ratio:.3f} <= 1.0  -> {verdict}")


if __name__ == "__main__":
    main()
