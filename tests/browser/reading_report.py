"""Measure how the built book reads on a phone and a desktop (issue 29's before/after table).

Usage (after `make build-strict`)::

    .venv/bin/python tests/browser/reading_report.py [--edition zh] [--json out.json]

For every page of `_toc.yml`, at 390 x 844 (a touch phone, 2x pixels) and 1280 x 900, it
prints: the smallest text of the figures a reader sees (static figures and the shown frame
of each slider, in CSS px, from the font rule or the explorer's measured smallest font, the
PNG's resolution and its displayed width), the display equations wider than their box,
the code blocks that scroll with no cue, console errors, the cumulative layout shift, and
axe-core's violations by impact. The browser suite asserts the same quantities
(test_browser_reading.py); this script only reports them, so that "before" can be measured.

``--issue44`` prints issue 44's table instead, for the editions given (default both)::

    .venv/bin/python tests/browser/reading_report.py --issue44 [--edition en zh]

signatures that read as Python's (signatures.py), zoom controls over figure ink at both
widths (reading.zoom_controls_over_ink), the smallest figure text on the phone, cells whose
printed output is split over several boxes, and the PDFs of ``make pdf`` (pages, size).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import DESKTOP
from conftest import PHONE as PHONE_2X
from reading import (
    CLS_INIT_JS,
    SETTLE_JS,
    figure_texts,
    measure_page,
    zoom_controls_over_ink,
)


def split_outputs(html: str) -> int:
    """Cells whose printed text is split over several output boxes (consecutive stream or
    plain-text outputs of one cell)."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    split = 0
    for out in soup.select("article .cell_output"):
        run = best = 0
        for child in out.find_all("div", recursive=False):
            classes = child.get("class") or []
            if "output" in classes and ("stream" in classes or "text_plain" in classes):
                run += 1
                best = max(best, run)
            else:
                run = 0
        split += best >= 2
    return split


def pdf_files(site: Path) -> list[tuple[str, int, int]]:
    """The PDFs ``make pdf`` wrote (under the site's ``pdf/`` folders): name, pages, bytes."""
    import re as _re

    found = []
    for pdf in sorted(site.rglob("*.pdf")):
        data = pdf.read_bytes()
        pages = len(_re.findall(rb"/Type\s*/Page(?![s\w])", data))
        found.append((str(pdf.relative_to(site)), pages, len(data)))
    return found


