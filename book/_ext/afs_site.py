"""Sphinx glue for the HTML book (a local extension named in _config.yml).

Each page lists every script once. sphinx-thebe 0.3.1, which jupyter-book 1.0.4 always
loads, registers its inline config ``<script>const THEBE_JS_URL = ...</script>`` during
``env-before-read-docs``; under Sphinx 7.4 it then reaches the page twice, and the second
copy throws ``Identifier 'THEBE_JS_URL' has already been declared`` in every browser (the
same happens to sphinx-togglebutton's ``var togglebuttonSelector``, harmlessly). Dropping
repeats, in order, keeps the first copy, which is all the page ever used.
"""

from __future__ import annotations

from typing import Any


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


def setup(app: Any) -> dict[str, Any]:
    app.connect("html-page-context", _unique_scripts, priority=900)  # after the theme's
    return {"parallel_read_safe": True, "parallel_write_safe": True}
