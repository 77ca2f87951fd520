"""Benchmark: peak memory of grouped-query attention vs plain multi-head attention.

Issue 21, defect 3: on the ``"torch"`` backend, grouped-query attention (GQA)
took about 7x the memory of multi-head attention (MHA) with the same query
heads, growing as N^2, because the heads reach ``F.scaled_dot_product_attention``
as 5-D tensors ``(B, H_kv, G, N, d_k)``, which sends PyTorch to its math path
(it builds the ``(N, N)`` scores). Target: for every backend and N, the peak
memory of GQA and of multi-query attention (MQA) is at most that of MHA.

What is measured: ``MultiHeadAttention(d_model, num_heads, num_kv_heads=...)``
with 8 query heads and 8 (MHA), 2 (GQA) or 1 (MQA) key/value heads, one
self-attention forward ``module(x, x, x)`` on ``x (1, N, d_model)`` (no mask;
``--causal`` for ``is_causal=True``) in ``eval()`` mode under
``torch.no_grad()``, for the backends ``"torch"``, ``"lib"`` and ``"tiled"``.
:class:`attention_lib.memory.TensorMemory` counts
the bytes of the tensor storages that PyTorch operators allocate (not a fused
kernel's private scratch space), and gives two peaks:

* **forward**: the whole module forward (projections included: GQA's ``W_k``
  and ``W_v`` are smaller, which MHA pays for too);
* **attention**: only the call of the backend function (``BACKENDS[backend]``,
  wrapped for the run), which is where the 16.5 MiB vs 0.52 MiB of the issue
  (N = 512) come from.

Every configuration is measured side by side in this one run (memory counts
do not depend on machine load). The exit status is 1, with a message naming
every case, if a GQA or MQA peak exceeds MHA's at the same backend and N
(``--check forward``, the default; ``attention`` or ``both`` check the
attention-call peaks too), so the script doubles as a check.

``--fixes`` also measures the candidate fixes for the ``"torch"`` backend,
directly on ``F.scaled_dot_product_attention`` with ``(1, H, N, d_k)`` queries
and ``(1, H_kv, N, d_k)`` keys and values: MHA (4-D, every head its own K/V),
today's 5-D broadcast, ``enable_gqa=True``, and K/V copied to the query heads
with ``repeat_interleave`` or ``expand`` + ``reshape``; peak memory, and the
median time over interleaved rounds (every round times every candidate once,
in a rotated order, so machine noise hits them alike).

Run: ``.venv/bin/python benchmarks/bench_gqa_memory.py`` (about 20 s on 2
cores; ``--tiled-max`` bounds the slow ``"tiled"`` backend), ``--fixes`` for
the candidate fixes too (about 45 s more, most of it today's 5-D path).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

import attention_lib
from attention_lib import MultiHeadAttention
from attention_lib.backends import BACKENDS
from attention_lib.memory import TensorMemory

MiB = 2**20
#: key/value heads of each configuration, for ``--heads`` query heads
KV_HEADS = {"MHA": None, "GQA": 2, "MQA": 1}


def peak_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes of the tensor storages allocated while ``fn()`` runs."""
    with TensorMemory() as memory:
        fn()
    return memory.peak


@contextmanager
def attention_peaks(backend: str, peaks: list[int]) -> Iterator[None]:
    """While inside, every call of ``BACKENDS[backend]`` appends its peak to ``peaks``."""
    original = BACKENDS[backend]

    def measured(*args: object, **kwargs: object) -> Tensor:
        with TensorMemory() as memory:  # nested in the forward's: both count
            output = original(*args, **kwargs)
        peaks.append(memory.peak)
        return output

    BACKENDS[backend] = measured
    try:
        yield
    finally:
        BACKENDS[backend] = original


def measure(
    backend: str, n: int, d_model: int, heads: int, causal: bool
) -> dict[str, tuple[int, int]]:
    """config -> (forward peak, attention-call peak) in bytes, at sequence length ``n``."""
    x = torch.randn(1, n, d_model, generator=torch.Generator().manual_seed(n))
    result = {}
    for config, kv_heads in KV_HEADS.items():
        torch.manual_seed(0)
        module = MultiHeadAttention(
            d_model, heads, num_kv_heads=heads if kv_heads is None else kv_heads, backend=backend
        ).eval()
        calls: list[int] = []
        with torch.no_grad(), attention_peaks(backend, calls):
            forward = peak_bytes(partial(module, x, x, x, is_causal=causal))
        if len(calls) != 1:
            raise RuntimeError(f"expected one call of BACKENDS[{backend!r}], saw {len(calls)}")
        result[config] = (forward, calls[0])
    return result


