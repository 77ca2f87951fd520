"""nbval on another CPU: re-run every notebook under a kernel dispatch that is not this
machine's own, one thread per kernel, and compare with the stored outputs.

Usage (from the repository root, inside the repository's virtual environment)::

    python tools/nbval_portable.py                        # `make nbval-portable`
    python tools/nbval_portable.py book/17_latent_and_sparse_attention.ipynb
    python tools/nbval_portable.py --native               # `make nbval`

The notebooks were executed on one machine; a reader re-runs them on another, whose
CPU picks other SIMD kernels (PyTorch's ``ATEN_CPU_CAPABILITY``: ``default``, ``avx2``,
``avx512``) and another number of threads. Their floats then differ in the last bits,
and any printed digit that depends on those bits fails nbval there. This pass stands in
for that other machine: every notebook runs with ``OMP_NUM_THREADS=1`` under
``ATEN_CPU_CAPABILITY=default`` and, where the CPU has AVX-512, under ``avx2`` too.
Notebooks run as separate pytest processes, two at a time (each has one thread), later
chapters (the longer runs) first; the closing line counts the cells: ``N passed, N failed``.

A cell's printed text is compared as one text per stream: nbval merges every stdout (and
every stderr) output of a cell before comparing, in the stored notebook and in its own run
(``nbval.plugin.coalesce_streams``), so the number of pieces the kernel flushed, which
depends on timing, never matters; tools/execute_notebooks.py stores the consecutive pieces
merged (one output box in the book). Figures are not compared (nbval skips ``image/png``
and every output's metadata, where a figure's phone rendition is stored).

``--native`` is plain nbval, as this machine runs it: its own kernel dispatch and
PyTorch's default number of threads, nothing in the environment changed, only two
notebooks at a time (one notebook keeps about one core busy: its tensors are small).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBVAL = [
    "--nbval",
    "--nbval-sanitize-with",
    "tests/book/nbval_sanitize.cfg",
    "-p",
    "no:cacheprovider",
    "-q",
]
WORKERS = 2


def dispatches(cpuinfo: str) -> list[str]:
    """The kernel dispatches other than this CPU's best one."""
    flags = set(cpuinfo.split())
    return ["default", "avx2"] if "avx512f" in flags else ["default"]


NATIVE = "native"  # this CPU's own dispatch and threads: the environment as it is


def run(path: Path, capability: str) -> tuple[Path, str, int, int, float, str]:
    env = dict(os.environ)
    if capability != NATIVE:
        env.update(ATEN_CPU_CAPABILITY=capability, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(path.relative_to(ROOT)), *NBVAL],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    elapsed = time.perf_counter() - start
    tail = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    passed = failed = 0
    for part in tail.replace(" in ", ", ").split(", "):
        words = part.split()
        if len(words) == 2 and words[0].isdigit():
            if words[1] == "passed":
                passed = int(words[0])
            elif words[1] in ("failed", "errors", "error"):
                failed += int(words[0])
    if result.returncode != 0 and failed == 0:
        failed = 1  # the run broke before counting (a kernel died, a collection error)
    return path, capability, passed, failed, elapsed, result.stdout + result.stderr


def main(argv: list[str]) -> int:
    native = "--native" in argv
    argv = [a for a in argv if a != "--native"]
    paths = [Path(a).resolve() for a in argv] or sorted((ROOT / "book").glob("*.ipynb"))
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    jobs = [(p, c) for c in ([NATIVE] if native else dispatches(cpuinfo)) for p in paths]
    # Later chapters first: they train and run the longest, so the two workers end
    # together on the short early chapters.
    jobs.sort(key=lambda job: job[0].name, reverse=True)
    total_passed = total_failed = 0
    start = time.perf_counter()
    with ThreadPoolExecutor(WORKERS) as pool:
        for path, cap, passed, failed, elapsed, log in pool.map(lambda j: run(*j), jobs):
            total_passed += passed
            total_failed += failed
            status = "ok" if failed == 0 else "FAILED"
            name = path.relative_to(ROOT)
            how = "this CPU's dispatch and threads" if cap == NATIVE else f"{cap}, 1 thread"
            print(
                f"{name} [{how}]: {passed} passed, {failed} failed in {elapsed:.0f} s: {status}",
                flush=True,
            )
            if failed:
                print(log)
    print(f"nbval{'' if native else '-portable'}: {time.perf_counter() - start:.0f} s")
    print(f"{total_passed} passed, {total_failed} failed")
    return 1 if total_failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
