"""A renamed page's old URL still lands on the page (book/redirects.json, written by
tools/renumber.py; book/_ext/afs_site.py puts a redirect page at each old URL).

Each edition (AFS_EDITION) is checked at its own old URLs: with JavaScript (the fragment is
kept) and without it (the meta refresh alone, as an offline reader with scripts off).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest
from bookpages import BOOK_DIR, HTML_DIR, PAGES, Tab

REDIRECTS = json.loads((BOOK_DIR / "book" / "redirects.json").read_text(encoding="utf-8"))
CASES = sorted(REDIRECTS.items()) or [
    pytest.param(
        None,
        None,
        marks=pytest.mark.skip(reason="book/redirects.json is empty: no page has been renamed"),
    )
]


@pytest.mark.parametrize("old, new", CASES)
def test_an_old_url_lands_on_the_new_page(tab: Tab, old: str, new: str) -> None:
    assert new in PAGES and old not in PAGES
    assert (HTML_DIR / f"{old}.html").exists(), f"no redirect page at {old}.html"
    tab.page.goto(tab.url(old) + "#summary", wait_until="load")
    tab.page.wait_for_url(re.compile(re.escape(tab.url(new)) + "#summary$"))
    assert tab.page.locator("h1").first.inner_text().strip()[:1].isdigit()
    assert not tab.failed and not tab.page_errors


@pytest.mark.parametrize("old, new", CASES)
def test_an_old_url_lands_on_the_new_page_without_javascript(
    tab_at: Callable[..., Tab], base_url: str, old: str, new: str
) -> None:
    from conftest import DESKTOP

    tab = tab_at(base_url, {**DESKTOP, "java_script_enabled": False})
    tab.page.goto(tab.url(old), wait_until="load")
    tab.page.wait_for_url(re.compile(re.escape(tab.url(new)) + "$"))
    assert tab.page.locator("h1").first.inner_text().strip()[:1].isdigit()
