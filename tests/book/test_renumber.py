"""tools/renumber.py (inserting and renaming chapters) and book/redirects.json.

Unit tests on the strings a renumbering meets (ranges straddling the new number, lists,
possessives, Chinese forms, links with anchors, numbers that are not chapters), then an
end-to-end run of ``insert 8`` on a copy of the book: every chapter link resolves, titles
are 1..N in both editions, catalogs keep msgid and msgstr in step.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "book" / "_ext"))

import renumber
from renumber import Plan, Report, rewrite_catalog, rewrite_prose, rewrite_title

STEMS = {
    7: "07_learned_attention",
    8: "08_attention_that_writes",
    9: "09_modern_attention",
    10: "10_efficient_attention",
    11: "11_serving_attention",
    12: "12_attention_across_machines",
    13: "13_where_attention_goes",
    14: "14_long_contexts",
    15: "15_latent_and_sparse_attention",
    16: "16_attention_without_softmax",
}


def insert_at(number: int, last: int = 16) -> Plan:
    numbers = {n: n + 1 if n >= number else n for n in range(1, last + 1)}
    stems = {s: f"{numbers[n]:02d}_{s[3:]}" for n, s in STEMS.items() if numbers[n] != n}
    return Plan(numbers, stems, number, f"{number:02d}_new_chapter", "New chapter")


def rewrite(text: str, number: int = 8, report: Report | None = None) -> str:
    return rewrite_prose(text, insert_at(number), "test", report)


@pytest.mark.parametrize(
    "before, after",
    [
        ("see chapter 9.", "see chapter 10."),
        ("see chapter 7.", "see chapter 7."),
        ("Chapter 9's cache", "Chapter 10's cache"),
        ("Chapter 9’s cache", "Chapter 10’s cache"),
        ("chapters 7 and 9", "chapters 7 and 10"),
        ("chapters 8 or 9", "chapters 9 or 10"),
        ("chapters 10–16", "chapters 11–17"),
        ("chapters 10-12", "chapters 11-13"),
        ("Part II (chapters 7–9)", "Part II (chapters 7–10)"),
        ("chapters 13, 14 and 16", "chapters 14, 15 and 17"),
        ("chapters 7–10, 13, 14 and 16", "chapters 7–11, 14, 15 and 17"),
        (
            "the decoder of [chapter\n8](08_attention_that_writes.ipynb)",
            "the decoder of [chapter\n9](09_attention_that_writes.ipynb)",
        ),
        (
            "[Chapter 9](09_modern_attention.ipynb#rope-rotates)",
            "[Chapter 10](10_modern_attention.ipynb#rope-rotates)",
        ),
        ("book/09_modern_attention.html#x", "book/10_modern_attention.html#x"),
        ('"book/16_attention_without_softmax.ipynb"', '"book/17_attention_without_softmax.ipynb"'),
        ("09_modern_attention: 8,192: Llama 3", "10_modern_attention: 8,192: Llama 3"),
        (
            "| [9. Attention in today's LLMs](09_modern_attention.ipynb) |",
            "| [10. Attention in today's LLMs](10_modern_attention.ipynb) |",
        ),
        (
            "[7\\. 学到了东西的注意力](07_learned_attention.ipynb)",
            "[7\\. 学到了东西的注意力](07_learned_attention.ipynb)",
        ),
        ("# the blocks *are* chapter 8's encoder", "# the blocks *are* chapter 9's encoder"),
        (
            "Explained in chapter 9, *Modern attention*; also in chapters 10 and 11.",
            "Explained in chapter 10, *Modern attention*; also in chapters 11 and 12.",
        ),
        (
            "(chapters 10–12): tiled attention; 11 serving (ragged); 12 attention across",
            "(chapters 11–13): tiled attention; 12 serving (ragged); 13 attention across",
        ),
        ("(chapters 1–6): a; 9 heads: 10 layers", "(chapters 1–6): a; 9 heads: 10 layers"),
        # Chinese
        ("见第 9 章。", "见第 10 章。"),
        ("第 9–12 章", "第 10–13 章"),
        ("第 7–9 章", "第 7–10 章"),
        ("第 13、14、16 章", "第 14、15、17 章"),
        ("第 7 和 9 章", "第 7 和 10 章"),
        ("[第 8 章](08_attention_that_writes.ipynb)", "[第 9 章](09_attention_that_writes.ipynb)"),
        # not chapter numbers
        ("9 heads of 64 dimensions, 12 layers", "9 heads of 64 dimensions, 12 layers"),
        ("step 9 of 16", "step 9 of 16"),
        ("01_tiny.ipynb and 109_modern_attention", "01_tiny.ipynb and 109_modern_attention"),
        ("chapter 9.5 of nothing", "chapter 9.5 of nothing"),
    ],
)
def test_insert_rewrites_mentions(before: str, after: str) -> None:
    assert rewrite(before) == after


def test_numbers_that_are_not_this_books_chapters_are_left_for_review() -> None:
    report = Report()
    text = "chapter 9 of the paper, the textbook's chapter 10, and chapter 40"
    assert rewrite(text, report=report) == text
    assert len(report.review) == 3, report.review


def test_ranges_that_straddle_the_new_chapter_are_listed() -> None:
    report = Report()
    assert rewrite("Part II (chapters 7–9); chapters 10–12", report=report) == (
        "Part II (chapters 7–10); chapters 11–13"
    )
    assert len(report.review) == 1 and "7–9" in report.review[0]


def test_tests_and_tools_get_file_names_but_only_a_review_of_numbers() -> None:
    report = Report()
    text = '"[chapter 8](08_attention_that_writes.ipynb)"'
    assert rewrite_prose(text, insert_at(8), "t", report, numbers=False) == (
        '"[chapter 8](09_attention_that_writes.ipynb)"'
    )
    assert report.review


def test_titles_in_notebooks_and_catalogs() -> None:
    assert rewrite_title("# 9. Attention in today's LLMs\n\nText 9.", 9, 10) == (
        "# 10. Attention in today's LLMs\n\nText 9."
    )
    assert rewrite_title("9\\. 当今大模型中的注意力", 9, 10) == "10\\. 当今大模型中的注意力"
    assert rewrite_title("1. a numbered list", 9, 10) == "1. a numbered list"


CATALOG = r"""# zh_CN translations
msgid ""
msgstr ""
"Project-Id-Version: Project name not set \n"
"Language: zh_CN\n"

