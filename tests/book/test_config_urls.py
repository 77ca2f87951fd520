"""One setting re-points every launch, edit, issue and download URL of the book.

Builds a two-page book (an intro and one tiny notebook) in a temporary folder with the
project's own `_config.yml`, changed in `repository.url` and `repository.branch` only, and
checks that every such URL on the built pages follows the new values and that the old
repository appears nowhere. The browser suite checks the real book against the real values.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml
from bs4 import BeautifulSoup

from book_urls import ROOT, expected_urls, load_config, owner_and_repo

NEW_URL = "https://github.com/renamed-owner/renamed-book"
NEW_BRANCH = "release-2"


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    src = tmp_path_factory.mktemp("book")
    config = load_config()
    config["repository"]["url"] = NEW_URL
    config["repository"]["branch"] = NEW_BRANCH
    (src / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    (src / "_toc.yml").write_text(
        yaml.safe_dump(
            {"format": "jb-book", "root": "book/intro", "chapters": [{"file": "book/01_tiny"}]}
        )
    )
    book = src / "book"
    book.mkdir()
    # The book's own Sphinx extension, static files and templates, as _config.yml names them.
    sphinx = config.get("sphinx", {})
    folders = [
        *sphinx.get("local_extensions", {}).values(),
        *sphinx.get("config", {}).get("html_static_path", []),
        *sphinx.get("config", {}).get("templates_path", []),
    ]
    for folder in folders:
        shutil.copytree(ROOT / folder, src / folder)
    for bib in config.get("bibtex_bibfiles", []):
        (src / bib).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / bib, src / bib)
    (book / "intro.md").write_text("# Intro\n\nA page.\n")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# 1. Tiny"),
        nbformat.v4.new_code_cell(
            "1 + 1",
            execution_count=1,
            outputs=[
                nbformat.v4.new_output("execute_result", {"text/plain": "2"}, execution_count=1)
            ],
        ),
    ]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, book / "01_tiny.ipynb")

    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    proc = subprocess.run(
        [str(jupyter_book), "build", str(src), "-W", "-n", "--keep-going", "--builder", "html"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return config, src / "_build" / "html"


def links(page: Path) -> dict[str, str]:
    """href of every header button, keyed by its title."""
    soup = BeautifulSoup(page.read_text(), "html.parser")
    return {a["title"]: a["href"] for a in soup.select(".article-header-buttons a[title][href]")}


def test_the_rebuilt_config_really_differs() -> None:
    original = load_config()["repository"]
    assert owner_and_repo(original["url"]) != owner_and_repo(NEW_URL)
    assert original["branch"] != NEW_BRANCH


@pytest.mark.parametrize("docname, suffix", [("book/01_tiny", ".ipynb"), ("book/intro", ".md")])
def test_every_button_follows_the_repository_setting(rebuilt, docname: str, suffix: str) -> None:
    config, html = rebuilt
    want = expected_urls(config, docname, suffix)
    got = links(html / f"{docname}.html")
    assert got["Source repository"] == want.repository == NEW_URL
    assert got["Suggest edit"] == want.edit
    assert f"/edit/{NEW_BRANCH}/{docname}{suffix}" in got["Suggest edit"]
    assert got["Open an issue"].startswith(want.issues_prefix)
    assert got["Download source file"] == "../" + want.download
    if suffix == ".ipynb":
        assert got["Launch on Binder"] == want.binder
        assert got["Launch on Colab"] == want.colab
        assert (
            f"/renamed-owner/renamed-book/{NEW_BRANCH}?urlpath=lab/tree/book/01_tiny.ipynb"
            in want.binder
        )
        assert want.colab.endswith(
            f"/renamed-owner/renamed-book/blob/{NEW_BRANCH}/book/01_tiny.ipynb"
        )
    else:
        assert "Launch on Binder" not in got and "Launch on Colab" not in got


def test_the_old_repository_is_gone_from_every_page(rebuilt) -> None:
    _, html = rebuilt
    owner, name = owner_and_repo(load_config()["repository"]["url"])
    pages = list(html.rglob("*.html"))
    assert len(pages) >= 3
    for page in pages:
        text = page.read_text()
        assert f"{owner}/{name}" not in text, f"{page.name} still points at {owner}/{name}"
