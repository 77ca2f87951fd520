"""Benchmark: greedy decoding with and without the KV cache (chapter 9).

A randomly initialised :class:`attention_lib.CausalLM` (decoding speed does not
depend on what the weights have learned) generates ``N`` tokens from an
8-token prompt, once with ``use_cache=True`` and once with ``use_cache=False``,
for ``N`` = 128, 256, 512, 1024. Without the cache, step ``t`` runs all ``t``
tokens through the model again; with it, only the newest token.

Both variants are timed interleaved in one run (every round visits every
length, alternating which variant goes first), so that machine noise hits them
alike, by two clocks: the wall clock, and the CPU time of the process
(``time.process_time``), which other programs on a busy machine hardly
disturb. PyTorch runs on one thread by default (decoding one sequence gains
nothing from more). The table shows tokens/s from the median wall-clock time
of each variant and the speed-up (ratio of medians) by both clocks. The two
variants must return identical tokens; the script checks it.

With ``--baseline REV`` (a git revision, e.g. the commit before a change), the
``attention_lib`` of that revision is loaded next to today's (``git archive``
into a temporary directory, imported as ``attention_lib_baseline``) and the
cached decoding of both is timed interleaved, in this process: the table then
gives the CPU milliseconds per token of each (medians) and their ratio.

Run: ``.venv/bin/python benchmarks/bench_decode.py [--rounds 3] [--threads 1]
[--baseline REV]``
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from attention_lib import CausalLM, generate

PROMPT_LEN = 8


def time_generate(
    model: CausalLM, prompt: torch.Tensor, new: int, use_cache: bool
) -> tuple[float, float]:
    """Wall-clock and CPU seconds of one ``generate`` call."""
    wall, cpu = time.perf_counter(), time.process_time()
    generate(model, prompt, new, use_cache=use_cache)
    return time.perf_counter() - wall, time.process_time() - cpu


def load_baseline(rev: str, into: Path):
    """``attention_lib`` as of git revision ``rev``, imported as ``attention_lib_baseline``
    (its imports inside the package are relative, so a renamed copy works)."""
    root = Path(__file__).resolve().parents[1]
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", rev, "attention_lib"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "attention_lib").rename(into / "attention_lib_baseline")
    sys.path.insert(0, str(into))
    return importlib.import_module("attention_lib_baseline")


def compare(args: argparse.Namespace, baseline) -> None:
    """CPU ms per cached token of ``baseline`` and of today's package, interleaved."""
    import attention_lib

    libs = {"baseline": baseline, "today": attention_lib}
    models = {}
    for name, lib in libs.items():
        torch.manual_seed(0)
        models[name] = lib.CausalLM(args.vocab, args.d_model, args.heads, args.layers,
                                    PROMPT_LEN + max(args.lengths), backend=args.backend).eval()  # fmt: skip
    prompt = torch.randint(args.vocab, (1, PROMPT_LEN))
    short = min(args.lengths)
    tokens = [lib.generate(models[n], prompt, short) for n, lib in libs.items()]
    assert torch.equal(*tokens), "baseline and today generate different tokens"
    cpu: dict[tuple[str, int], list[float]] = {}
    for r in range(args.rounds):
        for n in args.lengths:
            for name in list(libs) if r % 2 == 0 else list(libs)[::-1]:
                start = time.process_time()
                libs[name].generate(models[name], prompt, n)
                cpu.setdefault((name, n), []).append((time.process_time() - start) / n * 1e3)
    print(f"CausalLM d_model={args.d_model}, {args.heads} heads, {args.layers} layers, "
          f"backend={args.backend!r}, batch 1, cached; baseline {args.baseline}; "
          f"medians of {args.rounds} interleaved rounds")  # fmt: skip
    print("| new tokens | baseline (CPU ms/token) | today (CPU ms/token) | today / baseline |")
    print("|---:|---:|---:|---:|")
    for n in args.lengths:
        old, new = (statistics.median(cpu[(name, n)]) for name in libs)
        print(f"| {n} | {old:.3f} | {new:.3f} | {new / old:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--baseline", help="a git revision: compare its cached decoding")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.baseline:
        with tempfile.TemporaryDirectory() as tmp:
            return compare(args, load_baseline(args.baseline, Path(tmp)))

    torch.manual_seed(0)
    max_len = PROMPT_LEN + max(args.lengths)
    model = CausalLM(
        args.vocab, args.d_model, args.heads, args.layers, max_len, backend=args.backend
    ).eval()
    prompt = torch.randint(args.vocab, (1, PROMPT_LEN))
    short = min(args.lengths)
    assert torch.equal(
        generate(model, prompt, short), generate(model, prompt, short, use_cache=False)
    )
    time_generate(model, prompt, short, True)  # warm-up
    time_generate(model, prompt, short, False)

    times: dict[tuple[int, bool], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for n in args.lengths:
            for use_cache in (True, False) if r % 2 == 0 else (False, True):
                times.setdefault((n, use_cache), []).append(
                    time_generate(model, prompt, n, use_cache)
                )

    print(
        f"CausalLM d_model={args.d_model}, {args.heads} heads, {args.layers} layers, "
        f"vocab {args.vocab}, backend={args.backend!r}, batch 1, prompt {PROMPT_LEN}, "
        f"threads {torch.get_num_threads()}, medians of {args.rounds} rounds"
    )
    print(
        "| new tokens | with cache (tokens/s) | without cache (tokens/s) "
        "| speed-up, wall clock | speed-up, CPU time |"
    )
    print("|---:|---:|---:|---:|---:|")
    for n in args.lengths:
        cached, full = times[(n, True)], times[(n, False)]
        wall_c, wall_f = (statistics.median(t[0] for t in ts) for ts in (cached, full))
        cpu_c, cpu_f = (statistics.median(t[1] for t in ts) for ts in (cached, full))
        print(
            f"| {n} | {n / wall_c:.0f} | {n / wall_f:.0f} | {wall_f / wall_c:.1f} "
            f"| {cpu_f / cpu_c:.1f} |"
        )


if __name__ == "__main__":
    main()
