"""Benchmark: the serving engine of chapter 12, on CPU.

A randomly initialised :class:`attention_lib.CausalLM` (serving speed does not
depend on what the weights have learned) serves request mixes with
:class:`attention_lib.Engine`, whose attention reads the paged cache in place.
Four measurements:

1. **Continuous against static batching** on a mixed workload: prompts of 4 to
   32 tokens; three in four requests want 4-16 new tokens, one in four 48-96
   (a chat server's short answers and a few long ones), all queued at once (an
   offline throughput measurement). Both policies use the same engine code; the
   difference is the scheduling alone. What drives the gain: a static batch
   runs until its *longest* request ends, so most of its rows sit idle for most
   of its steps; continuous batching refills them at once and needs fewer
   steps. The gain in CPU time is smaller than the gain in steps because a
   step's cost grows with the rows it runs. The two policies are timed
   interleaved (every round runs both, alternating which goes first), by the
   wall clock and by the process's CPU time (``time.process_time``), which
   other programs on a busy machine hardly disturb; the table gives tokens/s
   from the medians, the steps and the mean number of running requests.
2. **Latency**: time to first token (TTFT) and time per output token (TPOT),
   percentiles over the requests, for static, continuous, and continuous with
   chunked prefill (``max_num_batched_tokens``), on a workload where one
   request in four has a long prompt (96-128 tokens) and arrivals are spread
   over the first steps.
3. **Prefix caching** on a shared-system-prompt workload (a 96-token system
   prompt, then 4-16 tokens of each user): the tokens run through the model,
   the peak of blocks used and the CPU time, with and without
   ``enable_prefix_caching``.
4. **Paged attention in place** against the gather path for one decode step
   of 8 sequences of 512 tokens: time and peak extra memory (``TensorMemory``).
5. **Against a real engine**: a tiny random Llama (transformers 5.24's
   ``LlamaForCausalLM``, 4 layers, width 256, GQA 4:2) served by 🤗
   transformers' continuous batching (``generate_batch``, its paged cache and
   scheduler, on CPU) and, converted by ``CausalLM.from_hf``, by ``Engine``:
   identical greedy tokens, and the CPU-time ratio (both warmed up first;
   ``generate_batch`` takes one ``max_new_tokens`` for all, so every request
   wants the same number of tokens).

Every engine's tokens are checked against the others' (the same greedy tokens).

Run: ``.venv/bin/python benchmarks/bench_serving.py [--rounds 3] [--requests 64]``
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch
import torch.nn.functional as F

from attention_lib import CausalLM, PagedKVCache, TensorMemory, paged_attention
from attention_lib.serving import Engine, Request


def workload(
    n: int, vocab: int, seed: int, long_share: float = 0.25
) -> list[tuple[torch.Tensor, int, int]]:
    """``n`` (prompt, max_new_tokens, arrival) triples, all arriving at step 0:
    prompts of 4-32 tokens; a share ``long_share`` of the requests want 48-96
    new tokens, the others 4-16."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = torch.tensor([rng.randrange(vocab) for _ in range(rng.randint(4, 32))])
        new = rng.randint(48, 96) if rng.random() < long_share else rng.randint(4, 16)
        out.append((prompt, new, 0))
    return out


