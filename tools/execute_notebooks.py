"""Re-execute book notebooks in place so that their stored outputs match the code.

Usage (from the repo root, inside the repo's virtual environment)::

    python tools/execute_notebooks.py                 # every notebook in book/
    python tools/execute_notebooks.py book/03_softmax.ipynb

Each notebook runs from a clean kernel with ``book/`` as working directory, the
same way nbval runs it. Widget state is *not* stored in the notebook metadata:
the built book must never load the ipywidgets JavaScript from a CDN, and the
slider explorers carry their own kernel-free HTML fallback instead.

Consecutive stream outputs of one cell with the same name (stdout, stderr) are merged
into one, as nbconvert's ``CoalesceStreamsPreprocessor`` does: the kernel flushes a
cell's printed text in pieces whose number depends on timing, and each piece would be a
separate output box in the book (a printed table split over several boxes). nbval
compares the same text: it merges a cell's streams of one name before comparing, in the
stored notebook and in its own run (``nbval.plugin.coalesce_streams``).
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"


# A carriage return that a later character overwrites (nbconvert's CR_PAT).
_CR = re.compile(r".*\r(?=[^\n])")


def coalesce_streams(outputs: list) -> list:
    """``outputs`` with each run of consecutive stream outputs of one name merged into one
    (and text overwritten by a carriage return dropped), as nbconvert's
    ``CoalesceStreamsPreprocessor``; other outputs are kept, in order."""
    merged: list = []
    for output in outputs:
        last = merged[-1] if merged else None
        if (
            output.get("output_type") == "stream"
            and last is not None
            and last.get("output_type") == "stream"
            and last.get("name") == output.get("name")
        ):
            last["text"] += output["text"]
        else:
            merged.append(output)
    for output in merged:
        if output.get("output_type") == "stream" and "\r" in output["text"]:
            output["text"] = _CR.sub("", output["text"])
    return merged


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
    for cell in nb.cells:
        if cell.get("outputs"):
            cell.outputs = coalesce_streams(cell.outputs)
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
