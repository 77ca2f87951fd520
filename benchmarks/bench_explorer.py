"""Live redraw latency of the slider explorer (issue: "< 100 ms for a 16x16 heatmap").

Run from the repository root::

    .venv/bin/python benchmarks/bench_explorer.py [--repeats 15]

What is timed is exactly what a slider move does in a live kernel: the
``SliderExplorer`` observer calls ``draw(value)`` (here ``attention_heatmap`` of a
softmax with token labels on both axes), renders the figure to PNG, closes it and
replaces the ``ipywidgets.Image`` bytes. Widget messages to the browser and the
browser's repaint are not included (no front end here).

Both wall time and this process's CPU time are printed: on a shared machine the
wall time includes waiting for a core (the load average is printed too), while
the CPU time is close to what an idle machine would show. The baseline row is the
cheapest possible matplotlib equivalent (a bare ``imshow`` of the same matrix,
no labels or colourbar, saved to PNG at the same dpi), so ``x baseline`` is the
overhead of the book's labelled heatmap over plain matplotlib.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from attention_lib import attention_heatmap, explore  # noqa: E402
from attention_lib.show.explorer import DEFAULT_DPI  # noqa: E402

TARGET_MS = 100.0
TEMPERATURES = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0]


def _time(fn, repeats: int) -> tuple[list[float], list[float]]:
    """Wall and CPU milliseconds of ``repeats`` calls (after one warm-up call)."""
    fn(0)
    wall, cpu = [], []
    for r in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn(r + 1)
        cpu.append((time.process_time() - c0) * 1e3)
        wall.append((time.perf_counter() - w0) * 1e3)
    return wall, cpu


def _p90(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.9 * len(xs)))]


def bench(size: int, repeats: int, dpi: float) -> dict[str, float]:
    g = torch.Generator().manual_seed(size)
    scores = torch.randn(size, size, generator=g)  # (L, L)
    tokens = [f"t{i}" for i in range(size)]

    def draw(t: float):
        return attention_heatmap(torch.softmax(scores / t, dim=-1), tokens, tokens, title=f"T = {t:g}")

    build0 = time.perf_counter()
    ex = explore("temperature", TEMPERATURES, draw, dpi=dpi, max_html_bytes=10_000_000)
    build_s = time.perf_counter() - build0
    (slider,) = [c for c in ex.widget.children if hasattr(c, "options")]
    n = len(TEMPERATURES)

    def move(r: int) -> None:  # one slider move, as the front end sends it
        slider.value = (slider.value + 1) % n

    wall, cpu = _time(move, repeats)
    assert ex.redraw_count == repeats + 1

    weights = torch.softmax(scores, dim=-1).numpy()

    def baseline(r: int) -> None:
        fig, ax = plt.subplots(figsize=plt.figaspect(1.0) * 0.9)
        ax.imshow(weights, vmin=0, vmax=1)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi)
        plt.close(fig)

    base_wall, base_cpu = _time(baseline, repeats)
    return {
        "size": size,
        "wall_med": statistics.median(wall),
        "wall_p90": _p90(wall),
        "cpu_med": statistics.median(cpu),
        "base_cpu": statistics.median(base_cpu),
        "base_wall": statistics.median(base_wall),
        "frame_kb": statistics.mean(len(f) for f in ex.frames) / 1e3,
        "html_kb": len(ex.to_html().encode()) / 1e3,
        "frames": len(ex.frames),
        "build_s": build_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--dpi", type=float, default=DEFAULT_DPI)
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"explorer live redraw, dpi={args.dpi:g}, {args.repeats} moves per size, "
          f"{os.cpu_count()} CPUs, load average {load[0]:.2f} (1 min)")
    rows = [bench(size, args.repeats, args.dpi) for size in (16, 64)]
    header = (f"{'heatmap':>8} | {'wall med ms':>11} | {'wall p90 ms':>11} | {'CPU med ms':>10} | "
              f"{'CPU / 100 ms target':>19} | {'x baseline (CPU)':>16} | {'frame KB':>8} | "
              f"{'HTML KB (frames)':>16} | {'build s':>7}")
    print(header)
    print("-" * len(header))
    for r in rows:
        verdict = "ok" if r["cpu_med"] < TARGET_MS else "OVER"
        print(f"{r['size']:>3}x{r['size']:<4} | {r['wall_med']:>11.1f} | {r['wall_p90']:>11.1f} | "
              f"{r['cpu_med']:>10.1f} | {r['cpu_med'] / TARGET_MS:>15.2f} {verdict:>3} | "
              f"{r['cpu_med'] / r['base_cpu']:>16.2f} | {r['frame_kb']:>8.1f} | "
              f"{r['html_kb']:>9.1f} ({r['frames']:>2}) | {r['build_s']:>7.2f}")
    print("baseline (bare imshow -> PNG) CPU med ms: "
          + ", ".join(f"{r['size']}x{r['size']}: {r['base_cpu']:.1f}" for r in rows))
    if load[0] > (os.cpu_count() or 1):
        print("note: the machine is busy (load > CPUs); wall times include waiting for a core")


if __name__ == "__main__":
    main()
