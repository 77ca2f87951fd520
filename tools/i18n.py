"""Translation catalogs of the book: refresh them, and check that they are complete.

Usage (from the repository root, inside the repository's virtual environment)::

    python tools/i18n.py update          # `make catalogs`: extract the English text, update the .po files
    python tools/i18n.py check           # every problem of every catalog, one per line
    python tools/i18n.py check book/03_softmax   # one page's catalog
    python tools/i18n.py compare [book/03_softmax]  # built pages: same markup in both editions

The catalogs are ``locale/<lang>/LC_MESSAGES/<docname>.po``, one per page (``gettext_compact``
is off), without source locations, so a catalog changes only when its page's English text
does. ``update`` runs Sphinx's gettext builder into ``_build/gettext`` and then updates each
catalog from its page's template in one pass with babel's ``Catalog.update`` (what
sphinx-intl does, in-process): new messages are added (empty), changed ones marked fuzzy,
the ones that are gone dropped; a catalog whose messages did not change is not rewritten.
``check`` is what ``tests/book/test_translations.py`` enforces.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from babel.messages.catalog import Catalog, Message
from babel.messages.pofile import read_po, write_po

ROOT = Path(__file__).resolve().parents[1]
LOCALE = ROOT / "locale"
LANGUAGES = ("zh_CN",)
POT_DIR = ROOT / "_build" / "gettext"

# The one sentence that opens every chapter's exercises (tests/book/test_book_structure.py checks
# the English one), and its translation.
EXERCISES_EN = (
    "Try each exercise before you open its solution; every solution runs and checks "
    "itself with `assert`."
)
EXERCISES_ZH = "先自己做每道练习，再打开它的答案；每个答案都能运行，并用 `assert` 检查自己。"

# Never translate "Transformer" (issue 17), and these are the translations it must not get.
FORBIDDEN = ("变压器", "变换器", "转换器")
STYLE = ROOT / "locale" / "zh_CN" / "STYLE.md"

_CJK = re.compile(r"[\u3400-\u9fff]")
_NUMBERED = re.compile(r"^(\d+)\. ")
_ESCAPED_NUMBER = re.compile(r"^(\d+)\\\. ")
# Markup that must survive translation unchanged (compared as multisets).
_MATH_BLOCK = re.compile(r"\$\$.+?\$\$", re.S)
_MATH = re.compile(r"(?<![\\$])\$(?!\$)(?:[^$\\]|\\.)+?\$")
_CODE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
_ROLE = re.compile(r"\{([\w:-]+)\}`([^`]*)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_WORD = re.compile(r"[A-Za-z]{2,}")


@dataclass(frozen=True)
class Problem:
    catalog: str
    msgid: str
    what: str

    def __str__(self) -> str:
        short = self.msgid if len(self.msgid) <= 70 else self.msgid[:67] + "..."
        return f"{self.catalog}: {self.what}: {short!r}"


# Catalogs of the themes' labels (book/_ext/afs_site.py), not of a page: ``update`` leaves
# them alone, ``check`` checks them like the pages' catalogs.
THEME_CATALOGS = ("sphinx", "booktheme")


def catalog_paths(language: str = "zh_CN") -> list[Path]:
    """The pages' catalogs."""
    found = (LOCALE / language / "LC_MESSAGES").rglob("*.po")
    return sorted(p for p in found if docname(p, language) not in THEME_CATALOGS)


def theme_catalog_paths(language: str = "zh_CN") -> list[Path]:
    folder = LOCALE / language / "LC_MESSAGES"
    return [folder / f"{n}.po" for n in THEME_CATALOGS if (folder / f"{n}.po").exists()]


def docname(path: Path, language: str = "zh_CN") -> str:
    return path.relative_to(LOCALE / language / "LC_MESSAGES").with_suffix("").as_posix()


def load(path: Path) -> Catalog:
    with path.open("rb") as f:
        return read_po(f, abort_invalid=True)


