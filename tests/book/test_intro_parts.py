"""The intro's and the glossary's account of the book's parts agrees with `_toc.yml`.

The intro (`book/intro.md`) describes the four parts, one table of chapters per part,
and the glossary points into the chapters. Both were once written while chapters were
still missing ("still being written", "planned"); these tests keep them in step with
`_toc.yml`, the one list of what exists, in both editions:

- every part of `_toc.yml` has its heading in the intro, and its table lists exactly
  that part's chapters, in order, each one linked to its notebook with its number;
- no page says a chapter is planned or unwritten while every chapter of the TOC exists;
- every chapter link in the glossary points to a chapter of the TOC;
- the Chinese catalogs (`intro.po`, `glossary.po`) keep every chapter link of the
  English, and carry no "planned" wording (计划中, 尚未写成, 仍在写作中) either.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import i18n  # noqa: E402

INTRO = ROOT / "book" / "intro.md"
GLOSSARY = ROOT / "book" / "glossary.md"
CATALOG_DIR = ROOT / "locale" / "zh_CN" / "LC_MESSAGES" / "book"

# words that announce a chapter as missing, in either edition
STALE_EN = re.compile(r"\bplanned\b|still being written|not (?:yet )?written|coming soon", re.I)
STALE_ZH = re.compile(r"计划中|尚未写|仍在写|正在写|待写|即将推出")
CHAPTER_LINK = re.compile(r"\]\((\d\d_[a-z0-9_]+)\.ipynb(?:#[^)]*)?\)")
ROW_LINK = re.compile(r"^\| \[(\d+)\\?\. [^\]]+\]\((\d\d_[a-z0-9_]+)\.ipynb\) \|", re.M)


def toc_parts(path: Path = ROOT / "_toc.yml") -> list[tuple[str, list[str]]]:
    """(caption, [chapter stems]) for every part of the TOC that holds chapters."""
    toc = yaml.safe_load(path.read_text(encoding="utf-8"))
    parts = []
    for part in toc["parts"]:
        stems = [Path(c["file"]).name for c in part["chapters"]]
        if any(re.match(r"\d\d_", s) for s in stems):
            parts.append((part["caption"], stems))
    return parts


def toc_chapters() -> list[str]:
    return [stem for _, stems in toc_parts() for stem in stems]


def intro_sections(text: str) -> dict[str, str]:
    """The text under each `### Part ...` heading of the intro, keyed by the heading."""
    pieces = re.split(r"^### (Part [^\n]+)\n", text, flags=re.M)
    return {pieces[i].strip(): pieces[i + 1].split("\n## ")[0] for i in range(1, len(pieces), 2)}


def catalog_messages(name: str) -> list[tuple[str, str]]:
    """(msgid, msgstr) of every translated entry of a page's zh catalog."""
    catalog = i18n.load(CATALOG_DIR / f"{name}.po")
    return [(m.id, m.string) for m in catalog if m.id and isinstance(m.id, str)]


def test_the_toc_has_the_four_parts_and_every_chapter_exists() -> None:
    parts = toc_parts()
    assert len(parts) == 4, [caption for caption, _ in parts]
    for stem in toc_chapters():
        assert (ROOT / "book" / f"{stem}.ipynb").exists(), stem


def test_every_part_of_the_toc_is_described_by_the_intro_in_order() -> None:
    sections = intro_sections(INTRO.read_text(encoding="utf-8"))
    assert list(sections) == [caption for caption, _ in toc_parts()]
    for caption, stems in toc_parts():
        rows = ROW_LINK.findall(sections[caption])
        assert [stem for _, stem in rows] == stems, (
            f"{caption}: the intro's table must link each chapter of the part, in order"
        )
        for number, stem in rows:
            assert int(number) == int(stem[:2]), f"row '{number}.' links {stem}"


def test_the_intro_links_every_chapter() -> None:
    linked = set(CHAPTER_LINK.findall(INTRO.read_text(encoding="utf-8")))
    missing = [stem for stem in toc_chapters() if stem not in linked]
    assert not missing, f"chapters the intro does not link: {missing}"


@pytest.mark.parametrize("page", [INTRO, GLOSSARY], ids=["intro", "glossary"])
def test_no_chapter_is_announced_as_planned(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    stale = [m.group(0) for m in STALE_EN.finditer(text)]
    assert not stale, f"{page.name} calls a chapter missing, but all exist: {stale}"


@pytest.mark.parametrize("page", [INTRO, GLOSSARY], ids=["intro", "glossary"])
def test_every_chapter_link_points_into_the_toc(page: Path) -> None:
    targets = set(CHAPTER_LINK.findall(page.read_text(encoding="utf-8")))
    unknown = sorted(targets - set(toc_chapters()))
    assert not unknown, f"{page.name} links chapters that are not in _toc.yml: {unknown}"


@pytest.mark.parametrize("name", ["intro", "glossary"])
def test_the_chinese_edition_links_the_same_chapters(name: str) -> None:
    for msgid, msgstr in catalog_messages(name):
        if not msgstr:
            continue  # completeness is test_translations' job
        english = sorted(CHAPTER_LINK.findall(msgid))
        chinese = sorted(CHAPTER_LINK.findall(msgstr))
        assert english == chinese, f"{name}.po: links {english} became {chinese} in {msgstr!r}"


def test_the_chinese_intro_links_every_chapter() -> None:
    linked = {
        stem for _, msgstr in catalog_messages("intro") for stem in CHAPTER_LINK.findall(msgstr)
    }
    missing = [stem for stem in toc_chapters() if stem not in linked]
    assert not missing, f"chapters the Chinese intro does not link: {missing}"


@pytest.mark.parametrize("name", ["intro", "glossary"])
def test_the_chinese_edition_announces_no_planned_chapter(name: str) -> None:
    stale = [
        (m.group(0), msgstr)
        for _, msgstr in catalog_messages(name)
        for m in STALE_ZH.finditer(msgstr)
    ]
    assert not stale, f"{name}.po calls a chapter missing, but all exist: {stale[:3]}"


def test_the_checks_can_fail() -> None:
    """The patterns catch the wording this file was written against."""
    old_intro = (
        "the fourth, still being written, follows it to the frontier. "
        "Chapters marked *planned* are not written yet."
    )
    assert len(STALE_EN.findall(old_intro)) == 3
    assert STALE_ZH.search("第四部分（仍在写作中）则跟着它走到前沿。标为*计划中*的章节尚未写成。")
    assert ROW_LINK.findall("| [7. Attention](07_learned_attention.ipynb) | a | b |\n") == [
        ("7", "07_learned_attention")
    ]
    assert not ROW_LINK.findall("| 7. Attention that has learned something | a | b |\n")
