"""Every page of `_toc.yml` on a 390 x 844 phone and a 1280 x 900 desktop.

Nothing scrolls sideways (a table, an equation or a code block on a phone may scroll
inside its own box), the chapter list opens on a phone, page titles carry no raw TeX, and
the pages load no more than they need. Pages come from `_toc.yml`, so new chapters are
checked as soon as they are listed there.
"""

from __future__ import annotations

import re

from allowed_errors import problems
from bookpages import PAGES, Tab, built_html

PHONE_WIDTH = 390

# Reader's view of a page: every hidden cell input/output opened (as a reader may), and
# MathJax done typesetting (an equation has its final width only then).
SETTLE_JS = """async () => {
    document.querySelectorAll('article details').forEach(d => d.open = true);
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
        await MathJax.startup.promise;
    }
}"""

# Elements of the article that stick out of the viewport on the right and are not inside
# a box that scrolls (or clips) on its own: what makes the page scroll sideways.
SIDEWAYS_JS = """(vw) => {
    const boxed = (e) => {
        for (let p = e.parentElement; p && p !== document.body; p = p.parentElement) {
            if (['auto', 'scroll', 'hidden'].includes(getComputedStyle(p).overflowX)) return true;
        }
        return false;
    };
    const out = [];
    for (const e of document.querySelectorAll('body *')) {
        const r = e.getBoundingClientRect();
        if (r.width > 0 && r.right > vw + 0.5 && !boxed(e)) {
            out.push(`${e.tagName.toLowerCase()}.${[...e.classList].join('.')} ` +
                     `(right edge ${Math.round(r.right)} px): ${e.textContent.trim().slice(0, 60)}`);
        }
    }
    return {width: document.documentElement.scrollWidth, culprits: out.slice(0, 8)};
}"""

# Display equations wider than their box must scroll in it, never be cut.
CUT_MATH_JS = """() => [...document.querySelectorAll('article mjx-container[display="true"]')]
    .filter(m => m.scrollWidth > m.clientWidth + 1
                 && !['auto', 'scroll'].includes(getComputedStyle(m).overflowX))
    .map(m => m.textContent.slice(0, 60))"""


def settled(tab: Tab) -> Tab:
    tab.page.evaluate(SETTLE_JS)
    return tab


def test_no_page_scrolls_sideways_on_a_phone(loaded_phone, docname: str) -> None:
    tab = settled(loaded_phone(docname))
    found = tab.page.evaluate(SIDEWAYS_JS, PHONE_WIDTH)
    assert found["width"] <= PHONE_WIDTH, (
        f"{docname} is {found['width']} px wide on a {PHONE_WIDTH} px phone; sticking out: "
        + "; ".join(found["culprits"])
    )
    assert not problems(tab), f"{docname} on a phone: {problems(tab)}"


def test_display_math_scrolls_in_its_box_instead_of_being_cut(
    loaded_phone, loaded, docname: str
) -> None:
    for where, tab in (("phone", loaded_phone(docname)), ("desktop", loaded(docname))):
        cut = settled(tab).page.evaluate(CUT_MATH_JS)
        assert not cut, f"{docname} on a {where}: equations cut off: {cut}"


def test_the_chapter_list_opens_on_a_phone_and_its_links_work(phone_tab: Tab) -> None:
    page = phone_tab.page
    phone_tab.open(PAGES[1])
    toggle = page.locator(".primary-toggle:visible")
    assert toggle.count() == 1, f"{toggle.count()} visible 'Toggle primary sidebar' buttons"
    box = toggle.bounding_box()
    assert box["width"] >= 24 and box["height"] >= 24, f"the hamburger is only {box}"
    toggle.tap()
    # The drawer (pydata-sphinx-theme's modal <dialog>) opens with the chapter list...
    drawer = page.locator("dialog#pst-primary-sidebar-modal[open]")
    drawer.wait_for(state="visible")
    target = PAGES[-1]
    link = drawer.locator(f'nav.bd-docs-nav a[href$="{target.split("/")[-1]}.html"]')
    assert link.count() == 1, f"the drawer lists no link to {target}"
    # ...and a chapter link in it takes the reader there.
    link.tap()
    page.wait_for_url(re.compile(re.escape(phone_tab.url(target))))
    assert not problems(phone_tab), problems(phone_tab)


