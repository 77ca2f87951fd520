"""Sphinx glue for the HTML book (a local extension named in _config.yml).

Figures load when the reader scrolls to them: every ``<img>`` of a page's body that
points to a file (the notebooks' figures in ``_images/``) gets ``loading="lazy"``, so a
cold page load fetches only the figures in view. Inline (``data:``) images, such as the
frames of the kernel-free sliders, are already in the page and are left alone.

Each page lists every script once. sphinx-thebe 0.3.1, which jupyter-book 1.0.4 always
loads, registers its inline config ``<script>const THEBE_JS_URL = ...</script>`` during
``env-before-read-docs``; under Sphinx 7.4 it then reaches the page twice, and the second
copy throws ``Identifier 'THEBE_JS_URL' has already been declared`` in every browser (the
same happens to sphinx-togglebutton's ``var togglebuttonSelector``, harmlessly). Dropping
repeats, in order, keeps the first copy, which is all the page ever used.
"""

from __future__ import annotations

import re
from typing import Any

# An <img> tag with a src that is not inline data, and no loading attribute yet.
_FILE_IMG = re.compile(r'<img(?![^>]*\sloading=)(?=[^>]*\ssrc="(?!data:))')


def _unique_scripts(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    scripts = context.get("script_files")
    if isinstance(scripts, list):
        seen, unique = set(), []
        for js in scripts:  # an inline script's filename is None or "": the same script
            key = (js.filename or "", js.priority, tuple(sorted(js.attributes.items())))
            if key not in seen:
                seen.add(key)
                unique.append(js)
        context["script_files"] = unique


def _lazy_figures(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    body = context.get("body")
    if isinstance(body, str):
        context["body"] = _FILE_IMG.sub('<img loading="lazy" decoding="async"', body)


def setup(app: Any) -> dict[str, Any]:
    app.connect("html-page-context", _unique_scripts, priority=900)  # after the theme's
    app.connect("html-page-context", _lazy_figures, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
