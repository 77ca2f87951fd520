"""The book's structure: TOC coverage, notebook hygiene and the Colab cell."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())


def toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc.get("parts", toc.get("chapters", [])))
    return files


def test_there_are_chapter_notebooks() -> None:
    assert len(NOTEBOOKS) >= 1


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_is_in_the_toc(nb: Path) -> None:
    entry = str(nb.relative_to(ROOT).with_suffix(""))
    assert entry in toc_files(), f"{entry} is missing from _toc.yml"


@pytest.mark.parametrize("entry", toc_files())
def test_every_toc_entry_exists(entry: str) -> None:
    candidates = [ROOT / f"{entry}{ext}" for ext in (".ipynb", ".md")]
    assert any(p.exists() for p in candidates), f"_toc.yml lists {entry}, which does not exist"


def load(nb: Path) -> dict:
    return json.loads(nb.read_text(encoding="utf-8"))


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_hygiene(nb: Path) -> None:
    data = load(nb)
    # Stored widget state would make myst-nb load the ipywidgets JS from a CDN.
    assert "widgets" not in data["metadata"], f"{nb.name} stores widget state"
    code = [c for c in data["cells"] if c["cell_type"] == "code"]
    assert code, f"{nb.name} has no code cells"
    assert all(c.get("execution_count") is not None for c in code), (
        f"{nb.name} has unexecuted code cells: run `make execute NB=book/{nb.name}`"
    )
    errors = [o for c in code for o in c["outputs"] if o["output_type"] == "error"]
    assert not errors, f"{nb.name} has stored error outputs"
    h1 = [
        line
        for c in data["cells"]
        if c["cell_type"] == "markdown"
        for line in "".join(c["source"]).splitlines()
        if line.startswith("# ")
    ]
    assert len(h1) == 1, f"{nb.name} must have exactly one H1 title, has {h1}"
    assert nb.stat().st_size < 2_000_000, f"{nb.name} is {nb.stat().st_size} bytes"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_starts_with_the_colab_install_cell(nb: Path) -> None:
    first = load(nb)["cells"][0]
    source = "".join(first["source"])
    assert first["cell_type"] == "code"
    assert "remove-cell" in first["metadata"].get("tags", [])
    assert 'if "google.colab" in sys.modules:' in source
    # It installs the library only: torch and ipywidgets are already on Colab.
    assert "--no-deps" in source
    match = re.search(r"git\+(\S+?)@(\w+)\"", source)
    assert match, source
    assert match.group(1) == CONFIG["repository"]["url"]
    assert match.group(2) == CONFIG["repository"]["branch"]
    assert first["outputs"] == []


def test_pyproject_does_not_let_pip_pick_a_torch_build() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"dependencies\s*=\s*\[(.*?)\]", text, re.S).group(1)
    assert "torch" not in deps


def test_requirements_pin_torch_and_jupyter_book() -> None:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    assert "torch==2.13.0" in lines
    assert "jupyter-book==1.0.4.post1" in lines
    assert not any(line.startswith("--extra-index-url") for line in lines)