def test_the_page_contents_drawer_opens_on_a_phone(phone_tab: Tab) -> None:
    page = phone_tab.page
    phone_tab.open(PAGES[1])
    toggle = page.locator(".secondary-toggle:visible")
    assert toggle.count() == 1, f"{toggle.count()} visible 'Toggle secondary sidebar' buttons"
    toggle.tap()
    drawer = page.locator("dialog#pst-secondary-sidebar-modal[open]")
    drawer.wait_for(state="visible")
    assert drawer.locator("nav a").first.is_visible(), "the 'On this page' drawer is empty"


def test_the_sidebar_toggle_folds_the_chapter_list_on_a_desktop(tab: Tab) -> None:
    page = tab.page
    tab.open(PAGES[1])
    sidebar = page.locator("#pst-primary-sidebar")
    assert sidebar.is_visible(), "the chapter list is not shown on a desktop"
    page.locator(".primary-toggle:visible").click()
    sidebar.wait_for(state="hidden")
    page.locator(".primary-toggle:visible").click()
    sidebar.wait_for(state="visible")
    assert not problems(tab), problems(tab)


def test_one_search_field(loaded, loaded_phone) -> None:
    for where, tab in (("desktop", loaded(PAGES[1])), ("phone", loaded_phone(PAGES[1]))):
        shown = tab.page.locator(".search-button-field:visible, .search-button:visible").count()
        assert shown == 1, f"{shown} search buttons or fields in the header on a {where}"


RAW_TEX = re.compile(r"\\[(\[]|\\[a-zA-Z]+\{|\$[^$]+\$")


def test_no_raw_tex_in_titles_or_text_outside_maths(loaded, docname: str) -> None:
    page = settled(loaded(docname)).page
    title = page.title()
    assert not RAW_TEX.search(title), f"{docname}: raw TeX in the browser tab: {title!r}"
    # Text MathJax never typesets (the chapter list, prev/next links) and the article's
    # prose once MathJax has run: what is left is shown raw. Code is code: skipped.
    text = page.evaluate("""() => [
        ...document.querySelectorAll('nav.bd-docs-nav a, .prev-next-area a, article')]
        .map(e => { const c = e.cloneNode(true);
                    c.querySelectorAll('pre, code, script, mjx-container').forEach(x => x.remove());
                    return c.textContent; }).join('\\n')""")
    raw = sorted({m.group(0) for m in RAW_TEX.finditer(text)})
    assert not raw, f"{docname}: raw TeX shown as text: {raw}"


def test_no_icon_script_and_each_script_once(loaded, docname: str) -> None:
    page = loaded(docname).page
    scripts = page.evaluate("() => [...document.scripts].map(s => s.src || s.textContent)")
    assert not [s for s in scripts if "fontawesome" in s], "fontawesome.js is loaded"
    repeats = sorted({s[:80] for s in scripts if scripts.count(s) > 1})
    assert not repeats, f"{docname}: scripts included twice: {repeats}"


# Code cells and text outputs wider than their block: the reader would scroll sideways.
WIDE_PRE_JS = """() => [...document.querySelectorAll('article pre')]
    .filter(p => p.scrollWidth > p.clientWidth + 1)
    .map(p => { const lines = p.textContent.split('\\n');
                const long = lines.reduce((a, b) => b.length > a.length ? b : a, '');
                return `${long.length} chars: ${long.trim().slice(0, 50)}`; })"""


def test_no_code_block_scrolls_sideways_on_a_desktop(loaded, docname: str) -> None:
    wide = settled(loaded(docname)).page.evaluate(WIDE_PRE_JS)
    assert not wide, f"{docname}: {len(wide)} code/output blocks scroll at 1280 px: {wide[:5]}"


