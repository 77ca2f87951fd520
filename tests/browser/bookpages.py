"""What the browser suite reads: the book's pages (from `_toc.yml`) and its settings.

Shared by conftest.py and the test modules. The suite reads one edition of the book per
run: AFS_EDITION=en (the default; English, at the root of the site) or AFS_EDITION=zh (the
Chinese edition under zh/); `make browser` runs it once for each. The whole site is served
either way, so the links between the editions can be followed. Environment overrides, for
debugging the suite against another build only: AFS_BOOK_DIR (folder with
`_toc.yml`/`_config.yml` and the sources), AFS_HTML_DIR (the built site),
AFS_CHROMIUM (browser executable).
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "book"))

from book_urls import load_config, source_suffix, toc_entries  # noqa: E402

BOOK_DIR = Path(os.environ.get("AFS_BOOK_DIR", ROOT))
SITE_DIR = Path(os.environ.get("AFS_HTML_DIR", BOOK_DIR / "_build" / "html"))
# Edition -> its folder in the site (tools/build_book.py builds both).
EDITIONS = {"en": "", "zh": "zh/"}
EDITION = os.environ.get("AFS_EDITION", "en")
if EDITION not in EDITIONS:
    raise ValueError(f"AFS_EDITION must be one of {sorted(EDITIONS)}, got {EDITION!r}")
HTML_DIR = SITE_DIR / EDITIONS[EDITION]  # this edition's pages
FAILURES = ROOT / "_build" / "browser-failures" / EDITION
CHROMIUM = os.environ.get("AFS_CHROMIUM", "/usr/bin/chromium")

PAGES = toc_entries(BOOK_DIR / "_toc.yml")
CONFIG = load_config(BOOK_DIR / "_config.yml")


def suffix_of(docname: str) -> str:
    return source_suffix(docname, BOOK_DIR)


def source_path(docname: str) -> Path:
    return BOOK_DIR / f"{docname}{suffix_of(docname)}"


NOTEBOOK_PAGES = [d for d in PAGES if suffix_of(d) == ".ipynb"]


def built_html(docname: str) -> str:
    """The built page's HTML as a file ("" if it was not built)."""
    path = HTML_DIR / f"{docname}.html"
    return path.read_text(encoding="utf-8") if path.exists() else ""


def pages_with_sliders() -> list[str]:
    """TOC pages whose built HTML contains a kernel-free slider explorer."""
    return [d for d in PAGES if 'class="afs-explorer"' in built_html(d)]


def source_title(docname: str) -> str:
    """The text of the page's H1 in its source (notebook or Markdown)."""
    path = source_path(docname)
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    else:
        text = path.read_text()
    match = re.search(r"^# (.+)$", text, re.M)
    assert match, f"{path.name} has no H1"
    return match.group(1)


def translated(docname: str, english: str) -> str:
    """``english`` (a message of the page) as this edition shows it."""
    if EDITION == "en":
        return english
    path = BOOK_DIR / "locale" / "zh_CN" / "LC_MESSAGES" / f"{docname}.po"
    return re.sub(r"^(\d+)\\\.", r"\1.", _translation(path, english))  # "3\. ..." -> "3. ..."


def ui_label(english: str) -> str:
    """A label of the site's chrome (a button's title, say) as this edition shows it.

    The Chinese edition takes it from its catalogs of the themes' labels
    (locale/zh_CN/LC_MESSAGES/sphinx.po and booktheme.po), else from book/_ext/afs_site.py's
    table of what no catalog reaches, else from the theme's own zh_CN catalog.
    """
    if EDITION == "en":
        return english
    from babel.messages.pofile import read_po

    for name in ("sphinx", "booktheme"):
        po = BOOK_DIR / "locale" / "zh_CN" / "LC_MESSAGES" / f"{name}.po"
        if po.exists():
            with po.open("rb") as f:
                message = read_po(f).get(english)
            if message is not None and message.string:
                return message.string
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    from afs_site import CHROME_ZH

    if english in CHROME_ZH:
        return CHROME_ZH[english]
    import sphinx_book_theme

    po = Path(sphinx_book_theme.__file__).parent / (
        "theme/sphinx_book_theme/static/locales/zh_CN/LC_MESSAGES/booktheme.po"
    )
    return _translation(po, english)


def _translation(po: Path, english: str) -> str:
    """The translation of ``english`` in the catalog ``po`` (fails when there is none)."""
    from babel.messages.pofile import read_po

    with po.open("rb") as f:
        message = read_po(f).get(english)
    assert message is not None and message.string, f"{po}: no translation of {english!r}"
    return message.string


def page_title(docname: str) -> str:
    """The H1 the page should show in this edition."""
    return translated(docname, source_title(docname))


def is_placeholder(docname: str) -> bool:
    return "PLACEHOLDER" in source_path(docname).read_text()


@dataclass
class Tab:
    """A page of the book in a fresh browser context, with what went wrong on it."""

    page: object  # playwright.sync_api.Page
    base_url: str
    blocked: list[str] = field(default_factory=list)
    console_errors: list[tuple[str, str]] = field(default_factory=list)  # (text, source url)
    page_errors: list[str] = field(default_factory=list)
    # Requests of the book's own host that failed (an HTTP error status, or no answer).
    failed: list[str] = field(default_factory=list)  # "404 <url>" or "<error> <url>"
    response: object = None  # of the first load, for pages loaded once per session

    def url(self, docname: str) -> str:
        return f"{self.base_url}{docname}.html"

    def open(self, docname: str, query: str = ""):
        response = self.page.goto(self.url(docname) + query, wait_until="load")
        assert response is not None, f"no response for {docname}"
        return response
