"""Every page of `_toc.yml`, read in headless Chromium with no network beyond 127.0.0.1."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from allowed_errors import problems
from bookpages import (
    BOOK_DIR,
    CONFIG,
    EDITION,
    PAGES,
    Tab,
    is_placeholder,
    page_title,
    suffix_of,
    ui_label,
)

from book_urls import expected_urls


def words(text: str) -> list[str]:
    """Plain words of a title: no math, no code marks, no emphasis, no numbers.

    A run of Chinese characters counts as one word.
    """
    text = re.sub(r"\$[^$]*\$", " ", text)
    return re.findall(r"[A-Za-z][A-Za-z'-]+|[\u3400-\u9fff]+", text)


def titled(title: str) -> str:
    """CSS for a header button by its English title, as this edition shows it.

    (Bootstrap moves `title` into a data attribute.)
    """
    title = ui_label(title)
    return f':is([title="{title}"], [data-bs-original-title="{title}"])'


def test_index_redirects_to_the_root_page(tab: Tab) -> None:
    response = tab.page.goto(tab.base_url, wait_until="load")
    assert response is not None and response.status == 200
    tab.page.wait_for_url(re.compile(re.escape(tab.url(PAGES[0]))))


def test_page_loads_with_its_title(loaded, docname: str) -> None:
    tab = loaded(docname)
    assert tab.response.status == 200, f"{docname}: HTTP {tab.response.status}"
    assert tab.page.url == tab.url(docname)
    h1 = tab.page.locator("article h1")
    assert h1.count() == 1, f"{docname}: {h1.count()} H1 headings in the article"
    # MyST's smartquotes print the source's ' as a typographic apostrophe.
    shown = h1.inner_text().replace("\u2019", "'")
    title = page_title(docname)  # the source's H1, or its translation
    missing = [w for w in words(title) if w not in shown]
    assert words(title) and not missing, f"{docname}: title {shown!r} lacks {missing} of {title!r}"


def test_no_console_errors_and_no_failed_requests(loaded, loaded_phone, docname: str) -> None:
    """On a reader's first visit, at 1280 x 900 and at 390 x 844 (allowed_errors.py)."""
    for where, tab in (("desktop", loaded(docname)), ("phone", loaded_phone(docname))):
        assert not problems(tab), f"{docname} on a {where}: {problems(tab)}"


def test_the_page_has_a_local_favicon(loaded, docname: str) -> None:
    """Without one, browsers ask the server for /favicon.ico, which is not there."""
    tab = loaded(docname)
    hrefs = tab.page.evaluate(
        "() => [...document.querySelectorAll('link[rel~=\"icon\"]')].map(l => l.href)"
    )
    assert len(hrefs) == 1 and hrefs[0].startswith(tab.base_url), f"{docname}: icons {hrefs}"
    response = tab.page.request.get(hrefs[0])
    assert response.ok and response.headers["content-type"].startswith("image/"), hrefs[0]


def test_math_is_typeset_offline(loaded, docname: str) -> None:
    tab = loaded(docname)
    if tab.page.locator("article .math").count() == 0:
        pytest.skip("no math on this page")
    mathjax = tab.page.evaluate(
        "() => [...document.scripts].map(s => s.src).filter(s => /mathjax/i.test(s))"
    )
    assert mathjax and all(s.startswith(tab.base_url) for s in mathjax), (
        f"{docname}: MathJax must come with the book, not from another host: {mathjax}"
    )
    # MathJax turns the TeX of every .math element into an <mjx-container>.
    tab.page.wait_for_function(
        "() => [...document.querySelectorAll('article .math')]"
        ".every(m => m.querySelector('mjx-container'))",
        timeout=10_000,
    )


def test_chapter_is_numbered_once(loaded, notebook: str) -> None:
    if is_placeholder(notebook):
        pytest.skip("placeholder notebook: chapter not written yet")
    number = int(re.match(r"(\d+)_", Path(notebook).name).group(1))
    tab = loaded(notebook)
    shown = " ".join(tab.page.locator("article h1").inner_text().split())
    assert shown.startswith(f"{number}. "), f"{notebook}: title {shown!r} is not numbered {number}"
    assert not re.match(r"^(\d+)\.\s+\1\.", shown), f"{notebook}: number shown twice: {shown!r}"
    nav = " ".join(tab.page.locator("nav.bd-docs-nav li.current > a").last.inner_text().split())
    assert nav.startswith(f"{number}. ") and not re.match(r"^(\d+)\.\s+\1\.", nav), nav


def test_no_dead_widgets_and_no_widget_cdn(loaded, docname: str) -> None:
    tab = loaded(docname)
    found = tab.page.evaluate(
        """() => ({
            views: document.querySelectorAll(
                'script[type^="application/vnd.jupyter.widget"]').length,
            boxes: document.querySelectorAll(
                '.jupyter-widgets, .widget-area, .widget-subarea, .afs-explorer-live').length,
            scripts: [...document.querySelectorAll('script[src]')].map(s => s.src).filter(
                s => /require(\\.min)?\\.js|@jupyter-widgets|html-manager|embed-amd|ipywidgets/.test(s)),
            text: /application\\/vnd\\.jupyter\\.widget|Loading widget|Error displaying widget/
                .test(document.body.innerText),
        })"""
    )
    assert found == {"views": 0, "boxes": 0, "scripts": [], "text": False}, f"{docname}: {found}"


