"""The explicit allow-list of cosmetic browser errors on the built book.

Anything else logged as a console error, any other uncaught exception, and any request to
another host (which an offline reader cannot make) fails the browser suite.
"""

from __future__ import annotations

import re

from bookpages import Tab

# (message regex, source-URL regex, why it is cosmetic)
ALLOWED_CONSOLE_ERRORS = [
    (
        r"^Got invalid theme mode: \. Resetting to auto\.$",
        r"/_static/scripts/pydata-sphinx-theme\.js",
        # pydata-sphinx-theme 0.17 logs this on a reader's first visit (nothing in
        # localStorage yet; sphinx-book-theme 1.3 rejects the `default_mode` theme option
        # that would set it). The theme then uses "auto": light or dark like the OS.
        "first visit: the colour mode falls back to auto",
    ),
]

# (exception-message regex, why it is cosmetic)
ALLOWED_PAGE_ERRORS = [
    (
        r"^Identifier 'THEBE_JS_URL' has already been declared$",
        # sphinx-thebe 0.3.1 (always loaded by jupyter-book 1.0.4) inlines its two-line
        # config <script> twice under Sphinx 7.4; the first copy already declared the same
        # constants. Thebe itself is off (launch_buttons.thebe: false): nothing uses them.
        "duplicate inline sphinx-thebe config script",
    ),
]

# (URL regex, why) for hosts the pages may try to reach although an offline reader gets
# nothing from them. Empty: the book is self-contained (MathJax included).
ALLOWED_BLOCKED: list[tuple[str, str]] = []


def problems(tab: Tab) -> dict[str, list]:
    """What went wrong on the tab so far, minus the allowed cosmetic errors."""
    blocked = [u for u in tab.blocked if not any(re.search(p, u) for p, _ in ALLOWED_BLOCKED)]
    console = [
        (text, src)
        for text, src in tab.console_errors
        if not any(re.search(m, text) and re.search(s, src) for m, s, _ in ALLOWED_CONSOLE_ERRORS)
        # an allowed blocked request shows up once more as "Failed to load resource"
        and not (text.startswith("Failed to load resource") and src in tab.blocked
                 and src not in blocked)
    ]
    uncaught = [e for e in tab.page_errors if not any(re.search(m, e) for m, _ in ALLOWED_PAGE_ERRORS)]
    return {
        k: v
        for k, v in {"blocked requests": blocked, "console errors": console,
                     "uncaught exceptions": uncaught}.items()
        if v
    }