def messages(catalog: Catalog) -> list[Message]:
    """The catalog's messages, without the header and without obsolete ones."""
    return [m for m in catalog if m.id and not isinstance(m.id, tuple)]


def _role_targets(text: str) -> list[str]:
    """``{role}`target``` for every role; ``{term}`title <target>``` counts as its target."""
    out = []
    for role, content in _ROLE.findall(text):
        explicit = re.search(r"<([^<>]+)>\s*$", content)
        out.append(f"{{{role}}}{explicit.group(1) if explicit else content}")
    return out


def markup(text: str) -> Counter[str]:
    """The markup of a message that its translation must keep: maths, code, roles, links."""
    found = _role_targets(text) + [f"]({t})" for t in _LINK.findall(text)]
    rest = _ROLE.sub(" ", text)
    for pattern in (_MATH_BLOCK, _CODE, _MATH):
        found += [m.group(0) for m in pattern.finditer(rest)]
        rest = pattern.sub(" ", rest)
    return Counter(found)


def prose(text: str) -> str:
    """The text without maths, code, roles and link targets: what a reader reads as words."""
    for pattern in (_ROLE, _MATH_BLOCK, _CODE, _MATH, _LINK):
        text = pattern.sub(" ", text)
    return re.sub(r"https?://\S+", " ", text)


def avoided_terms(style: Path = STYLE) -> dict[str, str]:
    """STYLE.md's table "Terms to avoid (checked)": {term to avoid: what to write}."""
    text = style.read_text(encoding="utf-8")
    section = text.split("## Terms to avoid (checked)", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines()]
    terms = {
        cells[0].strip(): cells[1].strip()
        for cells in rows
        if len(cells) == 2 and cells[0].strip() not in ("avoid", "") and "---" not in cells[0]
    }
    if not terms:
        raise ValueError(f"{style}: the table 'Terms to avoid (checked)' has no rows")
    return terms


AVOIDED = avoided_terms()


def message_problems(msgid: str, msgstr: str, fuzzy: bool) -> list[str]:
    """What is wrong with one translated message ([] when nothing is)."""
    if not msgstr:
        return ["untranslated"]
    problems = []
    if fuzzy:
        problems.append("fuzzy (the English changed: check the translation, then drop the flag)")
    number = _NUMBERED.match(msgid)
    if number:
        escaped = _ESCAPED_NUMBER.match(msgstr)
        if not escaped or escaped.group(1) != number.group(1):
            problems.append(
                f"a numbered title must start with '{number.group(1)}\\. ' in the translation "
                "(a bare '3. ' is read as a list and Sphinx silently drops the translation)"
            )
    lost = markup(msgid) - markup(msgstr)
    added = markup(msgstr) - markup(msgid)
    if lost or added:
        problems.append(
            f"markup differs: missing {sorted(lost.elements())}, extra {sorted(added.elements())}"
        )
    display_maths = msgid.startswith("\n")  # a maths block's message: LaTeX, no $$ around it
    if display_maths and msgstr != msgid and not _CJK.search(msgstr):
        problems.append("a display formula is copied unchanged (msgstr = msgid)")
    if not (display_maths and msgstr == msgid) and (
        len(_WORD.findall(prose(msgid))) >= 2 and not _CJK.search(msgstr)
    ):
        problems.append("left in English (no Chinese in the translation)")
    if any(word in msgstr for word in FORBIDDEN):
        problems.append(f"'Transformer' is never translated (found one of {FORBIDDEN})")
    words = prose(msgstr)
    problems += [
        f"avoid '{term}': write {instead} (locale/zh_CN/STYLE.md, Terms to avoid)"
        for term, instead in AVOIDED.items()
        if term in words
    ]
    if "Transformer" in msgid and "Transformer" not in msgstr:
        problems.append("'Transformer' must stay 'Transformer'")
    if msgid == EXERCISES_EN and msgstr != EXERCISES_ZH:
        problems.append(f"the exercises sentence must read exactly {EXERCISES_ZH!r}")
    return problems


