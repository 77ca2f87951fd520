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

Every page links to the same page in the book's other language (English at the root of the
site, Chinese under ``zh/``): a button in the article header (``language-switch.html``) and a
``<link rel="alternate" hreflang>`` in the head, both with relative URLs, so they work from
files, on a server and under any base path.

Docstrings stay in English in every edition. The API reference renders them with autodoc;
they live in ``attention_lib``'s code, which exists once, like the notebooks' code cells, so
they are kept out of the translation catalogs (a docstring edit never makes a catalog stale).
The reference page's own prose is translated like every other page.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.locale import init as init_locale
from sphinx.transforms import SphinxTransform
from sphinx.util.i18n import docname_to_domain

# An <img> tag with a src that is not inline data, and no loading attribute yet.
_FILE_IMG = re.compile(r'<img(?![^>]*\sloading=)(?=[^>]*\ssrc="(?!data:))')


def _unique_scripts(
    app: Any, pagename: str, templatename: str, context: dict, doctree: Any
) -> None:
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


# Sphinx language -> (BCP 47 tag, the edition's folder under the site root, its name in itself).
EDITIONS = {"en": ("en", "", "English"), "zh_CN": ("zh-CN", "zh/", "中文")}


def other_edition(language: str, pagename: str) -> dict[str, str]:
    """The link from ``pagename`` in ``language`` to the same page in the other edition."""
    here = "zh_CN" if language.startswith("zh") else "en"
    there = "en" if here == "zh_CN" else "zh_CN"
    to_site_root = "../" * pagename.count("/") + ("../" if EDITIONS[here][1] else "")
    tag, folder, name = EDITIONS[there]
    return {
        "href": f"{to_site_root}{folder}{pagename}.html",
        "hreflang": tag,
        "label": name,
        "title": "Read this page in English" if there == "en" else "阅读本页的中文版",
    }


# The site's own words that the Chinese edition shows in Chinese (the theme translates its
# labels itself; these come from _config.yml).
SITE_TEXT_ZH = {
    "search_bar_text": "搜索本书……",
    "html_title": "从零实现注意力（Attention from Scratch）",
}


# The themes' own labels that their zh_CN catalogs leave in English are translated by the
# Chinese edition's catalogs for them (issue 29, item 11): locale/zh_CN/LC_MESSAGES/sphinx.po
# for the templates' strings (Sphinx compiles it and puts it before the themes' catalogs;
# book/_templates adds ``_()`` where sphinx-book-theme wrote a label in English only) and
# booktheme.po for sphinx-book-theme's header buttons (compiled and added below, after the
# theme's own catalog, which it completes). What no catalog reaches is left to the table
# below, applied to the built pages: myst-nb writes its cell toggles' labels into the page
# in English ("Show code cell {type}" with an English {type}, and a fixed aria-label), and
# sphinx-book-theme the print-only contents' aria-label in its layout.html.
CHROME_ZH = {
    "Page": "本页目录",
    "Toggle hidden content": "显示或隐藏折叠的内容",
    "Show code cell source": "显示代码",
    "Hide code cell source": "隐藏代码",
    "Show code cell output": "显示输出",
    "Hide code cell output": "隐藏输出",
    "Show code cell outputs": "显示输出",
    "Hide code cell outputs": "隐藏输出",
    "Show code cell content": "显示代码单元",
    "Hide code cell content": "隐藏代码单元",
}
# An exact label: an attribute's whole value, or an element's whole text (spaces around).
_LABEL = re.compile(
    r'((?:title|aria-label|alt|data-bs-original-title)=")([^"<>]+)(")|(>\s*)([^<>]+?)(\s*<)'
)

_PRE = re.compile(r"(<pre\b.*?</pre>)", re.DOTALL)


def translate_chrome(html: str, table: dict[str, str] = CHROME_ZH) -> str:
    """``html`` with every label of ``table`` replaced by its translation.

    Code and printed output (``<pre>`` blocks) are left alone.
    """

    def swap(m: re.Match) -> str:
        head, text, tail = (m.group(1), m.group(2), m.group(3)) if m.group(1) else m.group(4, 5, 6)
        return f"{head}{table.get(text, text)}{tail}"

    parts = _PRE.split(html)
    return "".join(p if i % 2 else _LABEL.sub(swap, p) for i, p in enumerate(parts))