def long_and_short(n: int, vocab: int, seed: int) -> list[tuple[torch.Tensor, int, int]]:
    """``n`` requests arriving over the first ``n / 2`` steps; one in four has
    a long prompt (96-128 tokens), the others 4-16; 8-32 new tokens each."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randint(96, 128) if rng.random() < 0.25 else rng.randint(4, 16)
        prompt = torch.tensor([rng.randrange(vocab) for _ in range(length)])
        out.append((prompt, rng.randint(8, 32), i // 2))
    return out


def shared_system_prompt(n: int, vocab: int, seed: int) -> list[tuple[torch.Tensor, int, int]]:
    """``n`` requests, one per step: the same 96-token system prompt, then 4-16
    tokens of each user; 8-16 new tokens each."""
    rng = random.Random(seed)
    system = [rng.randrange(vocab) for _ in range(96)]
    out = []
    for i in range(n):
        user = [rng.randrange(vocab) for _ in range(rng.randint(4, 16))]
        out.append((torch.tensor(system + user), rng.randint(8, 16), i))
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def serve(model: CausalLM, jobs, policy: str, args, **options) -> tuple:
    """Serve ``jobs`` once: wall and CPU seconds, the engine, the outputs, the requests."""
    engine = Engine(model, args.blocks, args.block_size, args.batch, policy=policy, **options)
    requests = [Request(p, n, arrival=a) for p, n, a in jobs]
    wall, cpu = time.perf_counter(), time.process_time()
    outputs = engine.run(requests)
    return time.perf_counter() - wall, time.process_time() - cpu, engine, outputs, requests


def throughput(model: CausalLM, args) -> None:
    jobs = workload(args.requests, args.vocab, seed=1, long_share=args.long_share)
    generated = sum(n for _, n, _ in jobs)
    results: dict[str, list[tuple[float, float]]] = {"continuous": [], "static": []}
    engines, outputs = {}, {}
    serve(model, jobs[:4], "continuous", args)  # warm-up
    for r in range(args.rounds):
        for policy in ("continuous", "static") if r % 2 == 0 else ("static", "continuous"):
            wall, cpu, engines[policy], outputs[policy], _ = serve(model, jobs, policy, args)
            results[policy].append((wall, cpu))
    for a, b in zip(outputs["continuous"], outputs["static"]):
        assert torch.equal(a, b), "the two policies must give every request the same tokens"

    def median(policy: str, clock: int) -> float:
        return statistics.median(t[clock] for t in results[policy])

    print(
        f"\n1. Throughput: {args.requests} requests ({args.long_share:.0%} long), "
        f"{generated} new tokens, all queued at once"
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
    steps = engines["static"].steps / engines["continuous"].steps
    print(
        f"\ncontinuous / static: {cpu:.2f}x (CPU time), {wall:.2f}x (wall clock), "
        f"{steps:.2f}x fewer steps"
    )


def latency(model: CausalLM, args) -> None:
    jobs = long_and_short(args.requests, args.vocab, seed=2)
    schedules = {
        "static": {"policy": "static"},
        "continuous": {"policy": "continuous"},
        f"continuous, chunked ({args.chunk})": {"max_num_batched_tokens": args.chunk},
    }
    print(f"\n2. Latency: {len(jobs)} requests, one in four with a 96-128-token prompt,")
    print("two arriving per step; percentiles over the requests (ms: wall clock)")
    print("| schedule | steps | TTFT p50 / p90 / p99 (steps) | TTFT p50 / p90 / p99 (ms) "
          "| TPOT p50 / p90 (ms) | CPU s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    first = None
    for name, options in schedules.items():
        options = {"policy": "continuous", **options}
        policy = options.pop("policy")
        _, cpu, engine, outputs, requests = serve(model, jobs, policy, args, **options)
        first = first or outputs
        assert all(torch.equal(a, b) for a, b in zip(first, outputs)), name
        lat = [engine.latency(r) for r in requests]
        ttft_steps = [x.ttft_steps for x in lat]
        ttft = [1e3 * x.ttft_seconds for x in lat]
        tpot = [1e3 * x.tpot_seconds for x in lat if x.tpot_seconds == x.tpot_seconds]
        print(
            f"| {name} | {engine.steps} | "
            + " / ".join(f"{percentile(ttft_steps, q):.0f}" for q in (50, 90, 99))
            + " | "
            + " / ".join(f"{percentile(ttft, q):.0f}" for q in (50, 90, 99))
            + " | "
            + " / ".join(f"{percentile(tpot, q):.1f}" for q in (50, 90))
            + f" | {cpu:.2f} |"
        )


def prefix_caching(model: CausalLM, args) -> None:
    jobs = shared_system_prompt(args.requests, args.vocab, seed=3)
    print(f"\n3. Prefix caching: {len(jobs)} requests sharing a 96-token system prompt")
    print("| prefix caching | tokens computed | peak blocks used | CPU s |")
    print("|---|---:|---:|---:|")
    first, rows = None, {}
    for caching in (False, True):
        cpus = []
        for _ in range(args.rounds):
            _, cpu, engine, outputs, _ = serve(
                model, jobs, "continuous", args, enable_prefix_caching=caching
            )
            cpus.append(cpu)
        first = first or outputs
        assert all(torch.equal(a, b) for a, b in zip(first, outputs))
        peak = max(b for _, b in engine.trace)
        rows[caching] = (engine.computed_tokens, peak, statistics.median(cpus))
        print(f"| {'on' if caching else 'off'} | {rows[caching][0]} | {peak} "
              f"| {rows[caching][2]:.2f} |")  # fmt: skip
    (t0, b0, c0), (t1, b1, c1) = rows[False], rows[True]
    print(
        f"\nprefix caching saves {1 - t1 / t0:.0%} of the tokens computed, "
        f"{1 - b1 / b0:.0%} of the peak blocks, {1 - c1 / c0:.0%} of the CPU time"
    )


def in_place(args) -> None:
    """One decode step's attention, 8 sequences of 512 tokens, in place vs gathered."""
    torch.manual_seed(0)
    seqs, length, heads, kv_heads, d = 8, 512, 8, 2, 64
    pool = PagedKVCache(seqs * length // 16, 16, num_layers=1, num_kv_heads=kv_heads, head_dim=d)
    ids = [pool.new_sequence() for _ in range(seqs)]
    for _ in range(length // 16):
        pool.extend(ids, 16)  # interleaved blocks
    pool.key.normal_(), pool.value.normal_()
    tables = torch.tensor([pool.tables[s] for s in ids])
    q = torch.randn(seqs, heads, 1, d)
    positions, lengths = torch.full((seqs, 1), length - 1), torch.full((seqs,), length)

    def walk() -> torch.Tensor:
        return paged_attention(q, pool.key[0], pool.value[0], tables, positions, lengths)

    slots = torch.stack([pool.slots(s) for s in ids])  # (S, T): the engine's old read

    def gather() -> torch.Tensor:  # PagedLayer's read: every key copied, then attention
        k, v = (t[0].flatten(0, 1)[slots].transpose(1, 2) for t in (pool.key, pool.value))
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # (S, H, 1, d)

    assert (walk() - gather()).abs().max() < 1e-5
    print(f"\n4. One decode step's attention, {seqs} sequences x {length} tokens, "
          f"{heads} heads ({kv_heads} KV), d_k {d}")  # fmt: skip
    print("| read | ms (CPU, median) | peak extra memory (KiB) |")
    print("|---|---:|---:|")
    for name, fn in (("in place (block-table walk)", walk), ("gathered (dense copy)", gather)):
        with TensorMemory() as memory:
            fn()
        times = []
        for _ in range(5 * args.rounds):
            start = time.process_time()
            fn()
            times.append(time.process_time() - start)
        print(f"| {name} | {1e3 * statistics.median(times):.2f} | {memory.peak / 1024:.0f} |")
    kv_bytes = 2 * seqs * length * kv_heads * d * 4
    print(f"gathered keys and values: {kv_bytes / 1024:.0f} KiB")


def race(args) -> None:
    """transformers' continuous batching against Engine on the same tiny Llama."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        initializer_range=0.1,
    )  # fmt: skip
    hf = LlamaForCausalLM(config).eval()
    ours = CausalLM.from_hf(hf).eval()
    rng = random.Random(5)
    prompts = [[rng.randrange(args.vocab) for _ in range(rng.randint(4, 32))]
               for _ in range(args.requests)]  # fmt: skip
    new = 32
    generation = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=-1)

    def theirs() -> list[list[int]]:
        results = hf.generate_batch(inputs=prompts, generation_config=generation)
        return [results[f"req_{i}"].generated_tokens for i in range(len(prompts))]

    def mine() -> list[list[int]]:
        engine = Engine(ours, args.blocks, args.block_size, args.batch)
        requests = [Request(torch.tensor(p), new) for p in prompts]
        return [out[len(p) :].tolist() for p, out in zip(prompts, engine.run(requests))]

    times: dict[str, list[float]] = {"transformers generate_batch": [], "Engine": []}
    tokens = {}
    for name, fn in (("transformers generate_batch", theirs), ("Engine", mine)):
        fn()  # warm-up
    for r in range(args.rounds):
        order = list(times) if r % 2 == 0 else list(times)[::-1]
        for name in order:
            start = time.process_time()
            tokens[name] = (theirs if name.startswith("transformers") else mine)()
            times[name].append(time.process_time() - start)
    same = sum(a == b for a, b in zip(*tokens.values()))
    generated = new * len(prompts)
    print(f"\n5. Against transformers' continuous batching: tiny Llama, {len(prompts)} requests "
          f"x {new} new tokens")  # fmt: skip
    print("| engine | tokens/s (CPU) | CPU s (median) |")
    print("|---|---:|---:|")
    for name, t in times.items():
        print(f"| {name} | {generated / statistics.median(t):.0f} | {statistics.median(t):.2f} |")
    ratio = statistics.median(times["transformers generate_batch"]) / statistics.median(
        times["Engine"]
    )
    print(f"identical greedy tokens: {same} of {len(prompts)}; ours / theirs: {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16, help="max running requests")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=512)
    parser.add_argument("--chunk", type=int, default=64, help="max_num_batched_tokens")
    parser.add_argument("--long-share", type=float, default=0.25, help="share of long answers")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--only", choices=["throughput", "latency", "prefix", "in-place", "transformers"]
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    model = CausalLM(args.vocab, args.d_model, args.heads, args.layers, 160, backend="torch").eval()
    print(
        f"CausalLM d_model={args.d_model}, {args.heads} heads, {args.layers} layers, "
        f"backend='torch'; max batch {args.batch}, blocks of {args.block_size}; threads "
        f"{torch.get_num_threads()}, medians of {args.rounds} rounds, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    parts = {
        "throughput": lambda: throughput(model, args),
        "latency": lambda: latency(model, args),
        "prefix": lambda: prefix_caching(model, args),
        "in-place": lambda: in_place(args),
        "transformers": lambda: race(args),
    }
    for name, part in parts.items():
        if args.only in (None, name):
            part()


if __name__ == "__main__":
    main()
