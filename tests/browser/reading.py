"""What issue 29 measures on a page of the built book, shared by the browser tests and
reading_report.py: figure text size as shown, display equations wider than their box, code
blocks that scroll with no cue, the cumulative layout shift and axe-core's violations.
"""

from __future__ import annotations

import base64
import functools
import struct
from urllib.parse import unquote, urlparse

from bookpages import SITE_DIR

from attention_lib.show.style import MIN_FONT_PT, text_css_px

# Cumulative layout shift as Chromium reports it (web-vitals' definition: the largest
# session window of shifts, a window ending after a 1 s gap or at 5 s; shifts right after
# the reader's input do not count). Installed before the page loads.
CLS_INIT_JS = """(() => {
    window.__afsCls = {value: 0, window: 0, first: 0, last: 0, shifts: []};
    try {
        new PerformanceObserver((list) => {
            const s = window.__afsCls;
            for (const e of list.getEntries()) {
                if (e.hadRecentInput) continue;
                if (s.window && e.startTime - s.last < 1000 && e.startTime - s.first < 5000) {
                    s.window += e.value;
                } else {
                    s.window = e.value;
                    s.first = e.startTime;
                }
                s.last = e.startTime;
                s.value = Math.max(s.value, s.window);
                s.shifts.push([Math.round(e.startTime), +e.value.toFixed(4),
                    (e.sources || []).map(x => x.node ? (x.node.nodeName || '') + '.' +
                        (x.node.className || '') : '').join(' ').slice(0, 80)]);
            }
        }).observe({type: 'layout-shift', buffered: true});
    } catch (e) {}
})();"""

# The page as loaded, MathJax done, lazy figures in view loaded, two frames later.
SETTLE_JS = """async () => {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
        await MathJax.startup.promise;
    }
    await new Promise(r => setTimeout(r, 400));
    await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
}"""

# Open every hidden output and load every figure, as a reader who scrolls through would.
SHOW_ALL_JS = """async () => {
    document.querySelectorAll('article details').forEach(d => d.open = true);
    document.querySelectorAll('img[loading="lazy"]').forEach(i => i.loading = 'eager');
    const imgs = [...document.querySelectorAll('.cell_output img')];
    await Promise.all(imgs.map(i => i.complete ? null : new Promise(r => {
        i.addEventListener('load', r); i.addEventListener('error', r); })));
}"""

# Figures a reader sees: every static figure and the shown frame of each explorer.
SHOWN_FIGURES_JS = """() => [...document.querySelectorAll('article .cell_output img')]
    .filter(i => i.offsetParent !== null && i.getBoundingClientRect().width > 0)
    .map(i => {
        const ex = i.closest('.afs-explorer');
        // the button that opens a shrunk figure at full size (afs.js), if shown
        const holder = i.closest('a.image-reference')?.parentElement ?? i.parentElement;
        const cue = holder.querySelector(':scope > button.afs-zoom-cue');
        const box = cue && !cue.hidden ? cue.getBoundingClientRect() : null;
        return {src: i.currentSrc || i.src, natural: i.naturalWidth,
                shown: i.getBoundingClientRect().width, alt: i.alt,
                zoomable: i.classList.contains('afs-zoomable'),
                cue: box && box.width > 0 ? {height: box.height, text: cue.textContent} : null,
                font: ex ? ex.dataset.smallestFontPt ?? null : 'static'};
    })"""

# Display equations wider than their box (cut, or scrolling inside it).
WIDE_MATH_JS = """() => [...document.querySelectorAll('article mjx-container[display="true"]')]
    .filter(m => m.scrollWidth > m.clientWidth + 1)
    .map(m => (m.closest('[id]') || {}).id + ': ' + m.textContent.slice(0, 50))"""

CODE_CUE_JS = """() => {
    const faded = (p) => getComputedStyle(p).maskImage !== 'none'
        || (getComputedStyle(p).webkitMaskImage || 'none') !== 'none';
    const wide = [...document.querySelectorAll('article pre')]
        .filter(p => p.clientWidth > 0 && p.scrollWidth > p.clientWidth + 1);
    return {wide: wide.length, uncued: wide.filter(p => !faded(p)).length};
}"""


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


