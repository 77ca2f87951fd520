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
    page = phone_tab.page
    chapter = next(
        d for d in PAGES if 'class="cell_output' in built_html(d) and "<img" in built_html(d)
    )
    phone_tab.open(chapter)
    page.evaluate(
        "() => document.querySelectorAll('img[loading=\"lazy\"]').forEach(i => i.loading = 'eager')"
    )
    figure = page.locator("article .cell_output img.afs-zoomable").first
    figure.scroll_into_view_if_needed()
    figure.wait_for(state="visible")
    natural = figure.evaluate("i => i.naturalWidth")
    assert figure.bounding_box()["width"] < natural, "the figure is not shrunk on a phone"
    figure.tap()
    page.wait_for_function(
        "i => Math.abs(i.getBoundingClientRect().width - i.naturalWidth) < 1",
        arg=figure.element_handle(),
    )
    # full size inside its own scrolling box: the page itself still does not scroll sideways
    assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE_WIDTH
    figure.tap()
    page.wait_for_function(
        "i => i.getBoundingClientRect().width < i.naturalWidth", arg=figure.element_handle()
    )
