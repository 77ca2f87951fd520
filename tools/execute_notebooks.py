"""Re-execute book notebooks in place so that their stored outputs match the code.

Usage (from the repo root, inside the repo's virtual environment)::

    python tools/execute_notebooks.py                 # every notebook in book/
    python tools/execute_notebooks.py book/03_softmax.ipynb

Each notebook runs from a clean kernel with ``book/`` as working directory, the
same way nbval runs it. Widget state is *not* stored in the notebook metadata:
the built book must never load the ipywidgets JavaScript from a CDN, and the
slider explorers carry their own kernel-free HTML fallback instead.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"


def execute(path: Path, timeout: int = 600) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        store_widget_state=False,
        record_timing=False,  # no per-cell timestamps: re-executions diff cleanly
    )
    client.execute()
    elapsed = time.perf_counter() - start
    nb.metadata.pop("widgets", None)
    nb.metadata["kernelspec"] = {
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
        "name": "python3",
    }
    nbformat.write(nb, path)
    return elapsed


def main(argv: list[str]) -> int:
    paths = [Path(a).resolve() for a in argv] or sorted(BOOK.glob("*.ipynb"))
    for path in paths:
        elapsed = execute(path)
        print(f"{path.relative_to(ROOT)}: executed in {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