def figure_texts(page) -> list[dict]:
    """Each figure shown on ``page`` (all outputs opened) with the CSS px height of its
    smallest text as shown, ``px`` (None when the PNG records no resolution or an
    explorer no font), and at full size, ``full_px`` (what a tap on a shrunk figure shows).
    """
    page.evaluate(SHOW_ALL_JS)
    out = []
    for fig in page.evaluate(SHOWN_FIGURES_JS):
        dpi = png_dpi(image_bytes(fig["src"]))
        font = MIN_FONT_PT if fig["font"] == "static" else fig["font"]
        if dpi is None or font in (None, ""):
            fig.update(px=None, full_px=None, dpi=dpi)
        else:
            fig.update(
                dpi=dpi,
                font_pt=float(font),
                px=text_css_px(float(font), dpi, fig["natural"], fig["shown"]),
                # at full size a 2x figure is shown at half its pixels (its width attribute)
                full_px=float(font) * 96 / 72,
            )
        out.append(fig)
    return out


# axe-core's color-contrast rule is most of its time on a page (7 of 9 s on chapter 12, 28
# of 31 s on api_models): it measures every element with text, and most of a page's are
# leaves that repeat a few looks: the code cells' highlighting spans (7,695 of chapter 12's
# 8,604 elements, 21 looks), the API pages' signature spans, em and code. Leaves that look
# alike get the same answer: same tag and class, colour, font, shadow, the backgrounds up
# to the first opaque one, and the opacity, filter and blending of every ancestor (all
# axe-core reads to compute a contrast). The first leaf of each look that is shown whole
# (rendered, inside every box that clips it) is measured; the others of that look are
# marked ``data-afs-axe-same`` and left out of color-contrast only (every other rule still
# reads every element). A look with no leaf shown whole is measured leaf by leaf.
SAME_LOOK_JS = """() => {
    const styles = new Map();
    const style = (e) => {
        if (!styles.has(e)) styles.set(e, getComputedStyle(e));
        return styles.get(e);
    };
    const backdrop = (e) => {
        const out = [];
        let opaque = false;
        for (; e && e.nodeType === 1; e = e.parentElement) {
            const cs = style(e);
            const paints = [cs.opacity, cs.filter, cs.mixBlendMode];
            if (!opaque) paints.push(cs.backgroundColor, cs.backgroundImage);
            out.push(paints.join(' '));
            opaque = opaque || (/^rgb\\(/.test(cs.backgroundColor) && cs.backgroundImage === 'none');
        }
        return out.join('|');
    };
    const shownWhole = (e) => {
        const r = e.getBoundingClientRect();
        if (!(r.width > 0 && r.height > 0) || e.getClientRects().length !== 1) return false;
        if (!e.checkVisibility({opacityProperty: true, visibilityProperty: true})) return false;
        for (let a = e.parentElement; a && a !== document.documentElement; a = a.parentElement) {
            const cs = style(a);
            if (cs.overflowX === 'visible' && cs.overflowY === 'visible') continue;
            const box = a.getBoundingClientRect();
            if (r.left < box.left || r.right > box.right || r.top < box.top
                || r.bottom > box.bottom) return false;
        }
        return true;
    };
    const looks = new Map();  // look -> {measured: leaf or null, rest: [leaf]}
    for (const e of document.querySelectorAll('article *')) {
        if (!e.firstChild || [...e.childNodes].some(c => c.nodeType !== 3)) continue;
        if (!e.textContent.trim()) continue;
        const cs = style(e);
        const look = [e.tagName, e.className, cs.color, cs.fontSize, cs.fontWeight,
                      cs.fontStyle, cs.fontFamily, cs.textShadow, cs.textStrokeWidth,
                      backdrop(e)].join(';');
        if (!looks.has(look)) looks.set(look, {measured: null, rest: []});
        const group = looks.get(look);
        if (!group.measured && shownWhole(e)) group.measured = e;
        else group.rest.push(e);
    }
    let marked = 0;
    for (const {measured, rest} of looks.values()) {
        if (!measured) continue;
        for (const e of rest) { e.setAttribute('data-afs-axe-same', ''); marked++; }
    }
    axe.configure({rules: [{id: 'color-contrast', selector: '*:not([data-afs-axe-same])'}]});
    return {looks: looks.size, marked};
}"""

AXE_RUN_JS = "(options) => axe.run(document, options)"


@functools.cache
def _axe_script() -> str:
    from axe_playwright_python.sync_playwright import Axe

    return Axe().axe_script