def issue44(editions: list[str], only: list[str] | None = None) -> int:
    """Issue 44's before/after table, both widths, the editions given."""
    import functools
    import http.server
    import threading

    from bookpages import CHROMIUM, EDITIONS, PAGES, SITE_DIR
    from playwright.sync_api import sync_playwright
    from signatures import SIGNATURES_JS, compare

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(SITE_DIR))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    api_pages = [d for d in PAGES if "api" in d.rsplit("/", 1)[-1]]
    if only:  # the reference's pages are always read: the signatures are counted on them
        only = [d for d in PAGES if d in only or d in api_pages]
    table = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        for edition in editions:
            base = f"http://127.0.0.1:{port}/{EDITIONS[edition]}"
            row: dict = {"edition": edition}
            for where, screen in (("phone", PHONE_2X), ("desktop", DESKTOP)):
                context = browser.new_context(**screen, service_workers="block")
                context.set_default_timeout(180_000)  # a loaded machine
                controls = over = 0
                texts: list[float] = []
                static: list[float] = []  # static figures (a phone rendition since item 3)
                frames: list[float] = []  # the shown frame of each slider
                sig_total = sig_wrong = 0
                for docname in only or PAGES:
                    page = context.new_page()
                    page.goto(f"{base}{docname}.html", wait_until="load")
                    page.evaluate(SETTLE_JS)
                    if docname in api_pages and where == "desktop":
                        n, wrong = compare(page.evaluate(SIGNATURES_JS))
                        sig_total += n
                        sig_wrong += len(wrong)
                    if where == "phone":
                        for f in figure_texts(page):
                            if f["px"] is not None:
                                texts.append(f["px"])
                                (static if f["font"] == "static" else frames).append(f["px"])
                    z = zoom_controls_over_ink(page)
                    controls += z["controls"]
                    over += z["over_ink"]
                    print(
                        f"  {edition} {where} {docname}: {z['over_ink']} of {z['controls']} "
                        f"controls over ink {z['over'][:2]}",
                        flush=True,
                    )
                    page.close()
                context.close()
                row[f"controls_{where}"] = f"{over} of {controls}"
                if where == "phone":
                    row["smallest_phone_text"] = round(min(texts, default=0), 1)
                    row["phone_text_below_9"] = (
                        f"{sum(t < 9 for t in texts)} of {len(texts)} "
                        f"(median {statistics.median(texts) if texts else 0:.1f} px)"
                    )
                    for name, values in (("static", static), ("slider", frames)):
                        row[f"phone_{name}"] = (
                            f"{sum(t < 9 for t in values)} of {len(values)} below 9 px, "
                            f"smallest {min(values, default=0):.1f}, median "
                            f"{statistics.median(values) if values else 0:.1f}"
                        )
                else:
                    row["signatures"] = f"{sig_total - sig_wrong} of {sig_total} correct"

            folder = SITE_DIR / EDITIONS[edition]
            row["split_outputs"] = sum(
                split_outputs((folder / f"{d}.html").read_text(encoding="utf-8"))
                for d in only or PAGES
                if (folder / f"{d}.html").exists()
            )
            pdfs = [f for f in pdf_files(SITE_DIR) if f[0].startswith(EDITIONS[edition] + "pdf/")]
            row["pdfs"] = (
                f"{len(pdfs)} files, {sum(f[1] for f in pdfs)} pages, "
                f"{sum(f[2] for f in pdfs) / 1e6:.1f} MB"
                if pdfs
                else "none"
            )
            table.append(row)
            print(json.dumps(row, ensure_ascii=False), flush=True)
        browser.close()
    server.shutdown()
    heads = [
        ("edition", "edition"),
        ("signatures", "signatures"),
        ("controls_phone", "controls over ink, phone"),
        ("controls_desktop", "controls over ink, desktop"),
        ("smallest_phone_text", "smallest phone figure text (CSS px)"),
        ("phone_text_below_9", "phone figures with text below 9 px"),
        ("phone_static", "of which static figures"),
        ("phone_slider", "of which slider frames"),
        ("split_outputs", "cells with split output"),
        ("pdfs", "PDFs"),
    ]
    print()
    print("| " + " | ".join(h for _, h in heads) + " |")
    print("|" + "---|" * len(heads))
    for row in table:
        print("| " + " | ".join(str(row.get(k, "")) for k, _ in heads) + " |")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edition", default=None, choices=["en", "zh"], nargs="*")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--pages", nargs="*")
    parser.add_argument("--issue44", action="store_true", help="issue 44's table")
    args = parser.parse_args(argv)
    if args.issue44:
        return issue44(args.edition or ["en", "zh"], args.pages)
    args.edition = (args.edition or ["en"])[0]
    import os

    os.environ["AFS_EDITION"] = args.edition
    import functools
    import http.server
    import threading

    from bookpages import CHROMIUM, EDITIONS, PAGES, SITE_DIR
    from playwright.sync_api import sync_playwright

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(SITE_DIR))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/{EDITIONS[args.edition]}"
    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        for where, screen in (("phone", PHONE_2X), ("desktop", DESKTOP)):
            context = browser.new_context(**screen, service_workers="block")
            context.add_init_script(CLS_INIT_JS)
            for docname in args.pages or PAGES:
                page = context.new_page()
                errors: list[str] = []
                page.on(
                    "console",
                    lambda m, errors=errors: errors.append(m.text) if m.type == "error" else None,
                )
                page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                page.on(
                    "response",
                    lambda r, errors=errors: (
                        errors.append(f"{r.status} {r.url}") if r.status >= 400 else None
                    ),
                )
                page.goto(f"{base}{docname}.html", wait_until="load")
                row = measure_page(page, docname, where, errors)
                rows.append(row)
                page.close()
                print(json.dumps(row, ensure_ascii=False), flush=True)
            context.close()
        browser.close()
    server.shutdown()

    print()
    for where in ("phone", "desktop"):
        sel = [r for r in rows if r["where"] == where]
        texts = [t for r in sel for t in r["figure_text_px"]]
        impacts: Counter = Counter()
        for r in sel:
            impacts.update(r["axe"])
        print(
            f"{args.edition} {where}: figures {len(texts)}, smallest figure text "
            f"{min(texts, default=0):.1f} CSS px (median {statistics.median(texts or [0]):.1f}); "
            f"equations wider than their box {sum(r['wide_math'] for r in sel)} on "
            f"{sum(bool(r['wide_math']) for r in sel)} pages; code blocks scrolling without "
            f"a cue {sum(r['uncued_code'] for r in sel)} of "
            f"{sum(r['wide_code'] for r in sel)} that scroll; console errors "
            f"{sum(r['console_errors'] for r in sel)}; layout shift max "
            f"{max(r['cls'] for r in sel):.3f} ({max(sel, key=lambda r: r['cls'])['page']}); "
            f"axe violations by impact {dict(sorted(impacts.items()))}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, ensure_ascii=False, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