def _is_chinese(config: Any) -> bool:
    return (config.language or "").startswith("zh")


def _page_catalog(srcdir: str | Path, config: Any, docname: str) -> Any | None:
    """The translations of ``docname``'s catalog (None in English or without a catalog)."""
    if (config.language or "en") == "en":
        return None
    dirs = [str(Path(srcdir, d)) for d in config.locale_dirs]
    domain = docname_to_domain(docname, config.gettext_compact)
    catalog, found = init_locale(dirs, config.language, domain)
    return catalog if found else None


def _translate_chrome(app: Any, exception: Exception | None) -> None:
    if exception is not None or not _is_chinese(app.config):
        return
    if app.builder.format != "html":
        return
    for path in Path(app.outdir).rglob("*.html"):
        html = path.read_text(encoding="utf-8")
        new = translate_chrome(html, CHROME_ZH)
        if new != html:
            path.write_text(new, encoding="utf-8")


#: The catalog of sphinx-book-theme's header buttons, in the book's locale_dirs.
BOOKTHEME_CATALOG = "booktheme"


def _theme_catalogs(app: Any) -> None:
    """Compile the edition's catalog of sphinx-book-theme's labels and add it after the
    theme's own (Sphinx compiles only its ``sphinx`` domain from locale_dirs by itself)."""
    if (app.config.language or "en") == "en":
        return
    from babel.messages.mofile import write_mo
    from babel.messages.pofile import read_po

    for folder in app.config.locale_dirs:
        locale_dir = Path(app.srcdir, folder)
        po = locale_dir / app.config.language / "LC_MESSAGES" / f"{BOOKTHEME_CATALOG}.po"
        if not po.exists():
            continue
        with po.open("rb") as f:
            catalog = read_po(f)
        with po.with_suffix(".mo").open("wb") as f:
            write_mo(f, catalog)
        app.add_message_catalog(BOOKTHEME_CATALOG, str(locale_dir))


def book_version(root: str | Path) -> str | None:
    """The release the book shows: ``attention_lib``'s version (``root``'s pyproject.toml),
    which a release tag ``vX.Y.Z`` names (README.md, "Releases and PDFs"; CHANGELOG.md)."""
    import tomllib

    pyproject = Path(root) / "pyproject.toml"
    if not pyproject.exists():
        return None
    return tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"]


def version_footer(version: str, chinese: bool, changelog: str) -> str:
    """The footer line with the book's version and a link to what changed in it."""
    if chinese:
        return f'<p class="afs-version">版本 {version}（<a href="{changelog}">更新记录</a>）</p>'
    return f'<p class="afs-version">Version {version} (<a href="{changelog}">changes</a>)</p>'


def _show_version(app: Any, config: Any) -> None:
    """Issue 44, item 7: the version in every page's footer (and Sphinx's ``release``)."""
    version = book_version(app.srcdir)
    if version is None:
        return
    config.version = config.release = version
    repo = (config.html_theme_options or {}).get("repository_url", "").rstrip("/")
    branch = (config.html_theme_options or {}).get("repository_branch", "main")
    changelog = f"{repo}/blob/{branch}/CHANGELOG.md" if repo else "CHANGELOG.md"
    config.html_theme_options = {
        **config.html_theme_options,
        "extra_footer": version_footer(version, _is_chinese(config), changelog),
    }


def _translate_site_text(app: Any, config: Any) -> None:
    if _is_chinese(config):
        config.html_theme_options = {
            **config.html_theme_options,
            "search_bar_text": SITE_TEXT_ZH["search_bar_text"],
        }
        config.html_title = SITE_TEXT_ZH["html_title"]


_ALT = re.compile(r'(<img\b[^>]*?\balt=")([^"]*)(")')


def _translate_figure_alts(
    app: Any, pagename: str, templatename: str, context: dict, doctree: Any
) -> None:
    """In a translated edition, the figures' alt texts from the page's catalog.

    myst-nb makes the images after Sphinx has translated the page, so Sphinx cannot;
    tools/i18n.py puts the alt texts into the catalogs.
    """
    body = context.get("body")
    catalog = _page_catalog(app.srcdir, app.config, pagename)
    if not isinstance(body, str) or catalog is None:
        return

    def swap(m: re.Match) -> str:
        alt = html.unescape(m.group(2))
        return f"{m.group(1)}{html.escape(catalog.gettext(alt), quote=True)}{m.group(3)}"

    context["body"] = _ALT.sub(swap, body)


