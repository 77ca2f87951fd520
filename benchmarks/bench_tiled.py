"""Benchmark: attention_lib.tiled_attention vs torch's fused SDPA and naive attention.

Chapter 11's targets, at B=1, H=8, d=64, float32, measured as ratios in one run:

* **forward time** (under ``torch.inference_mode()``): ``tiled_attention`` <=
  1.5x ``F.scaled_dot_product_attention`` at N in {1024, 2048, 4096}.
* **forward + backward time** (``out.backward(grad_out)``): <= 2x SDPA's
  forward + backward at N in {1024, 2048, 4096}.

  Both are timed in this process, interleaved (one call of each per round,
  rotating the order) so that machine noise hits both alike; ``ratio`` is the
  ratio of the medians, ``paired`` the median of the per-round ratios. Every
  round visits every size, so that a burst of load from other processes spreads
  over all sizes instead of spoiling one. Each table is run twice: with torch's
  default number of intra-op threads by the wall clock, and with one intra-op
  thread by CPU time (``time.process_time``). The load average is printed with
  them: on a shared machine other processes slow down code made of many small
  parallel ops (every op waits for all threads) much more than one fused
  kernel, so under load the one-thread CPU-time ratio is the meaningful one.
* **memory**: the peak memory of ``tiled_attention`` <= 5% of naive attention
  (``softmax(Q K^T * scale) V``, which builds the N x N score matrix) at
  N=4096, for the forward pass and for forward + backward, and it grows as
  O(N). Measured as the growth of the peak resident set size during one call,
  in a fresh subprocess per case: the child allocates the inputs (and the
  output gradient), does a small warm-up call, resets the kernel's peak-RSS
  counter (``/proc/self/clear_refs``; if that is not allowed, it falls back to
  ``ru_maxrss`` after minus the current RSS before), runs the call, and reports
  ``peak RSS after - RSS before`` (output and gradients included).

The method, and the results of one run, are described in ``benchmarks/README.md``.

Run: ``.venv/bin/python benchmarks/bench_tiled.py`` (about 10 minutes), or
``--quick`` for a small smoke run. ``--block-size 128x256`` (repeatable) times
other tile shapes next to the default; ``--only forward`` or ``--only training``
runs one half.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from attention_lib import tiled_attention
from attention_lib.tiled import DEFAULT_BLOCK_SIZE

BATCH, HEADS, HEAD_DIM = 1, 8, 64
MiB = 2**20


def naive_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """Textbook attention: materialises the (B, H, N, N) scores and weights."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, N, N)
    if is_causal:
        hidden = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(hidden, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v  # (B, H, N, d)


def make_method(name: str, is_causal: bool, block_size: tuple[int, int]) -> Callable[..., Tensor]:
    if name == "torch":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    if name == "tiled":
        return lambda q, k, v: tiled_attention(q, k, v, is_causal=is_causal, block_size=block_size)
    if name == "naive":
        return lambda q, k, v: naive_attention(q, k, v, is_causal)
    raise ValueError(f"unknown method {name!r}")


def training_step(fn: Callable[..., Tensor], grad_out: Tensor) -> Callable[..., Tensor]:
    """Forward + backward of ``fn``: the gradients of q, k and v (fresh each call)."""

    def step(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        for t in (q, k, v):
            t.grad = None
        fn(q, k, v).backward(grad_out)
        return q.grad

    return step


def inputs(n: int, seed: int = 0, requires_grad: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(BATCH, HEADS, n, HEAD_DIM, generator=gen).requires_grad_(requires_grad)
        for _ in range(3)
    )


def grad_output(n: int) -> Tensor:
    return torch.randn(BATCH, HEADS, n, HEAD_DIM, generator=torch.Generator().manual_seed(7))


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


def wait_until_quiet(max_wait: float, threshold: float) -> None:
    """Wait (at most ``max_wait`` s) until the 1-minute load average drops below ``threshold``."""
    deadline = time.monotonic() + max_wait
    while time.monotonic() < deadline:
        if float(loadavg().split()[0]) < threshold:
            return
        time.sleep(5)


# --------------------------------------------------------------------------- time


def time_interleaved(
    cases: dict[tuple[int, bool], dict[str, Callable[[], Tensor]]],
    rounds: int,
    warmup: int,
    clock: Callable[[], float],
) -> dict[tuple[int, bool], dict[str, list[float]]]:
    """Time every candidate of every case once per round; return seconds per call.

    Each round visits all cases (and, within a case, all candidates in a rotating
    order), so that a burst of load from other processes is spread over all cases
    instead of falling on one of them.
    """
    for candidates in cases.values():
        for _ in range(warmup):
            for fn in candidates.values():
                fn()
    times = {case: {name: [] for name in cands} for case, cands in cases.items()}
    for r in range(rounds):
        for case, candidates in cases.items():
            names = list(candidates)
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                start = clock()
                candidates[name]()
                times[case][name].append(clock() - start)
    return times


def time_table(
    sizes: list[int],
    block_sizes: list[tuple[int, int]],
    rounds: int,
    threads: int | None,
    clock_name: str,
    training: bool = False,
) -> dict[tuple[int, bool, str], float]:
    """Print one timing table; return {(N, causal, tiled-label): ratio of medians}.

    ``training``: time forward + backward instead of the forward pass alone.
    """
    clock = time.perf_counter if clock_name == "wall" else time.process_time
    saved = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    what = "forward + backward" if training else "forward (inference_mode)"
    print(
        f"\n## time of {what}, {clock_name} clock, {torch.get_num_threads()} intra-op "
        f"thread(s), median of {rounds} interleaved rounds (load average before: {loadavg()})"
    )
    cases: dict[tuple[int, bool], dict[str, Callable[[], Tensor]]] = {}
    with torch.inference_mode(not training):
        for n in sizes:
            q, k, v = inputs(n, requires_grad=training)
            grad_out = grad_output(n)
            for is_causal in (False, True):
                methods = {"torch": make_method("torch", is_causal, DEFAULT_BLOCK_SIZE)}
                for bs in block_sizes:
                    methods[f"tiled {bs[0]}x{bs[1]}"] = make_method("tiled", is_causal, bs)
                if training:
                    methods = {name: training_step(fn, grad_out) for name, fn in methods.items()}
                expected = methods["torch"](q, k, v).clone()
                candidates = {}
                for label, fn in methods.items():
                    err = (fn(q, k, v) - expected).abs().max().item()
                    assert err < 1e-4, f"{label} at N={n}: max error {err}"
                    candidates[label] = lambda fn=fn, q=q, k=k, v=v: fn(q, k, v)
                cases[(n, is_causal)] = candidates
        times = time_interleaved(cases, rounds, warmup=1, clock=clock)

    print(f"{'N':>6} {'causal':>6} {'candidate':>16} {'median ms':>10} {'torch ms':>9} "
          f"{'ratio':>6} {'paired':>6}")
    ratios: dict[tuple[int, bool, str], float] = {}
    for (n, is_causal), case_times in times.items():
        base = statistics.median(case_times["torch"])
        for label, ts in case_times.items():
            if label == "torch":
                continue
            ratio = statistics.median(ts) / base
            paired = statistics.median(t / b for t, b in zip(ts, case_times["torch"]))
            ratios[(n, is_causal, label)] = ratio
            print(f"{n:>6} {str(is_causal):>6} {label:>16} {statistics.median(ts) * 1e3:>10.1f} "
                  f"{base * 1e3:>9.1f} {ratio:>6.2f} {paired:>6.2f}")
    print(f"(load average after: {loadavg()})")
    torch.set_num_threads(saved)
    return ratios


# --------------------------------------------------------------------------- memory


def _proc_status_kib(field: str) -> int:
    """One ``kB`` field of /proc/self/status, e.g. ``VmRSS`` (resident) or ``VmHWM`` (peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _rss_kib() -> int:
    return _proc_status_kib("VmRSS")


def _hwm_kib() -> int:
    return _proc_status_kib("VmHWM")


def child_memory(
    method: str, n: int, is_causal: bool, block_size: tuple[int, int], training: bool
) -> None:
    """Run in a fresh process: print the peak-RSS growth of one call as JSON."""
    fn = make_method(method, is_causal, block_size)
    with torch.inference_mode(not training):
        q, k, v = inputs(n, requires_grad=training)
        warm_up = inputs(128, seed=1, requires_grad=training)
        if training:
            fn = training_step(fn, grad_output(n))
            training_step(make_method(method, is_causal, block_size), grad_output(128))(*warm_up)
        else:
            fn(*warm_up)  # warm-up: load kernels, create thread pools
        del warm_up
        before = _rss_kib()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
            how = "VmHWM after reset via /proc/self/clear_refs"
        except OSError:
            how = "ru_maxrss after (not reset)"
        out = fn(q, k, v)
        peak = _hwm_kib() if how.startswith("VmHWM") else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        del out
    print(json.dumps({"extra_kib": peak - before, "before_kib": before, "how": how}))


def measure_memory(method: str, n: int, is_causal: bool, block_size: tuple[int, int],
                   threads: int | None, training: bool = False) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child-memory", method, str(n),
           "--block-size", f"{block_size[0]}x{block_size[1]}"]
    if is_causal:
        cmd.append("--causal")
    if training:
        cmd.append("--training")
    if threads is not None:
        cmd += ["--threads", str(threads)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def memory_table(sizes: list[int], naive_max: int, block_size: tuple[int, int],
                 threads: int | None, training: bool = False) -> dict[tuple[str, int], float]:
    what = "forward + backward" if training else "one forward call"
    print(f"\n## peak memory of {what} (MiB), non-causal, fresh subprocess per case")
    mem: dict[tuple[str, int], float] = {}
    how = ""
    for n in sizes:
        for method in ("naive", "torch", "tiled"):
            if method == "naive" and n > naive_max:
                continue
            res = measure_memory(method, n, False, block_size, threads, training)
            mem[(method, n)] = res["extra_kib"] / 1024
            how = res["how"]
    print(f"(method: peak RSS growth during the call = {how} - VmRSS before; inputs "
          f"allocated and a small warm-up call done before)")
    print(f"{'N':>6} {'naive':>9} {'torch':>9} {'tiled':>9} {'tiled/naive':>11} "
          f"{'score matrix':>12} {'tiled growth':>12}")
    prev = None
    for n in sizes:
        naive = mem.get(("naive", n))
        tiled = mem[("tiled", n)]
        scores_mib = BATCH * HEADS * n * n * 4 / MiB
        growth = f"x{tiled / prev:.2f}" if prev else ""
        prev = tiled
        naive_s = f"{naive:9.1f}" if naive is not None else f"{'(skip)':>9}"
        share = f"{tiled / naive:11.1%}" if naive else f"{'':>11}"
        print(f"{n:>6} {naive_s} {mem[('torch', n)]:9.1f} {tiled:9.1f} {share} "
              f"{scores_mib:12.1f} {growth:>12}")
    print("(score matrix = B*H*N*N float32, the size of one naive N x N tensor; "
          "'tiled growth' = tiled(N) / tiled(N/2): 2 for O(N), 4 for O(N^2))")
    return mem


# --------------------------------------------------------------------------- main


def parse_block(text: str) -> tuple[int, int]:
    a, _, b = text.lower().partition("x")
    return (int(a), int(b or a))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few rounds (smoke run)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="timing rounds (default 15 forward, 7 training; quick 3)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads for the wall-clock tables (default: torch's)")
    parser.add_argument("--block-size", action="append", type=parse_block, default=None,
                        help="tiled block size BQxBK (repeatable; default: the library default)")
    parser.add_argument("--wait-quiet", type=float, default=0.0,
                        help="wait up to this many seconds for the load average to drop below 2.5")
    parser.add_argument("--only", choices=("forward", "training"), default=None)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-time", action="store_true")
    parser.add_argument("--child-memory", nargs=2, metavar=("METHOD", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--causal", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--training", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    block_sizes = args.block_size or [DEFAULT_BLOCK_SIZE]
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.child_memory:
        child_memory(args.child_memory[0], int(args.child_memory[1]), args.causal,
                     block_sizes[0], args.training)
        return 0

    print(f"# tiled_attention vs F.scaled_dot_product_attention (torch {torch.__version__}), "
          f"B={BATCH}, H={HEADS}, d={HEAD_DIM}, float32; default block size "
          f"{DEFAULT_BLOCK_SIZE}; {os.cpu_count()} CPUs")
    ok = True
    for training in (False, True):
        if args.only is not None and training != (args.only == "training"):
            continue
        ok &= run_half(args, block_sizes, training)
    return 0 if ok or args.quick else 1


def run_half(args: argparse.Namespace, block_sizes: list[tuple[int, int]], training: bool) -> bool:
    """Time and memory tables of the forward pass, or of forward + backward."""
    what, target = ("forward + backward", 2.0) if training else ("forward", 1.5)
    time_sizes = [256, 512, 1024] if args.quick else [1024, 2048, 4096]
    if args.quick:
        mem_sizes = [256, 512, 1024]
    else:
        mem_sizes = [1024, 2048, 4096, 8192] if training else [512, 1024, 2048, 4096, 8192, 16384]
    naive_max = 1024 if args.quick else (4096 if training else 8192)
    rounds = args.rounds or (3 if args.quick else (7 if training else 15))
    ok = True
    if not args.skip_time:
        label = f"tiled {block_sizes[0][0]}x{block_sizes[0][1]}"
        for threads, clock in ((args.threads, "wall"), (1, "cpu")):
            if args.wait_quiet:
                wait_until_quiet(args.wait_quiet, 2.5)
            ratios = time_table(time_sizes, block_sizes, rounds, threads, clock, training)
            worst = max(ratios[(n, False, label)] for n in time_sizes)
            ok &= worst <= target
            print(f"\ntarget {what} time ratio <= {target} ({clock} clock, non-causal, N in "
                  f"{time_sizes}): worst {worst:.2f} -> {verdict(worst <= target, args.quick)}")
    if not args.skip_memory:
        mem = memory_table(mem_sizes, naive_max, block_sizes[0], args.threads, training)
        n_ref = 1024 if args.quick else 4096
        share = mem[("tiled", n_ref)] / mem[("naive", n_ref)]
        top, half = mem_sizes[-1], mem_sizes[-2]
        growth = mem[("tiled", top)] / mem[("tiled", half)]
        ok &= share <= 0.05 and growth <= 2.5
        print(f"\ntarget {what} tiled/naive memory <= 5% at N={n_ref}: {share:.1%} -> "
              f"{verdict(share <= 0.05, args.quick)}")
        print(f"target O(N) growth up to N={top}: tiled({top}) / tiled({half}) = {growth:.2f} "
              f"(<= 2.5) -> {verdict(growth <= 2.5, args.quick)}")
    return ok


def verdict(passed: bool, quick: bool) -> str:
    if quick:
        return "(quick run: sizes too small, the targets apply to the full run)"
    return "PASS" if passed else "FAIL"


if __name__ == "__main__":
    sys.exit(main())
