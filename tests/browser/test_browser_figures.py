"""Every figure stored in a notebook's outputs shows up, visible, non-empty and legible.

Legible: at 1280 px the smallest text of every figure is at least about 9 CSS px. It is
computed from the image's natural and displayed widths, the resolution stored in the PNG,
and the font rule of attention_lib.show.style (or, for an explorer, the smallest font its
frames measured).
"""

from __future__ import annotations

import base64
import json
import struct
from urllib.parse import unquote, urlparse

import pytest
from bookpages import EDITION, NOTEBOOK_PAGES, SITE_DIR, built_html, source_path
from bs4 import BeautifulSoup

from attention_lib.show.style import COLUMN_PX, MIN_FONT_PT, MIN_TEXT_PX, text_css_px

# myst-nb's MIME priority for the html builder, with the widget view dropped as in
# _config.yml (nb_mime_priority_overrides): the first type a bundle has is rendered.
HTML_PRIORITY = [
    "application/javascript",
    "text/html",
    "image/svg+xml",
    "image/png",
    "image/jpeg",
    "text/markdown",
    "text/latex",
    "text/plain",
]
REMOVED = {"remove-cell", "remove_cell", "remove-output", "remove_output"}


def show_all_figures(page) -> None:
    """Open hidden outputs (closed <details>) and load the lazily loaded figures now, as a
    reader who scrolls through the page would; wait until every figure has loaded."""
    page.evaluate("""() => {
        document.querySelectorAll('article details').forEach(d => d.open = true);
        document.querySelectorAll('img[loading="lazy"]').forEach(i => i.loading = 'eager');
    }""")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.cell_output img')].every(i => i.complete)"
    )


def test_figures_load_lazily(notebook: str) -> None:
    # A cold page load fetches only the figures in view (book/_ext/afs_site.py).
    soup = BeautifulSoup(built_html(notebook), "html.parser")
    files = [i for i in soup.select("article img") if not i["src"].startswith("data:")]
    eager = [i["src"] for i in files if i.get("loading") != "lazy"]
    assert not eager, f"{notebook}: figures loaded eagerly: {eager}"


def stored_figures(notebook: str) -> int:
    """How many outputs of the notebook render as an image in the HTML book."""
    cells = json.loads(source_path(notebook).read_text())["cells"]
    count = 0
    for cell in cells:
        if cell["cell_type"] != "code" or REMOVED & set(cell["metadata"].get("tags", [])):
            continue
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            shown = next((m for m in HTML_PRIORITY if m in data), None)
            count += bool(shown and shown.startswith("image/"))
    return count


def test_every_stored_figure_is_visible(loaded, notebook: str) -> None:
    page = loaded(notebook).page
    # Outputs of cells tagged hide-output sit in closed <details>: open them, as a reader would.
    show_all_figures(page)
    # at 1280 px: the desktop figures (a phone rendition, .afs-phone, is hidden there)
    figures = page.locator(".cell_output img:not(.afs-explorer img):not(.afs-phone)")
    expected = stored_figures(notebook)
    assert figures.count() == expected, (
        f"{notebook}: {expected} figures stored in the notebook, {figures.count()} on the page"
    )
    for i in range(figures.count()):
        img = figures.nth(i)
        img.scroll_into_view_if_needed()
        assert img.is_visible(), f"{notebook}: figure {i} is hidden"
        natural = img.evaluate("i => [i.naturalWidth, i.naturalHeight]")
        assert natural[0] > 0 and natural[1] > 0, f"{notebook}: figure {i} did not decode"
        box = img.bounding_box()
        assert box and box["width"] > 0 and box["height"] > 0, f"{notebook}: figure {i} has no size"


# The figures a reader sees at 1280 px: every static figure, and the frame each explorer
# shows (its explorer records the smallest font of its frames, in points).
SHOWN_FIGURES_JS = """() => [...document.querySelectorAll('article .cell_output img')]
    .filter(i => i.offsetParent !== null && i.getBoundingClientRect().width > 0)
    .map(i => {
        const ex = i.closest('.afs-explorer');
        return {src: i.currentSrc || i.src, natural: i.naturalWidth,
                shown: i.getBoundingClientRect().width, alt: i.alt,
                font: ex ? ex.dataset.smallestFontPt ?? null : 'static'};
    })"""


def png_dpi(data: bytes) -> float | None:
    """The resolution a PNG was saved at (its pHYs chunk), in dots per inch."""
    at = data.find(b"pHYs")
    if at < 0:
        return None
    x, _, unit = struct.unpack(">IIB", data[at + 4 : at + 13])
    return x * 0.0254 if unit == 1 else None