def test_a_tap_opens_a_shrunk_figure_at_full_size_on_a_phone(phone_tab: Tab) -> None:
    """Issue 44, item 2: a full-screen view, the figure at full size, its caption in view;
    closed by a tap, by Escape and by its button."""
    page = phone_tab.page
    # A figure with a phone rendition fits the phone's column, so none is shrunk on a
    # 390 px phone; a narrower screen (or a larger text zoom) shrinks it: shown at 60%.
    shown = "article figure img.afs-zoomable >> visible=true"
    chapter = next(
        d for d in PAGES if 'class="cell_output' in built_html(d) and "<figure" in built_html(d)
    )
    phone_tab.open(chapter)
    page.evaluate(
        """async () => {
            const imgs = [...document.querySelectorAll('article figure img')];
            imgs.forEach(i => { i.loading = 'eager'; });
            await Promise.all(imgs.map(i => i.decode().catch(() => null)));
        }"""
    )
    page.add_style_tag(content=".bd-article .cell_output figure img { max-width: 60% !important; }")
    page.evaluate("() => window.dispatchEvent(new Event('resize'))")
    figure = page.locator(shown).first
    figure.scroll_into_view_if_needed()
    figure.wait_for(state="visible")
    full = figure.evaluate("i => parseFloat(i.style.width) || i.naturalWidth")
    assert figure.bounding_box()["width"] < 0.85 * full, "the figure is not shrunk on a phone"
    overlay = page.locator(".afs-zoom-overlay")
    for close in ("tap", "Escape", "button"):
        figure.tap()
        overlay.wait_for(state="visible")
        box = overlay.bounding_box()
        assert box["width"] >= PHONE_WIDTH - 1 and box["height"] >= 800, f"not full-screen: {box}"
        shown = page.locator(".afs-zoom-image").bounding_box()["width"]
        assert abs(shown - full) < 1, f"shown {shown} px, full size {full} px"
        caption = page.locator(".afs-zoom-caption")
        cbox = caption.bounding_box()
        assert cbox and cbox["y"] + cbox["height"] <= 844 + 0.5, f"caption out of view: {cbox}"
        assert caption.inner_text().strip(), "the caption is empty"
        # the page itself never scrolls sideways; the view scrolls inside its own pane
        assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE_WIDTH
        if close == "tap":
            page.locator(".afs-zoom-image").tap()
        elif close == "Escape":
            page.keyboard.press("Escape")
        else:
            page.locator(".afs-zoom-close").tap()
        overlay.wait_for(state="detached")


# --- Issue 29, item 3: nothing clipped without a cue ---------------------------------------

# Code blocks and outputs that scroll sideways in their own box show it (afs.js/afs.css fade
# the right edge) until scrolled to the end; those that fit show nothing.
SCROLL_CUE_JS = """async () => {
    const frame = () => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
    await frame();  // the ResizeObserver's checks after the page settled
    const faded = (p) => getComputedStyle(p).maskImage !== 'none'
        || (getComputedStyle(p).webkitMaskImage || 'none') !== 'none';
    const out = {wide: 0, uncued: [], cued_after_end: [], cued_but_fits: []};
    for (const p of document.querySelectorAll('article pre')) {
        if (p.clientWidth === 0) continue;  // not shown
        const label = p.textContent.trim().slice(0, 40);
        if (p.scrollWidth <= p.clientWidth + 1) {
            if (faded(p)) out.cued_but_fits.push(label);
            continue;
        }
        out.wide += 1;
        if (!faded(p)) out.uncued.push(label);
        p.scrollLeft = p.scrollWidth;
        p.dispatchEvent(new Event('scroll'));
        await frame();
        if (faded(p)) out.cued_after_end.push(label);
        p.scrollLeft = 0;
        p.dispatchEvent(new Event('scroll'));
    }
    return out;
}"""


def test_code_blocks_that_scroll_show_it(loaded_phone, loaded, docname: str) -> None:
    for where, tab in (("phone", loaded_phone(docname)), ("desktop", loaded(docname))):
        found = settled(tab).page.evaluate(SCROLL_CUE_JS)
        assert not found["uncued"], f"{docname} on a {where}: no cue that these scroll: {found}"
        assert not found["cued_after_end"], f"{docname} on a {where}: cue at the end: {found}"
        assert not found["cued_but_fits"], f"{docname} on a {where}: cue on blocks that fit"


