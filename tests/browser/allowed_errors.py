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
        # pydata-sphinx-theme 0.16/0.17 logs this on a reader's first visit (nothing in
        # localStorage yet; sphinx-book-theme rejects the `default_mode` theme option
        # that would set it). The theme then uses "auto": light or dark like the OS.
        "first visit: the colour mode falls back to auto",
    ),
]

# (exception-message regex, why it is cosmetic). Empty: sphinx-thebe's config script used
# to be inlined twice ("Identifier 'THEBE_JS_URL' has already been declared"), until
# book/_ext/afs_site.py made every page list each script once.
ALLOWED_PAGE_ERRORS: list[tuple[str, str]] = []

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
        and not (
            text.startswith("Failed to load resource") and src in tab.blocked and src not in blocked
        )
    ]
    uncaught = [
        e for e in tab.page_errors if not any(re.search(m, e) for m, _ in ALLOWED_PAGE_ERRORS)
    ]
    return {
        k: v
        for k, v in {
            "blocked requests": blocked,
            "console errors": console,
            "uncaught exceptions": uncaught,
        }.items()
        if v
    }