msgid "9. Attention in today's LLMs"
msgstr "9\\. 当今大模型中的注意力"

msgid "[Chapter 8](08_attention_that_writes.ipynb) built the \"KV cache\"; chapters 10–12 scale it."
msgstr "[第 8 章](08_attention_that_writes.ipynb)构建了“KV 缓存”；第 10–12 章把它放大。"

msgid ""
"$$\n"
"x = 9\n"
"$$"
msgstr ""
"$$\n"
"x = 9\n"
"$$"
"""


def test_catalog_msgid_and_msgstr_change_together() -> None:
    import io

    from babel.messages.pofile import read_po

    report = Report()
    new = rewrite_catalog(CATALOG, insert_at(8), "09.po", report, number=9)
    catalog = read_po(io.StringIO(new))
    got = {m.id: m.string for m in catalog if m.id}
    assert got == {
        "10. Attention in today's LLMs": "10\\. 当今大模型中的注意力",
        '[Chapter 9](09_attention_that_writes.ipynb) built the "KV cache"; chapters 11–13 scale it.': "[第 9 章](09_attention_that_writes.ipynb)构建了“KV 缓存”；第 11–13 章把它放大。",
        "$$\nx = 9\n$$": "$$\nx = 9\n$$",
    }
    # Untouched lines keep their bytes (a catalog diff shows only the renumbering).
    assert new.count("\n") == CATALOG.count("\n") and '"x = 9\\n"' in new


def test_redirects_follow_later_renames_and_drop_names_that_are_pages_again() -> None:
    first = renumber.updated_redirects({}, {"08_a": "09_a", "09_b": "10_b"})
    assert first == {"book/08_a": "book/09_a", "book/09_b": "book/10_b"}
    second = renumber.updated_redirects(first, {"09_a": "10_a", "10_b": "11_b"})
    assert second == {
        "book/08_a": "book/10_a",
        "book/09_a": "book/10_a",
        "book/09_b": "book/11_b",
        "book/10_b": "book/11_b",
    }
    # Renaming back: the name is a page again, so it no longer redirects.
    assert "book/09_a" not in renumber.updated_redirects(second, {"10_a": "09_a"})


def test_redirect_page_works_without_javascript_and_keeps_the_fragment() -> None:
    from afs_site import redirect_page

    page = redirect_page("book/08_attention_that_writes", "book/09_attention_that_writes")
    assert '<meta http-equiv="refresh" content="0; url=09_attention_that_writes.html">' in page
    assert '<link rel="canonical" href="09_attention_that_writes.html">' in page
    assert '<a href="09_attention_that_writes.html">' in page
    assert "location.hash" in page
    assert 'lang="zh-CN"' in redirect_page("book/a", "book/b", chinese=True)


def toc_docs(root: Path) -> list[str]:
    toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
    found = []

    def walk(entries: list) -> None:
        for e in entries:
            if "file" in e:
                found.append(e["file"])
            walk(e.get("sections", []))
            walk(e.get("chapters", []))

    walk(toc.get("parts", []))
    return found


def test_the_redirect_map_points_from_old_names_to_pages_of_the_toc() -> None:
    path = ROOT / renumber.REDIRECTS
    redirects = json.loads(path.read_text(encoding="utf-8"))
    docs = set(toc_docs(ROOT))
    for old, new in redirects.items():
        assert old not in docs and not (ROOT / f"{old}.ipynb").exists(), f"{old} is a page"
        assert new in docs, f"{old} -> {new}: {new} is not in _toc.yml"


# --------------------------------------------------------------------------- end to end

LINK = re.compile(r"\]\((\d\d_[a-z0-9_]+)\.ipynb(?:#[^)]*)?\)")
NUMBERED_LINK = re.compile(r"(?:[Cc]hapters?|第)\s*(\d+)\s*章?\]\((\d\d)_[a-z_]+\.ipynb")


AT, SLUG = 8, "a_chapter_inserted_by_the_test"
CLAIM = re.compile(r"Explained in chapter (\d+)")


@dataclass
class Inserted:
    root: Path
    report: Report
    before: dict[int, str]  # the copy's chapters before the insert, number -> stem
    claims: dict[str, list[int]]  # attention_lib file -> its "Explained in chapter N" before


@pytest.fixture(scope="module")
def inserted(tmp_path_factory: pytest.TempPathFactory) -> Inserted:
    """The committed book (HEAD: others' work in progress in the tree is not part of it),
    after ``insert 8 a_chapter_inserted_by_the_test --skeleton`` by this tree's tool."""
    copy = tmp_path_factory.mktemp("book")
    archive = subprocess.run(
        ["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(copy)], input=archive, check=True)
    claims = {
        str(p.relative_to(copy)): [int(n) for n in CLAIM.findall(p.read_text(encoding="utf-8"))]
        for p in sorted((copy / "attention_lib").rglob("*.py"))
    }
    before = renumber.chapters(copy)
    plan = renumber.plan_insert(copy, AT, SLUG, "A new chapter")
    report = renumber.apply(copy, plan, dry_run=False, make_skeleton=True)
    return Inserted(copy, report, before, claims)


def test_insert_renumbers_titles_in_both_editions(inserted: Inserted) -> None:
    import nbformat
    from babel.messages.pofile import read_po

    copy, before = inserted.root, inserted.before
    stems = [Path(d).name for d in toc_docs(copy) if re.match(r"book/\d\d_", d)]
    numbers = [int(s[:2]) for s in stems]
    assert numbers == list(range(1, len(numbers) + 1))
    assert stems[AT - 1] == f"{AT:02d}_{SLUG}" and stems[AT] == f"{AT + 1:02d}_{before[AT][3:]}"
    assert len(stems) == len(before) + 1
    for stem in stems:
        nb = nbformat.read(copy / "book" / f"{stem}.ipynb", as_version=4)
        title = next(c.source for c in nb.cells if c.cell_type == "markdown")
        assert title.startswith(f"# {int(stem[:2])}. "), (stem, title[:40])
        po = copy / renumber.CATALOGS / f"{stem}.po"
        if po.exists():
            with po.open("rb") as f:
                first = next(m for m in read_po(f) if m.id)
            assert first.id.startswith(f"{int(stem[:2])}. "), (stem, first.id)
            assert first.string.startswith(f"{int(stem[:2])}\\. "), (stem, first.string)


def test_insert_leaves_every_chapter_link_resolving(inserted: Inserted) -> None:
    copy = inserted.root
    pages = [
        *(copy / "book").glob("*.ipynb"),
        *(copy / "book").glob("*.md"),
        *(copy / "locale").rglob("*.po"),
    ]
    broken, wrong = [], []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        broken += [
            f"{page.name}: {s}"
            for s in LINK.findall(text)
            if not (copy / "book" / f"{s}.ipynb").exists()
        ]
        wrong += [
            f"{page.name}: {m.group(0)}"
            for m in NUMBERED_LINK.finditer(text)
            if int(m.group(1)) != int(m.group(2))
        ]
    assert broken == [] and wrong == []


def test_insert_keeps_catalogs_consistent(inserted: Inserted) -> None:
    """tools/i18n.py's own per-message check (links, markup, numbering) on the copy."""
    import i18n

    copy = inserted.root
    problems = [
        f"{path.name}: {m.id[:60]!r}: {what}"
        for path in sorted((copy / renumber.CATALOGS).glob("*.po"))
        for m in i18n.messages(i18n.load(path))
        for what in i18n.message_problems(m.id, m.string, m.fuzzy)
    ]
    assert problems == []


def test_insert_moves_files_and_records_redirects(inserted: Inserted) -> None:
    copy, before = inserted.root, inserted.before
    old, new = before[AT + 1], f"{AT + 2:02d}_{before[AT + 1][3:]}"
    assert not (copy / "book" / f"{old}.ipynb").exists()
    assert (copy / "book" / f"{new}.ipynb").exists()
    assert (copy / renumber.CATALOGS / f"{new}.po").exists()
    redirects = json.loads((copy / renumber.REDIRECTS).read_text())
    assert redirects[f"book/{old}"] == f"book/{new}"
    docs = set(toc_docs(copy))
    assert all(a not in docs and b in docs for a, b in redirects.items())
    assert f"book/{AT:02d}_{SLUG}" in docs


def test_insert_renumbers_library_docstrings(inserted: Inserted) -> None:
    """The "Explained in chapter N" claims (tests/book/test_docstring_chapters.py) follow."""
    assert inserted.claims, "no docstring names a chapter?"
    for name, before in inserted.claims.items():
        text = (inserted.root / name).read_text(encoding="utf-8")
        assert [int(n) for n in CLAIM.findall(text)] == [n + (n >= AT) for n in before], name


def test_rename_changes_names_not_numbers(tmp_path: Path) -> None:
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "01_a.ipynb").write_text("{}")
    (tmp_path / "book" / "02_b.ipynb").write_text("{}")
    plan = renumber.plan_rename(tmp_path, "b", "bee")
    assert plan.stems == {"02_b": "02_bee"} and not plan.renumbered
    assert rewrite_prose("[chapter 2](02_b.ipynb) and 02_bee", plan) == (
        "[chapter 2](02_bee.ipynb) and 02_bee"
    )
    with pytest.raises(SystemExit):
        renumber.plan_rename(tmp_path, "b", "03_bee")


def test_regions_marked_off_are_left_alone(tmp_path: Path) -> None:
    text = (
        "See chapter 9.\n<!-- renumber: off -->\nExample: chapter 9 and 09_modern_attention.\n"
        "<!-- renumber: on -->\nAnd chapter 10.\n"
    )
    (tmp_path / "notes.md").write_text(text)
    new = renumber.rewrite_file(tmp_path, "notes.md", insert_at(8), Report())
    assert new == text.replace("See chapter 9", "See chapter 10").replace(
        "And chapter 10", "And chapter 11"
    )
