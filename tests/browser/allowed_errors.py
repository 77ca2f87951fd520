"""The explicit allow-list of browser errors on the built book, each with its reason.

Anything else logged as a console error, any other uncaught exception, any request of the
book's own host that fails (an HTTP error, or no answer) and any request to another host
(which an offline reader cannot make) fails the browser suite.
"""

from __future__ import annotations

import re

from bookpages import Tab

# (message regex, source-URL regex, why it cannot be fixed). Empty: pydata-sphinx-theme
# logged "Got invalid theme mode: . Resetting to auto." on a reader's first visit to every
# page until _config.yml gave the theme its default colour mode (html_context).
ALLOWED_CONSOLE_ERRORS: list[tuple[str, str, str]] = []

# (exception-message regex, why it is cosmetic). Empty: sphinx-thebe's config script used
# to be inlined twice ("Identifier 'THEBE_JS_URL' has already been declared"), until
# book/_ext/afs_site.py made every page list each script once.
ALLOWED_PAGE_ERRORS: list[tuple[str, str]] = []

# (URL regex, why) for hosts the pages may try to reach although an offline reader gets
# nothing from them. Empty: the book is self-contained (MathJax included).
ALLOWED_BLOCKED: list[tuple[str, str]] = []

# (URL regex, why) for requests of the book's own host that may fail. Empty: every file a
# page asks for is in the built site (the favicon too: _config.yml's html.favicon).
ALLOWED_FAILED: list[tuple[str, str]] = []


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
    failed = [f for f in tab.failed if not any(re.search(p, f) for p, _ in ALLOWED_FAILED)]
    return {
        k: v
        for k, v in {
            "blocked requests": blocked,
            "failed requests": failed,
            "console errors": console,
            "uncaught exceptions": uncaught,
        }.items()
        if v
    }