# In table cells: a number and its unit on one line (a no-break space between them), and,
# on a desktop, identifiers (inline code without spaces) never broken over lines.
TABLE_TEXT_JS = r"""() => {
    const unit = '(s|ms|µs|us|ns|min|h|B|kB|KB|KiB|MB|MiB|GB|GiB|TB|%|x|×|tokens?|FLOPs?)';
    const spaced = new RegExp('\\d[ \\t]+' + unit + '(?![\\w])', 'g');
    const joined = new RegExp('\\d\\u00a0' + unit + '(?![\\w])', 'g');
    const out = {breakable: [], split_units: [], pairs: 0, split_code: [], code: 0};
    const cells = [...document.querySelectorAll('article table td, article table th')];
    for (const cell of cells) {
        const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
        for (let t = walker.nextNode(); t; t = walker.nextNode()) {
            if (t.parentElement.closest('code, pre')) continue;
            for (const m of t.data.matchAll(spaced)) out.breakable.push(m[0]);
            for (const m of t.data.matchAll(joined)) {
                out.pairs += 1;
                const r = document.createRange();
                r.setStart(t, m.index);
                r.setEnd(t, m.index + m[0].length);
                const tops = new Set([...r.getClientRects()].map(x => Math.round(x.top)));
                if (tops.size > 1) out.split_units.push(m[0]);
            }
        }
        for (const code of cell.querySelectorAll('code')) {
            if (/\s/.test(code.textContent.trim())) continue;  // several words may wrap
            out.code += 1;
            const tops = new Set([...code.getClientRects()].map(x => Math.round(x.top)));
            if (tops.size > 1) out.split_code.push(code.textContent.trim());
        }
    }
    return out;
}"""


def test_table_cells_keep_numbers_with_units_and_identifiers_whole(
    loaded_phone, loaded, docname: str
) -> None:
    for where, tab in (("phone", loaded_phone(docname)), ("desktop", loaded(docname))):
        found = settled(tab).page.evaluate(TABLE_TEXT_JS)
        assert not found["breakable"], f"{docname}: number and unit may part: {found}"
        assert not found["split_units"], f"{docname} on a {where}: units parted: {found}"
        if where == "desktop":
            assert not found["split_code"], f"{docname} at 1280 px: identifiers broken: {found}"


# The heading's "#" permalink sits on the heading's last line, never on a line of its own.
HEADERLINK_JS = """() => {
    const alone = [];
    let n = 0;
    for (const a of document.querySelectorAll(
            'article :is(h1, h2, h3, h4, h5, h6) > a.headerlink')) {
        const h = a.parentElement;
        const r = document.createRange();
        r.setStartBefore(h.firstChild);
        r.setEndBefore(a);
        const lines = [...r.getClientRects()].filter(x => x.width > 0 && x.height > 0);
        if (!lines.length) continue;
        n += 1;
        // Some of the heading's text (or maths) ends just before it, on the same line.
        const box = a.getBoundingClientRect();
        const middle = (box.top + box.bottom) / 2;
        const beside = lines.some(x => x.top <= middle && middle <= x.bottom
                                       && x.right <= box.left + 2);
        if (!beside || box.right > document.documentElement.clientWidth) {
            alone.push(h.textContent.trim().slice(0, 50));
        }
    }
    return {headings: n, alone};
}"""


def test_heading_permalinks_never_sit_on_a_line_of_their_own(
    loaded_phone, loaded, docname: str
) -> None:
    for where, tab in (("phone", loaded_phone(docname)), ("desktop", loaded(docname))):
        found = settled(tab).page.evaluate(HEADERLINK_JS)
        assert found["headings"], f"{docname}: no heading permalinks found"
        assert not found["alone"], f"{docname} on a {where}: '#' on its own line: {found}"
