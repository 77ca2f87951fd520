"""The API reference: every signature reads as Python's, and every "Explained in
chapter N" note of a docstring links to chapter N.

Issue 44, item 1: 79 of 241 signatures read ``causal_mask(q_len, =k_lenNone, *, =offset0)``
in both editions (book/_ext/afs_site.py marked the signature's inline parts untranslatable,
and Sphinx then moved them to the end of their parameter). Each signature is read in the
browser, as shown, and compared with ``inspect.signature`` (signatures.py).

book/_ext/afs_site.py turns the chapters each note names into ``:doc:`` links at build time
(autodoc-process-docstring), so Sphinx resolves them in each edition; the docstrings stay
in English in both. Issue 29, item 9: 41 of 46 notes were plain text.
"""

from __future__ import annotations

import re
from urllib.parse import urljoin

import pytest
from bookpages import PAGES, built_html
from signatures import SIGNATURES_JS, compare, shown

API = next(d for d in PAGES if d.endswith("/api") or d == "api")
# The reference's pages: the index page and one page per part of the library.
API_PAGES = [d for d in PAGES if re.search(r"(?:^|/)api(?:$|/|_)", d)]
CHAPTER_FILE = re.compile(r"(?:^|/)(\d+)_[^/#]*\.html(?:#.*)?$")
MENTION = re.compile(r"\bchapters?\s+((?:\d+(?:,\s+|\s+and\s+|\s+or\s+|-))*\d+)")


def notes(html: str) -> list[object]:
    """The docstrings' "Explained in ..." paragraphs of the page."""
    from bs4 import BeautifulSoup

    article = BeautifulSoup(html, "html.parser").select_one("article")
    return [
        p
        for p in article.select("p.afs-docstring")
        if " ".join(p.get_text().split()).startswith("Explained in")
    ]


def unlinked(note: object, page_url: str) -> list[str]:
    """Chapter numbers the note names without a link to that chapter's page."""
    linked = set()
    for a in note.select("a[href]"):
        m = CHAPTER_FILE.search(urljoin(page_url, a["href"]))
        if m and re.search(rf"\b{int(m.group(1))}\b", a.get_text()):
            linked.add(int(m.group(1)))
    text = " ".join(note.get_text().split())
    named = {int(n) for m in MENTION.finditer(text) for n in re.findall(r"\d+", m.group(1))}
    return [f"chapter {n}" for n in sorted(named - linked)]


@pytest.mark.parametrize("api_page", API_PAGES)
def test_every_signature_reads_as_pythons(loaded, api_page: str) -> None:
    signatures = loaded(api_page).page.evaluate(SIGNATURES_JS)
    count, wrong = compare(signatures)
    if api_page == API and API_PAGES == [API]:
        assert count >= 200, f"{api_page}: only {count} signatures found"
    assert not wrong, f"{len(wrong)} of {count} signatures differ from Python's: {wrong[:5]}"


@pytest.mark.parametrize(
    "old", ["attention_lib.causal_mask", "attention_lib.MultiHeadAttention.forward", "masks"]
)
def test_an_anchor_of_the_old_single_page_still_lands(tab, old: str) -> None:
    """Issue 44, item 6: book/api.html#<id> of the single page before the split goes to the
    page that now holds <id>, scrolled to it."""
    if API_PAGES == [API]:
        pytest.skip("the reference is one page")
    tab.open(API, query=f"#{old}")
    page = tab.page
    page.wait_for_function("(id) => document.getElementById(id) !== null", arg=old)
    assert re.search(r"/api_\w+\.html$", page.url.split("#")[0]), page.url
    top = page.evaluate("(id) => document.getElementById(id).getBoundingClientRect().top", old)
    assert -2 <= top < 900, f"{old} at {top} px on {page.url}"


def test_the_signature_check_reads_a_garbled_signature() -> None:
    garbled = "attention_lib.causal_mask(q_len, =k_lenNone, *, =offset0, =windowNone)\u00b6"
    assert shown(garbled) == "q_len, =k_lenNone, *, =offset0, =windowNone"
    count, wrong = compare([["attention_lib.causal_mask", garbled]])
    assert count == 1 and len(wrong) == 1


def test_every_explained_in_note_links_to_its_chapters() -> None:
    found, missing, links = 0, [], 0
    for api_page in API_PAGES:
        page_notes = notes(built_html(api_page))
        found += len(page_notes)
        page_url = f"http://book/{api_page}.html"
        for note in page_notes:
            links += len(note.select("a[href]"))
            if unlinked(note, page_url):
                missing.append((" ".join(note.get_text().split())[:60], unlinked(note, page_url)))
    assert found >= 40, f"{API_PAGES}: only {found} 'Explained in' notes found"
    assert not missing, f"{len(missing)} of {found} notes name unlinked chapters: {missing}"
    assert links >= found, f"{links} chapter links in {found} notes"


def test_the_check_finds_a_plain_chapter_number() -> None:
    from bs4 import BeautifulSoup

    note = BeautifulSoup(
        '<p class="afs-docstring">Explained in <a href="06_multi_head.html">chapter 6</a>, '
        "<em>Multi-head</em>; backends in chapters 9 and "
        '<a href="11_efficient_attention.html#x">11</a>.</p>',
        "html.parser",
    ).p
    assert unlinked(note, "http://book/book/api.html") == ["chapter 9"]
