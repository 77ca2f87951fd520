"""Benchmark: continuous against static batching on a mixed workload (chapter 11).

A randomly initialised :class:`attention_lib.CausalLM` (serving speed does not
depend on what the weights have learned) serves the same requests twice with
:class:`attention_lib.Engine` on a :class:`attention_lib.PagedKVCache`: once
with ``policy="continuous"`` (retire and admit at every step) and once with
``policy="static"`` (a new batch only when the whole batch has finished). The
workload mixes prompt lengths (4 to 32 tokens) and output lengths (most
requests short, one in four long), all queued at once: an offline throughput
measurement. Both policies use the same engine code (separate prefills, one
batched decode step per step), so the difference is the scheduling alone.

The two policies are timed interleaved in one run (every round runs both,
alternating which goes first), by the wall clock and by the CPU time of the
process (``time.process_time``), which other programs on a busy machine hardly
disturb. The table shows generated tokens/s from the median wall-clock and
CPU times, the engine steps and the mean number of running requests per step, and the
speed-up (ratio of medians) by both clocks. Both policies must return the
same tokens for every request; the script checks it.

Run: ``.venv/bin/python benchmarks/bench_serving.py [--rounds 3] [--requests 32]``
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch

from attention_lib import CausalLM
from attention_lib.serving import Engine, Request


def workload(n: int, vocab: int, seed: int) -> list[tuple[torch.Tensor, int]]:
    """``n`` (prompt, max_new_tokens) pairs: prompts of 4-32 tokens; three in
    four requests want 4-16 new tokens, one in four 48-96."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = torch.tensor([rng.randrange(vocab) for _ in range(rng.randint(4, 32))])
        new = rng.randint(48, 96) if rng.random() < 0.25 else rng.randint(4, 16)
        out.append((prompt, new))
    return out


def serve(model: CausalLM, jobs, policy: str, args) -> tuple[float, float, Engine, list]:
    engine = Engine(model, args.blocks, args.block_size, args.batch, policy=policy)
    requests = [Request(p, n) for p, n in jobs]
    wall, cpu = time.perf_counter(), time.process_time()
    outputs = engine.run(requests)
    return time.perf_counter() - wall, time.process_time() - cpu, engine, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8, help="max running requests")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=256)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    model = CausalLM(args.vocab, args.d_model, args.heads, args.layers, 160, backend="torch").eval()
    jobs = workload(args.requests, args.vocab, seed=1)
    generated = sum(n for _, n in jobs)

    results: dict[str, list[tuple[float, float]]] = {"continuous": [], "static": []}
    engines, outputs = {}, {}
    serve(model, jobs[:4], "continuous", args)  # warm-up
    for r in range(args.rounds):
        for policy in ("continuous", "static") if r % 2 == 0 else ("static", "continuous"):
            wall, cpu, engines[policy], outputs[policy] = serve(model, jobs, policy, args)
            results[policy].append((wall, cpu))
    for a, b in zip(outputs["continuous"], outputs["static"]):
        assert torch.equal(a, b), "the two policies must give every request the same tokens"

    def median(policy: str, clock: int) -> float:
        return statistics.median(t[clock] for t in results[policy])

    load = os.getloadavg()[0]
    print(
        f"CausalLM d_model={args.d_model}, {args.heads} heads, {args.layers} layers, "
        f"backend='torch'; {args.requests} requests, {generated} new tokens; "
        f"max batch {args.batch}, blocks of {args.block_size}; threads "
        f"{torch.get_num_threads()}, medians of {args.rounds} rounds, load {load:.1f}"
    )
    print("| policy | tokens/s (wall) | tokens/s (CPU) | steps | mean running | wall s | CPU s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for policy in ("static", "continuous"):
        engine = engines[policy]
        running = statistics.mean(n for n, _ in engine.trace)
        print(
            f"| {policy} | {generated / median(policy, 0):.0f} "
            f"| {generated / median(policy, 1):.0f} | {engine.steps} "
            f"| {running:.2f} | {median(policy, 0):.2f} | {median(policy, 1):.2f} |"
        )
    wall = median("static", 0) / median("continuous", 0)
    cpu = median("static", 1) / median("continuous", 1)
    print(f"\nspeed-up of continuous batching: {wall:.2f}x (wall clock), {cpu:.2f}x (CPU time)")


if __name__ == "__main__":
    main()