def catalog_problems(path: Path, language: str = "zh_CN") -> list[Problem]:
    catalog = load(path)
    name = docname(path, language)
    found = [
        Problem(name, m.id, what)
        for m in messages(catalog)
        for what in message_problems(m.id, m.string, m.fuzzy)
    ]
    if catalog.fuzzy:
        found.append(Problem(name, "", "the catalog header is marked fuzzy"))
    return found


def stale_problems(pot_dir: Path, language: str = "zh_CN") -> list[Problem]:
    """Messages of the English text (``.pot`` files) missing from the catalogs, and back."""
    found = []
    po_dir = LOCALE / language / "LC_MESSAGES"
    pots = {
        name: p
        for p in pot_dir.rglob("*.pot")
        if (name := p.relative_to(pot_dir).with_suffix("").as_posix()) not in THEME_CATALOGS
    }
    pos = {docname(p, language): p for p in catalog_paths(language)}
    for name in sorted(set(pots) | set(pos)):
        if name not in pos:
            found.append(Problem(name, "", f"no catalog at {po_dir / name}.po"))
            continue
        if name not in pots:
            found.append(Problem(name, "", "a catalog for a page that no longer exists"))
            continue
        english = {m.id for m in messages(load(pots[name]))}
        translated = {m.id for m in messages(load(pos[name]))}
        found += [
            Problem(name, i, "new English text, not in the catalog") for i in english - translated
        ]
        found += [
            Problem(name, i, "in the catalog but no longer in the English text")
            for i in translated - english
        ]
    return found


def extract(pot_dir: Path = POT_DIR, doctrees: Path | None = None) -> None:
    """Run Sphinx's gettext builder over the book: one ``.pot`` per page in ``pot_dir``."""
    from jupyter_book.sphinx import build_sphinx

    # A page renamed since the last run would leave its old template behind, and
    # `update` would make a catalog for a page that no longer exists.
    shutil.rmtree(pot_dir, ignore_errors=True)
    overrides = {"external_toc_path": "_toc.yml", "latex_individualpages": False}
    result = build_sphinx(
        ROOT,
        pot_dir,
        noconfig=True,
        path_config=ROOT / "_config.yml",
        confoverrides=overrides,
        doctreedir=doctrees or pot_dir.parent / ".doctrees-gettext",
        builder="gettext",
        freshenv=True,
        quiet=True,
    )
    if result != 0:
        raise SystemExit(f"the gettext build failed ({result})")
    _add_figure_alts(pot_dir)


def figure_alts(notebook: Path) -> list[str]:
    """The alt texts of a notebook's figures (``mystnb.image.alt`` in a cell's metadata)."""
    alts = []
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        image = cell.get("metadata", {}).get("mystnb", {}).get("image", {})
        if isinstance(image, dict) and image.get("alt"):
            alts.append(image["alt"])
    return alts


def _add_figure_alts(pot_dir: Path) -> None:
    """Add the figures' alt texts to their page's ``.pot``.

    They are prose for screen readers, but myst-nb turns outputs into images only after
    Sphinx has extracted and translated the page, so the gettext builder never sees them;
    book/_ext/afs_site.py translates them in the built page instead.
    """
    for notebook in sorted((ROOT / "book").glob("*.ipynb")):
        pot = pot_dir / "book" / f"{notebook.stem}.pot"
        alts = figure_alts(notebook)
        if not alts or not pot.exists():
            continue
        catalog = load(pot)
        for alt in alts:
            if alt not in catalog:
                catalog.add(alt)
        with pot.open("wb") as f:
            write_po(f, catalog, width=0, omit_header=False)


def _write(path: Path, catalog: Catalog) -> None:
    """Write a catalog the way the catalogs are kept: no obsolete (``#~``) entries, no fuzzy
    header, no line wrapping."""
    catalog.fuzzy = False
    catalog.obsolete.clear()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        write_po(f, catalog, width=0, omit_header=False)