# Issue 44, item 3: a phone rendition of each figure. A notebook's figure PNG may carry a
# narrower rendition in its output metadata (attention_lib.show.phone: text that stays
# >= 9 CSS px in a phone's column). myst-nb writes the desktop PNG as _images/<sha256>.png;
# the rendition is written next to it as <sha256>-phone.png and given its own <img> after
# the desktop one, in the same box; afs.css shows one of the two by the screen's width
# (below 640 px), and a hidden lazy image is never fetched.
PHONE_KEY = "afs_phone"
_IMAGE_SRC = re.compile(r'<img\b[^>]*?\ssrc="([^"]*?_images/)([0-9a-f]{64})\.png"[^>]*>')


def phone_renditions(notebook: dict) -> dict[str, dict]:
    """The phone renditions a notebook's outputs carry: sha256 of the desktop PNG ->
    ``{"png": bytes, "width": css px, "height": css px}``."""
    import base64
    import hashlib

    found = {}
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            phone = output.get("metadata", {}).get("image/png", {}).get(PHONE_KEY)
            png = output.get("data", {}).get("image/png")
            if not phone or not png:
                continue
            png = "".join(png) if isinstance(png, list) else png
            key = hashlib.sha256(base64.b64decode(png)).hexdigest()
            found[key] = {
                "png": base64.b64decode(phone["png"]),
                "width": int(phone["width"]),
                "height": int(phone["height"]),
            }
    return found


def add_phone_images(body: str, renditions: dict[str, dict]) -> tuple[str, set[str]]:
    """``body`` with each desktop figure that has a phone rendition followed by the
    rendition's <img> (class ``afs-phone``; the desktop one gets ``afs-desktop``), and the
    sha256 keys used."""
    used: set[str] = set()

    def add(m: re.Match) -> str:
        folder, key = m.group(1), m.group(2)
        phone = renditions.get(key)
        if phone is None:
            return m.group(0)
        used.add(key)
        desktop = m.group(0)
        alt = re.search(r'\salt="[^"]*"', desktop)
        if re.search(r'\sclass="', desktop):
            desktop = re.sub(r'\sclass="', ' class="afs-desktop ', desktop, count=1)
        else:
            desktop = desktop.replace("<img", '<img class="afs-desktop"', 1)
        return (
            f'{desktop}<img class="afs-phone"{alt.group(0) if alt else ""} '
            f'src="{folder}{key}-phone.png" '
            f'style="width: {phone["width"]}px; height: {phone["height"]}px;" />'
        )

    return _IMAGE_SRC.sub(add, body), used