def axe_impacts(page) -> dict[str, list[str]]:
    """axe-core's violations on ``page``: impact -> ["rule-id (n nodes)", ...].

    Every rule runs on the whole page; color-contrast measures one leaf of each look
    (SAME_LOOK_JS), so its node count counts looks, not elements. Only violations are asked for (``resultTypes``): axe-core still runs every
    rule on every node, but lists one node per passed, incomplete or inapplicable rule
    instead of all of them: about half its time on a long chapter (40 -> 19 s on
    chapter 10)."""
    page.evaluate(_axe_script())
    page.evaluate(SAME_LOOK_JS)
    report = page.evaluate(AXE_RUN_JS, {"resultTypes": ["violations"]})
    found: dict[str, list[str]] = {}
    for v in report["violations"]:
        found.setdefault(v["impact"] or "none", []).append(f"{v['id']} ({len(v['nodes'])})")
    return found


def measure_page(page, docname: str, where: str, errors: list[str]) -> dict:
    """The issue's quantities on ``page``; ``errors``: its console errors so far (axe-core
    itself asks for the theme's @import-ed stylesheets at wrong URLs: not counted)."""
    page.evaluate(SETTLE_JS)
    console = list(errors)
    cls = page.evaluate("() => window.__afsCls || {value: -1, shifts: []}")
    wide_math = page.evaluate(WIDE_MATH_JS)
    axe = axe_impacts(page)
    figs = figure_texts(page)
    code = page.evaluate(CODE_CUE_JS)
    return {
        "page": docname,
        "console_errors": len(console),
        "console_texts": [e[:100] for e in console[:3]],
        "where": where,
        "cls": round(cls["value"], 4),
        "shifts": cls["shifts"][:6],
        "wide_math": len(wide_math),
        "wide_math_where": wide_math[:4],
        "wide_code": code["wide"],
        "uncued_code": code["uncued"],
        "figure_text_px": [round(f["px"], 2) for f in figs if f["px"] is not None],
        "axe": {k: len(v) for k, v in axe.items()},
        "axe_rules": axe,
    }


# Issue 44, item 2: the controls that open a figure at full size, and whether they sit on
# the figure's ink. The shown controls are counted; control ``i`` is scrolled to the middle
# of the window and the parts of the figures under it returned (viewport px).
ZOOM_CONTROLS_JS = """() => [...document.querySelectorAll('article .afs-zoom-cue')]
    .filter(c => !c.hidden && c.getClientRects().length && c.offsetParent !== null).length"""
ZOOM_CONTROL_UNDER_JS = """async (i) => {
    const c = [...document.querySelectorAll('article .afs-zoom-cue')]
        .filter(c => !c.hidden && c.getClientRects().length && c.offsetParent !== null)[i];
    c.scrollIntoView({block: 'center', behavior: 'instant'});  // the theme scrolls smoothly
    await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
    const r = c.getBoundingClientRect();
    const under = [];
    for (const img of document.querySelectorAll('article .cell_output img')) {
        if (img.offsetParent === null) continue;
        const b = img.getBoundingClientRect();
        const x0 = Math.max(r.left, b.left, 0), x1 = Math.min(r.right, b.right, innerWidth);
        const y0 = Math.max(r.top, b.top, 0), y1 = Math.min(r.bottom, b.bottom, innerHeight);
        if (x1 - x0 >= 1 && y1 - y0 >= 1) {
            under.push({x: x0, y: y0, width: x1 - x0, height: y1 - y0});
        }
    }
    return {text: c.textContent.trim(), under};
}"""

# Ink: a pixel at least this far from white in some channel (anti-aliased text included).
INK_DISTANCE = 48


def ink_fraction(png: bytes) -> float:
    """The share of a screenshot's pixels that are ink (not the white page)."""
    import io

    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    ink = sum(1 for r, g, b in img.getdata() if 255 - min(r, g, b) >= INK_DISTANCE)
    return ink / max(1, img.width * img.height)


def zoom_controls_over_ink(page, threshold: float = 0.005) -> dict:
    """The shown zoom controls of ``page`` (all outputs opened, figures loaded) and how many
    sit on figure ink: the pixels under a control, with the controls hidden, more than
    ``threshold`` ink."""
    page.evaluate(SHOW_ALL_JS)
    count = page.evaluate(ZOOM_CONTROLS_JS)
    over = []
    for i in range(count):
        c = page.evaluate(ZOOM_CONTROL_UNDER_JS, i)
        if not c["under"]:
            continue
        hide = page.add_style_tag(content=".afs-zoom-cue { visibility: hidden !important; }")
        page.wait_for_timeout(50)
        inked = max(
            ink_fraction(page.screenshot(clip=clip, animations="disabled")) for clip in c["under"]
        )
        hide.evaluate("e => e.remove()")
        if inked > threshold:
            over.append({"text": c["text"], "ink": round(inked, 3)})
    return {"controls": count, "over_ink": len(over), "over": over[:5]}
