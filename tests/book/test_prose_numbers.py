"""Every number a chapter's prose quotes comes from the chapter itself, or from a paper.

A number in a markdown cell (a decimal such as ``0.178``, ``3.4`` or ``1e-5``, a
percentage, or a whole number of three or more digits such as ``2,250``) must appear
in one of the chapter's stored outputs or in its code (a parameter it sets, a value it
asserts or glues). The outputs of a cell tagged ``nbval-ignore-output`` (timings,
bandwidths: they differ on every machine) do not count: prose that quoted them would
be true only of the machine that executed the notebook. Numbers quoted from papers or model cards are listed, with their
source, in ``prose_numbers_allowed.txt`` next to this file. Years, equation and
section numbers, link targets and maths are not read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = Path(__file__).with_name("prose_numbers_allowed.txt")
IGNORED = "nbval-ignore-output"
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))

NUMBER = re.compile(
    r"(?<![\w.,/-])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?e-?\d+|\d+\.\d+|\d+(?=\s?%)|\d{3,})"
)
SKIP = [
    re.compile(p, re.S)
    for p in (
        r"\$\$.*?\$\$",  # display maths
        r"\$[^$\n]+\$",  # inline maths
        r"`[^`\n]+`",  # code spans
        r"\]\([^)]*\)",  # link targets
        r"\{[a-z]+\}`[^`]*`",  # roles: {cite}`...`, {py:func}`...`
        r"<[^>]+>",  # html
        r"\b(?:19|20)\d\d[a-z]?\b",  # years
    )
]


def _allowed() -> dict[str, set[str]]:
    allowed: dict[str, set[str]] = {}
    for line in ALLOWED.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            chapter, number = line.split(":", 2)[:2]
            allowed.setdefault(chapter.strip(), set()).add(number.strip())
    return allowed


def _plain(number: str) -> str:
    return number.replace(",", "").replace(" ", "").rstrip("%")


def quoted_numbers(markdown: str) -> list[str]:
    for pattern in SKIP:
        markdown = pattern.sub(" ", markdown)
    return [m.group(1) for m in NUMBER.finditer(markdown)]


def _sources(cells: list[dict]) -> str:
    """The chapter's code and the text it stored as output, commas removed.

    Outputs that nbval does not compare (``nbval-ignore-output``) are left out.
    """
    parts = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        parts.append("".join(cell["source"]))
        if IGNORED in cell.get("metadata", {}).get("tags", []):
            continue
        for output in cell.get("outputs", []):
            parts.append("".join(output.get("text", "")))
            for kind in ("text/plain", "text/markdown", "text/html"):
                if kind in output.get("data", {}) and "base64" not in kind:
                    data = output["data"][kind]
                    parts.append(data if isinstance(data, str) else "".join(data))
    return "\n".join(parts).replace(",", "")


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_prose_numbers_come_from_the_notebook_or_a_paper(path: Path) -> None:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    sources = _sources(cells)
    allowed = _allowed().get(path.stem, set())
    unsourced = []
    for cell in cells:
        if cell["cell_type"] != "markdown":
            continue
        for number in quoted_numbers("".join(cell["source"])):
            if _plain(number) not in sources and number not in allowed:
                unsourced.append(number)
    assert unsourced == [], (
        f"{path.name}: numbers in the prose that no output, code or paper gives: "
        f"{unsourced} (print, assert or glue them, or list a paper's figure in "
        f"{ALLOWED.name})"
    )


def test_the_reader_finds_numbers_and_skips_maths_and_links() -> None:
    text = "It reaches 0.168 (2,250 tokens/s, 5.8x, 41%) in 2023; $d_k = 512$ [a](b_1.0)"
    assert quoted_numbers(text) == ["0.168", "2,250", "5.8", "41"]


def test_outputs_nbval_ignores_are_not_sources() -> None:
    timed = {
        "cell_type": "code",
        "source": ["t = run()"],
        "metadata": {"tags": [IGNORED]},
        "outputs": [{"output_type": "stream", "text": "4.08 ms per step"}],
    }
    kept = {
        "cell_type": "code",
        "source": ["print(x)"],
        "metadata": {},
        "outputs": [{"output_type": "stream", "text": "2.47 ms per step"}],
    }
    sources = _sources([timed, kept])
    assert "4.08" not in sources and "2.47" in sources and "t = run()" in sources