def image_bytes(src: str) -> bytes:
    if src.startswith("data:"):
        return base64.b64decode(src.split(",", 1)[1])
    return (SITE_DIR / unquote(urlparse(src).path).lstrip("/")).read_bytes()


def test_book_column_is_the_width_the_figure_rules_assume(loaded) -> None:
    page = loaded(NOTEBOOK_PAGES[0]).page
    width = page.evaluate("""() => { const a = document.querySelector('article.bd-article');
        const s = getComputedStyle(a);
        return a.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight); }""")
    assert abs(width - COLUMN_PX) <= 2, (
        f"the text column is {width} px wide at 1280 px, attention_lib.show.style.COLUMN_PX "
        f"says {COLUMN_PX}: update it (the figure rules size figures for it)"
    )


def test_figure_text_is_legible_on_a_desktop(loaded, notebook: str) -> None:
    page = loaded(notebook).page
    show_all_figures(page)
    small = []
    for fig in page.evaluate(SHOWN_FIGURES_JS):
        where = fig["alt"][:40] or fig["src"].rsplit("/", 1)[-1][:24]
        dpi = png_dpi(image_bytes(fig["src"]))
        if dpi is None:
            small.append(f"{where}: no resolution recorded in the PNG")
            continue
        # Static figures follow the book's rule (use_book_style, attention_lib's plots):
        # no font below MIN_FONT_PT. An explorer measured its frames and says so.
        if fig["font"] in (None, ""):
            small.append(f"{where}: explorer made before the figure rules (re-execute)")
            continue
        font = MIN_FONT_PT if fig["font"] == "static" else float(fig["font"])
        px = text_css_px(font, dpi, fig["natural"], fig["shown"])
        if px < MIN_TEXT_PX - 0.05:
            small.append(
                f"{where}: {font:g} pt at {dpi:.0f} dpi shown at "
                f"{fig['shown']:.0f}/{fig['natural']} px = {px:.1f} CSS px"
            )
    assert not small, f"{notebook}: figure text below {MIN_TEXT_PX:g} CSS px: {small}"


# Issue 44, item 5: figures and sliders are numbered per chapter, "Fig. 11.1" and "Slider
# 11.1" ("图 11.1", "滑块 11.1"), in the order they appear, and their captions share one
# style (book/_ext/afs_site.py numbers them, afs.css styles them).
CAPTION_WORDS = {"en": ("Fig.", "Slider"), "zh": ("图", "滑块")}

CAPTIONS_JS = """() => [...document.querySelectorAll(
        'article figcaption, article p.afs-caption')].map(c => {
    const s = getComputedStyle(c), n = c.querySelector('.caption-number');
    const ns = n ? getComputedStyle(n) : null;
    return {number: n ? n.textContent.trim() : null, slider: c.matches('p.afs-caption'),
            style: [s.fontSize, s.fontStyle, s.color, s.textAlign, s.lineHeight],
            number_style: ns ? [ns.fontStyle, ns.fontWeight] : null};
})"""


def chapter_of(notebook: str) -> int:
    return int(notebook.rsplit("/", 1)[-1].split("_", 1)[0])


@pytest.mark.parametrize("where", ["phone", "desktop"])
def test_captions_are_numbered_per_chapter_in_one_style(
    loaded, loaded_phone, notebook: str, where: str
) -> None:
    page = (loaded if where == "desktop" else loaded_phone)(notebook).page
    captions = page.evaluate(CAPTIONS_JS)
    chapter = chapter_of(notebook)
    fig_word, slider_word = CAPTION_WORDS[EDITION]
    figs = [c["number"] for c in captions if not c["slider"]]
    sliders = [c["number"] for c in captions if c["slider"]]
    assert figs == [f"{fig_word} {chapter}.{n}" for n in range(1, len(figs) + 1)], figs
    assert sliders == [f"{slider_word} {chapter}.{n}" for n in range(1, len(sliders) + 1)], sliders
    explorers = len(BeautifulSoup(built_html(notebook), "html.parser").select(".afs-explorer"))
    assert len(sliders) == explorers, f"{notebook}: {explorers} sliders, {len(sliders)} captions"
    styles = {tuple(c["style"]) for c in captions}
    assert len(styles) <= 1, f"{notebook} on a {where}: {len(styles)} caption styles: {styles}"
    numbers = {tuple(c["number_style"]) for c in captions}
    assert numbers <= {("normal", "700")}, f"{notebook}: caption numbers set as {numbers}"