# The header buttons, by their English titles.
BUTTONS = [
    "Source repository",
    "Suggest edit",
    "Open an issue",
    "Download source file",
    "Launch on Binder",
    "Launch on Colab",
]


def test_header_buttons_carry_the_configured_urls(loaded, docname: str) -> None:
    tab = loaded(docname)
    suffix = suffix_of(docname)
    want = expected_urls(CONFIG, docname, suffix)
    got = tab.page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll('.article-header-buttons a')]
            .map(a => [a.title || a.dataset.bsOriginalTitle, a.getAttribute('href')]))"""
    )
    got = {title: got.get(ui_label(title)) for title in BUTTONS}
    assert got["Source repository"] == want.repository, got
    assert got["Suggest edit"] == want.edit, got
    assert (got["Open an issue"] or "").startswith(want.issues_prefix), got
    assert got["Download source file"] == "../" * docname.count("/") + want.download, got
    if suffix == ".ipynb":
        assert got["Launch on Binder"] == want.binder, got
        assert got["Launch on Colab"] == want.colab, got
    else:
        assert got["Launch on Binder"] is None and got["Launch on Colab"] is None, got


def test_launch_menu_shows_binder_and_colab(loaded, notebook: str) -> None:
    page = loaded(notebook).page
    colab = page.locator(f".dropdown-launch-buttons a{titled('Launch on Colab')}")
    binder = page.locator(f".dropdown-launch-buttons a{titled('Launch on Binder')}")
    toggle = page.locator(".dropdown-launch-buttons button.dropdown-toggle")
    assert not colab.is_visible()  # folded away until the reader opens the rocket menu
    toggle.click()
    try:
        colab.wait_for(state="visible")
        assert binder.is_visible()
        for link in (colab, binder):
            box = link.bounding_box()
            assert box and box["width"] > 0 and box["height"] > 0
            assert link.get_attribute("target") == "_blank"
            assert link.locator("img").evaluate("i => i.naturalWidth") > 0  # the service's logo
    finally:  # fold the menu again (it also opens on hover) for the next test on this page
        toggle.click()
        page.mouse.move(640, 600)
    colab.wait_for(state="hidden")


def test_download_button_serves_the_notebook(loaded, notebook: str) -> None:
    tab = loaded(notebook)
    href = tab.page.locator(
        f".article-header-buttons a{titled('Download source file')}"
    ).get_attribute("href")
    response = tab.page.request.get(tab.page.url.rsplit("/", 1)[0] + "/" + href)
    assert response.status == 200
    served = json.loads(response.body())
    source = json.loads((BOOK_DIR / f"{notebook}.ipynb").read_text())
    assert served["nbformat"] == 4
    assert served["cells"][0]["source"] == source["cells"][0]["source"]


def test_search_finds_softmax(tab: Tab) -> None:
    tab.open("search", "?q=softmax")
    results = tab.page.locator("#search-results ul.search li")
    results.first.wait_for(timeout=20_000)
    hrefs = [
        a.get_attribute("href") for a in tab.page.locator("#search-results ul.search li a").all()
    ]
    assert hrefs, "search for 'softmax' found nothing"
    softmax_pages = [d for d in PAGES if "softmax" in d]
    for docname in softmax_pages:  # the softmax chapter itself is among the results
        assert any(docname.split("/")[-1] + ".html" in h for h in hrefs), (docname, hrefs)
    assert not problems(tab), problems(tab)


@pytest.mark.skipif(EDITION != "zh", reason="a Chinese word is searched in the Chinese edition")
def test_search_finds_a_chinese_word(tab: Tab) -> None:
    """Sphinx indexes Chinese only when jieba splits it into words (requirements.txt)."""
    tab.open("search", "?q=注意力")
    results = tab.page.locator("#search-results ul.search li a")
    # Sphinx lists the results one by one (5 ms apart) and writes the count into
    # the summary when it has listed them all: count only then.
    tab.page.wait_for_function(
        "() => /\\d/.test(document.querySelector("
        "'#search-results .search-summary')?.innerText || '')",
        timeout=20_000,
    )
    hrefs = [a.get_attribute("href") for a in results.all()]
    chapters = [d for d in PAGES if re.match(r"\d+_", d.split("/")[-1])]
    found = [d for d in chapters if any(d.split("/")[-1] + ".html" in h for h in hrefs)]
    assert len(found) >= len(chapters) // 2, f"注意力 found {len(found)} chapters: {hrefs}"
    assert "注意力" in tab.page.locator("#search-results").inner_text()
    assert not problems(tab), problems(tab)


# The papers the book builds on: its bibliography page must list them (book/references.bib).
PAPERS = ["Attention Is All You Need", "FlashAttention"]


def test_bibliography_lists_the_papers(loaded) -> None:
    pages = [d for d in PAGES if d.endswith("bibliography")]
    assert pages, "_toc.yml has no bibliography page"
    text = loaded(pages[0]).page.locator("article").inner_text()
    missing = [p for p in PAPERS if p.lower() not in text.lower()]
    assert not missing, f"the bibliography lacks {missing}"
