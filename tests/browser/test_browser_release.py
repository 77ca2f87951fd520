"""Issue 44, item 9: a citable, versioned release and a PDF of every page.

The version of pyproject.toml is the one every page shows in its footer, attention_lib's
``__version__`` and CITATION.cff's; CHANGELOG.md exists; each page's download menu links
to its PDF and to the whole book's (written by ``make pdf``; when they are built, the
links resolve).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import pytest
import tomllib
from bookpages import EDITION, HTML_DIR, PAGES, ROOT, built_html

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]


def test_one_version_everywhere() -> None:
    import attention_lib

    assert attention_lib.__version__ == VERSION
    cff = (ROOT / "CITATION.cff").read_text(encoding="utf-8")
    assert re.search(rf'^version:\s*"?{re.escape(VERSION)}"?\s*$', cff, re.MULTILINE), cff
    assert "## " in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("page_name", PAGES[:1] + PAGES[-1:])
def test_every_page_shows_the_version(page_name: str) -> None:
    word = "版本" if EDITION == "zh" else "Version"
    assert f"{word} {VERSION}" in built_html(page_name), f"{page_name}: no '{word} {VERSION}'"


def test_the_download_menu_links_to_the_pdfs(loaded) -> None:
    chapter = next(d for d in PAGES if re.search(r"/\d+_", d))
    tab = loaded(chapter)
    links = tab.page.evaluate(
        "() => [...document.querySelectorAll('.dropdown-download-buttons a.afs-pdf-link')]"
        ".map(a => a.href)"
    )
    assert len(links) == 2, links
    assert links[0].endswith(f"/pdf/{chapter}.pdf"), links
    assert links[1].endswith(".pdf") and "/pdf/attention-from-scratch" in links[1], links
    site = HTML_DIR.parent if EDITION == "zh" else HTML_DIR
    files = [site / urlparse(u).path.lstrip("/") for u in links]
    if not all(Path(f).exists() for f in files):
        pytest.skip(f"the PDFs are not built (make pdf): {files}")