def _phone_figures(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    body = context.get("body")
    source = Path(app.srcdir) / f"{pagename}.ipynb"
    if not isinstance(body, str) or not source.exists():
        return
    renditions = phone_renditions(json.loads(source.read_text(encoding="utf-8")))
    if not renditions:
        return
    context["body"], used = add_phone_images(body, renditions)
    images = Path(app.outdir) / "_images"
    images.mkdir(parents=True, exist_ok=True)
    for key in used:
        target = images / f"{key}-phone.png"
        if not target.exists():
            target.write_bytes(renditions[key]["png"])


# Issue 44, item 5: figures and sliders numbered per chapter ("Fig. 11.1", "Slider 11.1"),
# with one caption style. Sphinx numbers figures through the whole book (chapter 12 opened
# on "Fig. 40": the TOC is not ``numbered``, the chapters carry their number in their
# titles), and the notebooks write a slider's caption as a paragraph opening with
# "**Slider N.**" ("**滑块 N**："). No page refers to a figure or a slider by its number.
_CHAPTER_DOC = re.compile(r"(?:^|/)(\d+)_[^/]*$")
_FIG_NUMBER = re.compile(r'(<span class="caption-number">)(Fig\.|图)\s*\d+(\s*</span>)')
_SLIDER_CAPTION = re.compile(
    r"<p><strong>(Slider|滑块)\s*\d+\.?</strong>\s*(?:[:：.]\s*)?(.*?)</p>", re.DOTALL
)


def number_per_chapter(body: str, chapter: int) -> str:
    """``body`` with its figures and sliders numbered ``chapter.n`` in their order, and
    each slider's caption paragraph in the figures' caption style (``afs-caption``)."""
    count = {"fig": 0, "slider": 0}

    def figure(m: re.Match) -> str:
        count["fig"] += 1
        return f"{m.group(1)}{m.group(2)} {chapter}.{count['fig']}{m.group(3)}"

    def slider(m: re.Match) -> str:
        count["slider"] += 1
        word, text = m.groups()
        return (
            f'<p class="afs-caption afs-slider-caption"><span class="caption-number">'
            f'{word} {chapter}.{count["slider"]} </span><span class="caption-text">{text}'
            "</span></p>"
        )

    return _SLIDER_CAPTION.sub(slider, _FIG_NUMBER.sub(figure, body))


def _number_per_chapter(
    app: Any, pagename: str, templatename: str, context: dict, doctree: Any
) -> None:
    m = _CHAPTER_DOC.search(pagename)
    body = context.get("body")
    if m and isinstance(body, str):
        context["body"] = number_per_chapter(body, int(m.group(1)))


# Issue 44, item 6: the API reference was one page (book/api), now an index and one page
# per part of the library (book/api_*). A link to an entry of the old page
# (book/api.html#attention_lib.causal_mask) still lands on it: the index page carries a
# map of every id of the new pages to its page and follows it for a #fragment it does not
# have itself, on arrival and on a change of the fragment.
API_INDEX = "book/api"
_API_PART = re.compile(r"^book/api_\w+$")

ANCHOR_MAP_JS = """<script>(() => {
  const pages = %s;
  const go = () => {
    const id = decodeURIComponent(location.hash.slice(1));
    if (!id || document.getElementById(id)) return;
    for (const [page, ids] of Object.entries(pages)) {
      if (ids.includes(id)) { location.replace(`${page}.html#${encodeURIComponent(id)}`); return; }
    }
  };
  go();
  window.addEventListener("hashchange", go);
})();</script>"""


def api_anchor_map(env: Any) -> dict[str, list[str]]:
    """Each page of the reference (its file name) -> the ids of its sections and entries."""
    found = {}
    for docname in sorted(env.found_docs):
        if _API_PART.match(docname):
            doctree = env.get_doctree(docname)
            ids = sorted({i for node in doctree.findall(nodes.Element) for i in node["ids"]})
            found[docname.rsplit("/", 1)[-1]] = ids
    return found


def _api_anchor_map(
    app: Any, pagename: str, templatename: str, context: dict, doctree: Any
) -> None:
    body = context.get("body")
    if pagename == API_INDEX and isinstance(body, str):
        pages = json.dumps(api_anchor_map(app.env), separators=(",", ":"))
        context["body"] = body + ANCHOR_MAP_JS % pages


def _language_links(
    app: Any, pagename: str, templatename: str, context: dict, doctree: Any
) -> None:
    if doctree is None:  # search, genindex: no counterpart page
        return
    link = other_edition(app.config.language or "en", pagename)
    context["afs_other_edition"] = link
    context["metatags"] = context.get("metatags", "") + (
        f'\n<link rel="alternate" hreflang="{link["hreflang"]}" href="{link["href"]}" />'
    )


# The paragraph of a docstring that names the chapters explaining it ("Explained in chapter
# 6, *Multi-head attention*; backends also in chapter 11, ..."), up to its blank line, and
# each mention of chapters in it: "chapter 6", "chapters 2 and 3", "chapters 9-10".
_EXPLAINED_IN = re.compile(r"^\s*Explained in\b")
_CHAPTERS = re.compile(r"\b(chapters?)(\s+)((?:\d+(?:,\s+|\s+and\s+|\s+or\s+|-))*\d+)\b")
_CHAPTER_FILE = re.compile(r"(?:^|/)(\d+)_[^/]*$")


def chapter_docs(docnames: Any) -> dict[int, str]:
    """Chapter number -> its document (``book/06_multi_head``), from the file names."""
    found = {}
    for docname in docnames:
        m = _CHAPTER_FILE.search(docname)
        if m:
            found[int(m.group(1))] = docname
    return found


def link_chapters(lines: list[str], chapters: dict[int, str]) -> list[str]:
    """``lines`` of a docstring with each chapter its "Explained in" paragraph names made a
    ``:doc:`` link to that chapter's page (a number with no chapter stays plain text).

    Sphinx resolves the links in each edition (English, Chinese), like any other.
    """

    def link(number: re.Match) -> str:
        n = int(number.group(0))
        return f":doc:`{n} </{chapters[n]}>`" if n in chapters else number.group(0)

    def mention(m: re.Match) -> str:
        word, space, numbers = m.groups()
        if re.fullmatch(r"\d+", numbers) and int(numbers) in chapters:  # "chapter 6": all a link
            return f":doc:`{word} {numbers} </{chapters[int(numbers)]}>`"
        return word + space + re.sub(r"\d+", link, numbers)

    out, i = [], 0
    while i < len(lines):
        if not _EXPLAINED_IN.match(lines[i]):
            out.append(lines[i])
            i += 1
            continue
        end = i
        while end < len(lines) and lines[end].strip():
            end += 1
        out.extend(_CHAPTERS.sub(mention, "\n".join(lines[i:end])).split("\n"))
        i = end
    return out


def _link_explained_in(
    app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """autodoc-process-docstring: the "Explained in chapter N" notes link to the chapters."""
    lines[:] = link_chapters(lines, chapter_docs(app.env.found_docs))


class KeepDocstringsUntranslated(SphinxTransform):
    """Mark the text of autodoc entries (``desc`` nodes) and docstrings as not translatable.

    A module docstring rendered by ``automodule`` is not inside a ``desc`` node; autodoc
    names its source ``<file>:docstring of <object>``.

    Runs before Sphinx's ``Locale`` transform (priority 20), so the gettext builder leaves
    these messages out of the catalogs and a translated build leaves them in English. The
    class ``afs-docstring`` marks them in the HTML.

    Inline nodes get no mark of their own (issue 44, item 1). Sphinx never extracts an
    inline node that has no ``translatable`` attribute, so they need none; and Sphinx's
    ``RemoveTranslatableInline`` (priority 999) takes every ``nodes.inline`` that has the
    attribute, whatever its value, out of its parent and appends its children to the
    parent's end. A signature's parts (``desc_sig_name``, ``desc_sig_operator``, the default
    value) are such inlines: marked, they were moved to the end of their parameter, which
    read ``=k_lenNone`` for ``k_len=None``. Only the inlines Sphinx itself made translatable
    (the content of a parameter's description in a field list) are turned off.
    """

    default_priority = 10

    def apply(self, **kwargs: Any) -> None:
        for node in self.document.findall(nodes.TextElement):
            if not (":docstring of " in (node.source or "") or _inside_desc(node)):
                continue
            if isinstance(node, nodes.Inline):
                if "translatable" in node:
                    node["translatable"] = False
                continue
            node["translatable"] = False
            node["classes"].append("afs-docstring")  # tests skip it in the zh pages


# A number and its unit in a table cell ("0.063 s", "260 MiB", "1.4 x"): joined by a
# no-break space, so that a narrow column never puts the unit on a line of its own.
_NUMBER_UNIT = re.compile(
    r"(\d)[ \t]+(s|ms|µs|us|ns|min|h|B|kB|KB|KiB|MB|MiB|GB|GiB|TB|%|x|×|tokens?|FLOPs?)(?=$|[^\w])"
)


def keep_units(text: str) -> str:
    return _NUMBER_UNIT.sub("\\1\u00a0\\2", text)


class KeepNumbersWithUnits(SphinxTransform):
    """In table cells, a number keeps its unit on its line (issue 29, item 3).

    Runs after Sphinx's ``Locale`` transform (priority 20), so it sees each edition's own
    text; code (``literal``) is left alone.
    """

    default_priority = 400

    def apply(self, **kwargs: Any) -> None:
        for entry in self.document.findall(nodes.entry):
            for text in list(entry.findall(nodes.Text)):
                if isinstance(text.parent, (nodes.literal, nodes.literal_block)):
                    continue
                new = keep_units(str(text))
                if new != str(text):
                    text.parent.replace(text, nodes.Text(new))


class TranslateTocCaptions(SphinxTransform):
    """Translate the part captions of the table of contents ("Building attention", ...).

    sphinx-external-toc inserts the toctrees from ``_toc.yml`` (priority 100) after Sphinx's
    ``Locale`` transform (20) has translated the page, so the captions, which the gettext
    builder does extract into the root page's catalog, would stay in English. This runs
    right after the insertion, before the toctrees are collected (880).
    """

    default_priority = 150

    def apply(self, **kwargs: Any) -> None:
        toctrees = [t for t in self.document.findall(addnodes.toctree) if t.get("caption")]
        catalog = (
            _page_catalog(self.env.srcdir, self.config, self.env.docname) if toctrees else None
        )
        for toctree in toctrees if catalog else []:
            toctree["caption"] = catalog.gettext(toctree["caption"])


def _visit_citation(self: Any, node: nodes.citation) -> None:
    """A bibliography entry as a ``listitem`` of its ``list`` (issue 29, item 8).

    docutils marks each entry ``role="doc-biblioentry"``, a role ARIA 1.2 deprecates; inside
    the ``role="list"`` that docutils wraps the entries in, axe-core then finds no list
    items (a critical violation). Same markup otherwise (docutils' ``visit_citation``).
    """
    if not isinstance(node.previous_sibling(), type(node)):
        self.body.append('<div role="list" class="citation-list">\n')
    self.body.append(self.starttag(node, "div", classes=[node.tagname], role="listitem"))


# Renamed pages (tools/renumber.py, README.md "Adding a chapter"): book/redirects.json maps
# each old page name to its new one ("book/09_attention_that_writes" ->
# "book/09_attention_that_writes"). Every edition gets a small static page at each old URL
# that sends the reader on: a meta refresh and a visible link (no JavaScript needed, works
# from files), a canonical link, and an inline script that keeps the #fragment.
REDIRECTS_FILE = "book/redirects.json"


def load_redirects(root: str | Path) -> dict[str, str]:
    """Old docname -> new docname, from ``root``'s book/redirects.json (empty if none)."""
    path = Path(root) / REDIRECTS_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def redirect_page(old: str, new: str, chinese: bool = False) -> str:
    """The HTML page that stands at ``old``'s URL and leads to ``new``'s (relative URLs)."""
    import posixpath

    href = html.escape(posixpath.relpath(f"{new}.html", posixpath.dirname(old) or "."), quote=True)
    lang, text = (
        ("zh-CN", f'本页已移至<a href="{href}">{href}</a>。')
        if chinese
        else ("en", f'This page has moved to <a href="{href}">{href}</a>.')
    )
    return (
        f'<!DOCTYPE html>\n<html lang="{lang}">\n<head>\n<meta charset="utf-8">\n'
        f'<title>{href}</title>\n<meta name="robots" content="noindex">\n'
        f'<link rel="canonical" href="{href}">\n'
        f'<meta http-equiv="refresh" content="0; url={href}">\n'
        f"<script>location.replace({json.dumps(href)} + location.hash);</script>\n"
        f"</head>\n<body>\n<p>{text}</p>\n</body>\n</html>\n"
    )


def _write_redirects(app: Any, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    for old, new in load_redirects(app.srcdir).items():
        if old in app.env.found_docs or new not in app.env.found_docs:
            from sphinx.util import logging

            logging.getLogger(__name__).warning(
                f"{REDIRECTS_FILE}: {old} -> {new}: the old name is a page, or the new one is not"
            )
            continue
        target = Path(app.outdir, f"{old}.html")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(redirect_page(old, new, _is_chinese(app.config)), encoding="utf-8")


def setup(app: Any) -> dict[str, Any]:
    from docutils.writers._html_base import HTMLTranslator

    app.add_node(
        nodes.citation, override=True, html=(_visit_citation, HTMLTranslator.depart_citation)
    )
    app.add_transform(KeepDocstringsUntranslated)
    app.add_transform(TranslateTocCaptions)
    app.add_transform(KeepNumbersWithUnits)
    app.connect("autodoc-process-docstring", _link_explained_in)
    app.connect("html-page-context", _language_links)
    app.connect("html-page-context", _translate_figure_alts)
    app.connect("html-page-context", _number_per_chapter)
    app.connect("html-page-context", _api_anchor_map)
    app.connect("config-inited", _translate_site_text)
    app.connect("config-inited", _show_version)
    app.connect("builder-inited", _theme_catalogs)
    app.connect("build-finished", _translate_chrome)
    app.connect("build-finished", _write_redirects)
    # after the alt texts are translated (priority 500), before loading="lazy" (900)
    app.connect("html-page-context", _phone_figures, priority=600)
    app.connect("html-page-context", _unique_scripts, priority=900)  # after the theme's
    app.connect("html-page-context", _lazy_figures, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
