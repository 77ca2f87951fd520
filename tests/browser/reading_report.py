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
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import DESKTOP  # noqa: E402
from conftest import PHONE as PHONE_2X  # noqa: E402  (390 x 844, touch, 2x pixels)
from reading import CLS_INIT_JS, measure_page  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edition", default="en", choices=["en", "zh"])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--pages", nargs="*")
    args = parser.parse_args(argv)
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
