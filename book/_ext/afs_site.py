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

Docstrings stay in English in every edition. The API reference renders them with autodoc;
they live in ``attention_lib``'s code, which exists once, like the notebooks' code cells, so
they are kept out of the translation catalogs (a docstring edit never makes a catalog stale).
The reference page's own prose is translated like every other page.
"""

from __future__ import annotations

import re
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.transforms import SphinxTransform

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


def _inside_desc(node: nodes.Node) -> bool:
    parent = node.parent
    while parent is not None:
        if isinstance(parent, addnodes.desc):
            return True
        parent = parent.parent
    return False


class KeepDocstringsUntranslated(SphinxTransform):
    """Mark the text of autodoc entries (``desc`` nodes) and docstrings as not translatable.

    A module docstring rendered by ``automodule`` is not inside a ``desc`` node; autodoc
    names its source ``<file>:docstring of <object>``.

    Runs before Sphinx's ``Locale`` transform (priority 20), so the gettext builder leaves
    these messages out of the catalogs and a translated build leaves them in English.
    """

    default_priority = 10

    def apply(self, **kwargs: Any) -> None:
        for node in self.document.findall(nodes.TextElement):
            if ":docstring of " in (node.source or "") or _inside_desc(node):
                node["translatable"] = False


def setup(app: Any) -> dict[str, Any]:
    app.add_transform(KeepDocstringsUntranslated)
    app.connect("html-page-context", _unique_scripts, priority=900)  # after the theme's
    app.connect("html-page-context", _lazy_figures, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