def update_catalog(pot: Path, po: Path, language: str) -> str:
    """Bring the catalog ``po`` up to date with its page's template ``pot``.

    babel's ``Catalog.update``: new messages come in empty, changed ones (a close match of
    a message that is gone) keep their old translation marked fuzzy, messages that are gone
    are dropped. A catalog whose set of messages is unchanged is left as it is on disk.
    Returns what happened, as ``make catalogs`` prints it.
    """
    template = load(pot)
    if not po.exists():
        template.locale = language
        _write(po, template)
        return f"Create: {po}"
    catalog = load(po)
    before = {m.id for m in catalog if m.id}
    catalog.update(template)
    after = {m.id for m in catalog if m.id}
    if before == after:
        return f"Not Changed: {po}"
    _write(po, catalog)
    return f"Update: {po} +{len(after - before)}, -{len(before - after)}"


def update() -> None:
    extract()
    for language in LANGUAGES:
        po_dir = LOCALE / language / "LC_MESSAGES"
        for pot in sorted(POT_DIR.rglob("*.pot")):
            name = pot.relative_to(POT_DIR).with_suffix("")
            if name.as_posix() in THEME_CATALOGS:  # the gettext builder's sphinx.pot holds
                continue  # the strings of book/_templates only: the theme catalog is ours
            print(update_catalog(pot, po_dir / name.with_suffix(".po"), language))


# What a translated page must show as often as its English page (counted in the built HTML).
RENDERED = {
    "bold": re.compile(r"<strong>"),
    "italic": re.compile(r"<em>"),
    "inline code": re.compile(r'<code class="docutils literal'),
    "internal link": re.compile(r'class="reference internal"'),
    "external link": re.compile(r'class="reference external"'),
    "maths": re.compile(r'class="math notranslate nohighlight"'),
    "figure": re.compile(r"<img "),
    "heading": re.compile(r"<h[1-6]"),
    "list item": re.compile(r"<li"),
    "table row": re.compile(r"<tr"),
}


def rendered_counts(html: str) -> dict[str, int]:
    main = html.split('<main id="main-content"', 1)[-1]
    return {name: len(pattern.findall(main)) for name, pattern in RENDERED.items()}


def rendered_problems(name: str, html_dir: Path, edition: str = "zh") -> list[Problem]:
    """Differences in rendered markup between a page's English and translated HTML."""
    en, tr = html_dir / f"{name}.html", html_dir / edition / f"{name}.html"
    if not en.exists() or not tr.exists():
        return [Problem(name, "", f"not built: {en if not en.exists() else tr}")]
    a = rendered_counts(en.read_text(encoding="utf-8"))
    b = rendered_counts(tr.read_text(encoding="utf-8"))
    return [
        Problem(name, "", f"{what}: {a[what]} in English, {b[what]} in the translation")
        for what in RENDERED
        if a[what] != b[what]
    ]


def compare(names: list[str]) -> int:
    html_dir = ROOT / "_build" / "html"
    names = names or [docname(p) for p in catalog_paths()]
    return _report([p for name in names for p in rendered_problems(name, html_dir)])


def check(names: list[str]) -> int:
    problems = [
        p
        for language in LANGUAGES
        for path in catalog_paths(language) + theme_catalog_paths(language)
        if not names or docname(path, language) in names
        for p in catalog_problems(path, language)
    ]
    return _report(problems)


def _report(problems: list[Problem]) -> int:
    """Print the problems, one per line, and their count; the exit status."""
    for p in problems:
        print(p)
    print(f"{len(problems)} problem(s)")
    return 1 if problems else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["update"]:
        update()
        return 0
    if argv[:1] == ["check"]:
        return check(argv[1:])
    if argv[:1] == ["compare"]:
        return compare(argv[1:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
