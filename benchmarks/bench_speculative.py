"""Benchmark: speculative decoding against greedy decoding (chapter 13).

A target :class:`attention_lib.CausalLM` (8 layers of width 64) and a draft
about 4 times smaller (2 layers of width 64) learn chapter 9's induction task
(repeated random patterns), on which the draft is good. Then every variant
continues the same held-out prompts (a pattern shown once, then its first two
tokens) to the full length: greedy ``generate``, speculative decoding with
the draft for several ``k`` (``assistant_model=``, ``num_assistant_tokens=k``)
and prompt lookup (``prompt_lookup_num_tokens=4``). Every variant must return
the greedy tokens; the script checks it.

The variants are timed interleaved, ``--rounds`` times (every round visits
every variant, in a rotated order), by the CPU time of the process
(``time.process_time``), which other programs on a busy machine hardly
disturb; the table gives the median CPU time of each, its speed-up over
greedy decoding (ratio of medians), the measured acceptance rate ``alpha``,
the tokens per pass of the target and the formula ``(1 - alpha^(k+1)) /
(1 - alpha)``. Aim: a speed-up of at least 1.5 for some ``k``.

Run: ``.venv/bin/python benchmarks/bench_speculative.py [--rounds 5] [--prompts 40]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from attention_lib import (
    CausalLM,
    expected_tokens,
    generate,
    make_induction_data,
    speculative_decode,
    train_token_classifier,
)

V, L = 16, 32


def trained(num_layers: int, lr: float) -> CausalLM:
    """A ``num_layers``-layer model of width 64 trained on the induction task."""
    torch.manual_seed(0)
    model = CausalLM(V, 64, 2, num_layers, max_len=L, backend="torch")
    x, y, _ = make_induction_data(
        10_000, L, V, min_period=2, max_period=10, generator=torch.Generator().manual_seed(1)
    )
    train_token_classifier(
        model, x, y, steps=150, batch_size=64, lr=lr, generator=torch.Generator().manual_seed(3)
    )
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, draft = trained(8, 3e-3), trained(2, 6e-3)
    sizes = [sum(p.numel() for p in m.parameters()) for m in (target, draft)]
    x, _, periods = make_induction_data(
        args.prompts, L, V, min_period=2, max_period=10, generator=torch.Generator().manual_seed(2)
    )
    prompts = [x[b : b + 1, : int(periods[b]) + 2] for b in range(args.prompts)]
    greedy = [generate(target, p, L - p.shape[1]) for p in prompts]
    variants = {"greedy": None, **{f"draft k={k}": ("draft", k) for k in (2, 3, 4, 6)}}
    variants["prompt lookup k=4"] = ("lookup", 4)
    times: dict[str, list[float]] = {name: [] for name in variants}
    counts: dict[str, list[int]] = {name: [0, 0, 0] for name in variants}
    names = list(variants)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.process_time()
            for p, want in zip(prompts, greedy):
                kind = variants[name]
                if kind is None:
                    out = generate(target, p, L - p.shape[1])
                else:
                    options = (
                        {"assistant_model": draft, "num_assistant_tokens": kind[1]}
                        if kind[0] == "draft"
                        else {"prompt_lookup_num_tokens": kind[1]}
                    )
                    out, stats = speculative_decode(target, p, L - p.shape[1], **options)
                    if r == 0:
                        c = counts[name]
                        c[0], c[1] = c[0] + stats.drafted, c[1] + stats.accepted
                        c[2] += stats.verifications
                assert torch.equal(out, want), name  # always the greedy tokens
            times[name].append(time.process_time() - start)
    base = statistics.median(times["greedy"])
    print(f"target {sizes[0]:,} parameters, draft {sizes[1]:,} ({sizes[0] / sizes[1]:.1f}x)")
    print(f"{args.prompts} prompts, {args.rounds} rounds, CPU time, {args.threads} thread(s)")
    print(
        f"{'variant':<18} {'CPU s':>7} {'speed-up':>8} {'alpha':>6} {'tok/pass':>8} {'formula':>8}"
    )
    for name in names:
        t = statistics.median(times[name])
        drafted, accepted, passes = counts[name]
        if variants[name] is None:
            print(f"{name:<18} {t:7.2f} {1:8.2f}")
            continue
        alpha, k = accepted / drafted, variants[name][1]
        per_pass = (accepted + passes) / passes
        print(
            f"{name:<18} {t:7.2f} {base / t:8.2f} {alpha:6.3f} {per_pass:8.2f} "
            f"{expected_tokens(alpha, k):8.2f}"
        )


if __name__ == "__main__":
    main()