def print_table(title: str, rows: dict[int, dict[str, int]]) -> None:
    """A markdown table: N, the peaks in MiB, and GQA/MHA, MQA/MHA."""
    print(f"\n{title}\n")
    print("| N | MHA MiB | GQA MiB | MQA MiB | GQA/MHA | MQA/MHA |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n, peaks in rows.items():
        mha = peaks["MHA"]
        print(
            f"| {n} | {mha / MiB:.2f} | {peaks['GQA'] / MiB:.2f} | {peaks['MQA'] / MiB:.2f} "
            f"| {peaks['GQA'] / mha:.2f} | {peaks['MQA'] / mha:.2f} |"
        )


def fix_candidates(
    n: int, heads: int, kv_heads: int, d_k: int, causal: bool
) -> dict[str, Callable[[], Tensor]]:
    """name -> call of ``F.scaled_dot_product_attention`` for one way to attend."""
    gen = torch.Generator().manual_seed(n)
    q = torch.randn(1, heads, n, d_k, generator=gen)  # (1, H, N, d_k)
    k_full, v_full = (torch.randn(1, heads, n, d_k, generator=gen) for _ in range(2))
    k, v = (torch.randn(1, kv_heads, n, d_k, generator=gen) for _ in range(2))  # (1, H_kv, N, d_k)
    group = heads // kv_heads
    sdpa = partial(F.scaled_dot_product_attention, is_causal=causal)

    def expanded(t: Tensor) -> Tensor:  # (1, H_kv, N, d_k) -> (1, H, N, d_k), a copy
        return t[:, :, None].expand(1, kv_heads, group, n, d_k).reshape(1, heads, n, d_k)

    return {
        "MHA (4-D)": lambda: sdpa(q, k_full, v_full),
        "GQA 5-D broadcast (today)": lambda: sdpa(
            q.unflatten(1, (kv_heads, group)), k[:, :, None], v[:, :, None]
        ).flatten(1, 2),
        "GQA enable_gqa=True": lambda: sdpa(q, k, v, enable_gqa=True),
        "GQA repeat_interleave": lambda: sdpa(
            q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        ),
        "GQA expand+reshape": lambda: sdpa(q, expanded(k), expanded(v)),
    }


def run_fixes(
    sizes: list[int], heads: int, kv_heads: int, d_k: int, causal: bool, rounds: int
) -> None:
    """Peak memory and median time of every fix candidate, for every N."""
    print(
        f"\nCandidate fixes, F.scaled_dot_product_attention directly: H={heads}, "
        f"H_kv={kv_heads}, d_k={d_k}, B=1, is_causal={causal}; peak MiB and median ms of "
        f"{rounds} interleaved rounds\n"
    )
    table = {n: fix_candidates(n, heads, kv_heads, d_k, causal) for n in sizes}
    names = list(table[sizes[0]])
    cases = [(name, n) for n in sizes for name in names]
    times: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
    with torch.no_grad():
        peaks = {(name, n): peak_bytes(table[n][name]) for name, n in cases}  # also a warm-up
        for n in sizes:  # the GQA candidates compute the same thing
            reference = table[n]["GQA enable_gqa=True"]()
            for name in names[1:]:
                torch.testing.assert_close(table[n][name](), reference, atol=1e-5, rtol=1e-4)
        for r in range(rounds):
            shift = r % len(cases)
            for name, n in cases[shift:] + cases[:shift]:
                start = time.perf_counter()
                table[n][name]()
                times[(name, n)].append(time.perf_counter() - start)
    print("| N | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * len(names))
    for n in sizes:
        cells = [
            f"{peaks[(name, n)] / MiB:.2f} MiB, {statistics.median(times[(name, n)]) * 1e3:.0f} ms"
            for name in names
        ]
        print(f"| {n} | " + " | ".join(cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8, help="query heads (default 8)")
    parser.add_argument("--backends", nargs="+", default=["torch", "lib", "tiled"])
    parser.add_argument(
        "--tiled-max", type=int, default=2048, help="largest N for the slow 'tiled' backend"
    )
    parser.add_argument(
        "--check",
        choices=["forward", "attention", "both"],
        default="forward",
        help="which peaks must not exceed MHA's (default: forward)",
    )
    parser.add_argument("--causal", action="store_true", help="attend with is_causal=True")
    parser.add_argument("--fixes", action="store_true", help="also measure the candidate fixes")
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds of --fixes")
    args = parser.parse_args()

    print(
        f"Peak tensor memory (attention_lib.memory.TensorMemory), MultiHeadAttention("
        f"{args.d_model}, {args.heads}, num_kv_heads=...) self-attention forward, B=1, "
        f"is_causal={args.causal}, eval, "
        f"no_grad; MHA: {args.heads} K/V heads, GQA: {KV_HEADS['GQA']}, MQA: {KV_HEADS['MQA']}; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"attention_lib from {attention_lib.__file__}"
    )
    checked = {"forward": [0], "attention": [1], "both": [0, 1]}[args.check]
    failures = []
    for backend in args.backends:
        sizes = [n for n in args.sizes if backend != "tiled" or n <= args.tiled_max]
        results = {n: measure(backend, n, args.d_model, args.heads, args.causal) for n in sizes}
        for which, label in enumerate(("forward", "attention call")):
            rows = {n: {c: peaks[which] for c, peaks in r.items()} for n, r in results.items()}
            print_table(f'backend="{backend}", peak of the {label}', rows)
            if which not in checked:
                continue
            for n, peaks in rows.items():
                for config in ("GQA", "MQA"):
                    if peaks[config] > peaks["MHA"]:
                        failures.append(
                            f'backend="{backend}", N={n}, {label}: {config} peaks at '
                            f"{peaks[config] / MiB:.2f} MiB > MHA {peaks['MHA'] / MiB:.2f} MiB "
                            f"(x{peaks[config] / peaks['MHA']:.2f})"
                        )
    if args.fixes:
        d_k = args.d_model // args.heads
        run_fixes(args.sizes, args.heads, KV_HEADS["GQA"], d_k, args.causal, args.rounds)

    print()
    if failures:
        print(f"FAIL: GQA/MQA peak memory above MHA's ({args.check} checked):", file=sys.stderr)
        for failure in failures:
            print(f"  {failure}", file=sys.stderr)
        return 1
    print(f"OK: no GQA/MQA peak above MHA's ({args.check} checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
