"""Insert a chapter slot, or rename a chapter, and renumber everything that names chapters.

Usage (from the repository root)::

    python tools/renumber.py insert 8 attention_in_a_trained_model \\
        --title "Attention in a trained model" [--part "Part II: Models that attend"] \\
        [--skeleton] [--dry-run]
    python tools/renumber.py rename 09_modern_attention 09_attention_today [--dry-run]

``insert N SLUG`` moves every chapter numbered N or more up by one (``git mv`` of the
notebook and of its zh_CN catalog) and rewrites, in one pass, everything that names a
chapter by its number or by its file:

- links and file names: ``08_attention_that_writes.ipynb#anchor``, ``book/08_...``,
  ``08_attention_that_writes.html``, ``08_attention_that_writes:`` (any text file);
- titles: ``# 8. Attention that writes`` (a notebook's first heading), its msgid and its
  escaped msgstr ``8\\. ...``, and numbered link texts ``[8. Attention that writes](08_...)``;
- prose: "chapter 9", "Chapter 9's", "chapters 7 and 9", "chapters 9–12", "chapters 13, 14
  and 16", "Part II (chapters 7–9)", and in Chinese 第 9 章, 第 9–12 章, 第 13、14、16 章:
  in markdown cells, code cells (comments, strings) and their text outputs, figure
  captions, book/*.md, catalogs (msgid and msgstr alike, so a translation stays attached
  and ``tools/i18n.py update`` marks nothing fuzzy), attention_lib docstrings,
  benchmarks, README.md, binder/ and _toc.yml.

A range is rewritten endpoint by endpoint ("chapters 7–9" -> "chapters 7–10"), so a range
that straddles the inserted number now includes the new chapter: the tool lists each such
range for review. A number after "chapter" that is no chapter of the book (larger than the
last one, or followed by "of the paper"...) is left alone and listed. In tests/ and tools/
file names are rewritten but numbers are only listed: tests often spell made-up chapters.
CHANGELOG.md (history) is never touched.

The new chapter's notebook is the author's to write: the tool prints what it must contain.
``--skeleton`` writes a minimal notebook that passes the structure tests, adds it to
``_toc.yml`` and to the intro's table (English only; its catalog entries are left for
``tools/i18n.py update`` and the translator). Every renamed page is added to
``book/redirects.json`` (old docname -> new docname), which ``book/_ext/afs_site.py``
turns into static redirect pages in both editions.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CATALOGS = Path("locale/zh_CN/LC_MESSAGES/book")
REDIRECTS = Path("book/redirects.json")
TOC = Path("_toc.yml")
INTRO = Path("book/intro.md")

# Files that are never rewritten: history, this tool and its tests (they spell made-up
# chapters on purpose), generated and binary files.
SKIP = {"CHANGELOG.md", "tools/renumber.py", "tests/book/test_renumber.py", str(REDIRECTS)}
TEXT_SUFFIXES = {".ipynb", ".md", ".po", ".py", ".txt", ".yml", ".yaml", ".cfg", ".toml", ".in"}
TEXT_NAMES = {"Makefile", "run"}
# In these folders only file names change; chapter numbers in text are listed for review.
REVIEW_ONLY = ("tests/book/", "tests/browser/", "tools/", ".ci/", ".github/", "Makefile")

_CHAPTER_FILE = re.compile(r"^(\d\d)_([a-z0-9_]+)$")
_OFF_REGION = re.compile(r"(renumber: off.*?renumber: on)", re.DOTALL)

# "chapter 9", "Chapters 7 and 9", "chapters 10–16", "chapters 13, 14 and 16", "chapter 9's"
_NUM_SEP_EN = r"(?:\s*[–—-]\s*|,\s+and\s+|,\s+or\s+|,\s*|\s+and\s+|\s+or\s+|\s+to\s+|\s+through\s+)"
_EN = re.compile(rf"\b([Cc]hapters?|[Cc]h\.)(\s+)(\d+(?:{_NUM_SEP_EN}\d+)*)\b(?![.,]\d)")
# 第 9 章, 第 9–12 章, 第 13、14、16 章, 第 7 和 9 章
_NUM_SEP_ZH = r"(?:\s*[–—~-]\s*|\s*[、，,]\s*|\s*(?:和|与|及|至|到)\s*)"
_ZH = re.compile(rf"(第\s*)(\d+(?:{_NUM_SEP_ZH}\d+)*)(\s*章)")
_RANGE = re.compile(r"(\d+)(\s*(?:[–—~-]|至|到|\s+to\s+|\s+through\s+)\s*)(\d+)")
# What makes "chapter 3" someone else's chapter: "chapter 3 of the paper", "the paper's chapter 3".
_FOREIGN_AFTER = re.compile(r"\s+(?:of|in)\s+(?:the|a|an|their|his|her|its|this)\s+(?!book\b)\w+")
# "(chapters 10–12): ...; 11 serving (...); 12 attention across machines": chapters listed
# by their bare numbers (only listed for review).
_SPAN = re.compile(r"[Cc]hapters\s+(\d+)\s*[–—-]\s*(\d+)")
_BARE = re.compile(r"(?<=[:;]\s)(\d{1,2})\s+(?=[a-z])")
_FOREIGN_BEFORE = re.compile(r"(?:paper|thesis|book|report|textbook)(?:'s|’s)?\s+$", re.IGNORECASE)


@dataclass
class Plan:
    """What an operation changes: chapter numbers and page names, old -> new."""

    numbers: dict[int, int]  # every current chapter number -> its number afterwards
    stems: dict[str, str]  # "08_attention_that_writes" -> "09_attention_that_writes" (renamed only)
    inserted: int | None = None  # the number of the new slot, if any
    new_stem: str | None = None
    title: str | None = None
    part: str | None = None

    @property
    def renumbered(self) -> bool:
        return any(k != v for k, v in self.numbers.items())


@dataclass
class Report:
    files: dict[str, int] = field(default_factory=dict)  # path -> number of changes
    changes: list[str] = field(default_factory=list)  # "path: old -> new"
    review: list[str] = field(default_factory=list)  # ambiguous, for a human
    moves: list[tuple[str, str]] = field(default_factory=list)

    def add(self, path: str, old: str, new: str) -> None:
        self.files[path] = self.files.get(path, 0) + 1
        self.changes.append(f"{path}: {old!r} -> {new!r}")


# --------------------------------------------------------------------------- the book


def chapters(root: Path) -> dict[int, str]:
    """Chapter number -> stem (``8 -> "08_attention_that_writes"``), from book/NN_*.ipynb."""
    found: dict[int, str] = {}
    for nb in sorted((root / "book").glob("[0-9][0-9]_*.ipynb")):
        n = int(nb.stem[:2])
        if n in found:
            raise SystemExit(f"two notebooks for chapter {n}: {found[n]}, {nb.stem}")
        found[n] = nb.stem
    return found


def plan_insert(
    root: Path, number: int, slug: str, title: str | None = None, part: str | None = None
) -> Plan:
    current = chapters(root)
    if not re.fullmatch(r"[a-z0-9_]+", slug):
        raise SystemExit(f"the slug must be lower-case words joined by _, got {slug!r}")
    last = max(current)
    if not 1 <= number <= last + 1:
        raise SystemExit(f"a new chapter can be inserted at 1..{last + 1}, not {number}")
    if any(s[3:] == slug for s in current.values()):
        raise SystemExit(f"a chapter is already called {slug!r}")
    numbers = {n: (n + 1 if n >= number else n) for n in current}
    stems = {s: f"{numbers[n]:02d}_{s[3:]}" for n, s in current.items() if numbers[n] != n}
    return Plan(numbers, stems, number, f"{number:02d}_{slug}", title, part)


def plan_rename(root: Path, old: str, new: str) -> Plan:
    current = chapters(root)
    old_stem = next((s for s in current.values() if old in (s, s[3:])), None)
    if old_stem is None:
        raise SystemExit(f"no chapter {old!r}; chapters: {', '.join(current.values())}")
    new_stem = new if _CHAPTER_FILE.match(new) else f"{old_stem[:2]}_{new}"
    if not _CHAPTER_FILE.match(new_stem) or new_stem[:2] != old_stem[:2]:
        raise SystemExit(f"rename keeps the number: {old_stem} -> {new_stem}? (use insert to move)")
    if new_stem in current.values():
        raise SystemExit(f"{new_stem} exists already")
    return Plan({n: n for n in current}, {old_stem: new_stem})


# --------------------------------------------------------------------------- text rules


def _map_numbers(numbers: str, plan: Plan, where: str, report: Report | None) -> str | None:
    """The list of chapter numbers ``numbers`` ("7–9", "13, 14 and 16") renumbered; None if
    one of them is no chapter of the book (left alone, for review)."""
    values = [int(x) for x in re.findall(r"\d+", numbers)]
    if any(v not in plan.numbers for v in values):
        if report is not None:
            report.review.append(f"{where}: not a chapter of the book, left alone: {numbers!r}")
        return None
    if plan.inserted is not None and report is not None:
        for a, _, b in _RANGE.findall(numbers):
            if int(a) < plan.inserted <= int(b):
                report.review.append(
                    f"{where}: the range {numbers!r} now includes the new chapter {plan.inserted}"
                )
    return re.sub(r"\d+", lambda m: str(plan.numbers[int(m.group(0))]), numbers)


def rewrite_prose(
    text: str, plan: Plan, where: str = "", report: Report | None = None, numbers: bool = True
) -> str:
    """``text`` with its chapter mentions, links and file names renumbered (see the module
    docstring). With ``numbers`` false only file names change; number mentions are listed."""

    def stem(m: re.Match) -> str:
        return plan.stems[m.group(0)]

    if plan.stems:
        names = "|".join(sorted(map(re.escape, plan.stems), key=len, reverse=True))
        text = re.sub(rf"(?<![\w/.-])(?:{names})(?![a-z0-9_])", stem, text)
        text = re.sub(rf"(?<=/)(?:{names})(?![a-z0-9_])", stem, text)
    if not plan.renumbered:
        return text

    def english(m: re.Match) -> str:
        word, space, nums = m.groups()
        before = text[max(0, m.start() - 40) : m.start()]
        after = text[m.end() : m.end() + 40]
        context = f"{where}: {before[-25:]}[{m.group(0)}]{after[:25]}".replace("\n", " ")
        if _FOREIGN_AFTER.match(after) or _FOREIGN_BEFORE.search(before):
            if report is not None:
                report.review.append(f"{context}  (another work's chapter? left alone)")
            return m.group(0)
        if not numbers:
            if report is not None and any(
                int(x) in plan.numbers and plan.numbers[int(x)] != int(x)
                for x in re.findall(r"\d+", nums)
            ):
                report.review.append(f"{context}  (in a test or tool: not rewritten)")
            return m.group(0)
        new = _map_numbers(nums, plan, context, report)
        return m.group(0) if new is None else word + space + new

    def chinese(m: re.Match) -> str:
        head, nums, tail = m.groups()
        context = f"{where}: [{m.group(0)}]"
        if not numbers:
            if report is not None and any(
                int(x) in plan.numbers and plan.numbers[int(x)] != int(x)
                for x in re.findall(r"\d+", nums)
            ):
                report.review.append(f"{context}  (in a test or tool: not rewritten)")
            return m.group(0)
        new = _map_numbers(nums, plan, context, report)
        return m.group(0) if new is None else head + new + tail

    def numbered_link(m: re.Match) -> str:
        # "[8. Attention that writes](09_attention_that_writes.ipynb": the file is renamed
        # already; the number follows the file's.
        _, rest, target = m.groups()
        return f"[{int(target[:2])}{rest}{target}"

    def bare(m: re.Match) -> str:
        # "(chapters 10–12): ...; 11 serving (...); 12 attention across machines": a bare
        # number inside the range just announced is a chapter's.
        n = int(m.group(1))
        ranges = _SPAN.findall(text[max(0, m.start() - 300) : m.start()])
        if n not in plan.numbers or plan.numbers[n] == n or not ranges:
            return m.group(0)
        context = f"{where}: {text[max(0, m.start() - 30) : m.end() + 20]!r}"
        a, b = map(int, ranges[-1])
        if numbers and a <= n <= b:
            return str(plan.numbers[n]) + m.group(0)[len(m.group(1)) :]
        if report is not None:
            report.review.append(f"{context}  (a bare number that may be a chapter's: left alone)")
        return m.group(0)

    text = _BARE.sub(bare, text)
    text = _EN.sub(english, text)
    text = _ZH.sub(chinese, text)
    if numbers:
        text = re.sub(
            r"\[(\d+)(\\?\.\s[^\]\n]*\]\()(\d\d_[a-z0-9_]+)(?=\.(?:ipynb|html|md))",
            numbered_link,
            text,
        )
    return text


def rewrite_title(text: str, old: int, new: int) -> str:
    """A chapter title "# 8. Title", a msgid "8. Title" or a msgstr "8\\. 标题" renumbered."""
    return re.sub(
        rf"^(#\s+)?{old}(\\?\.\s)", lambda m: f"{m.group(1) or ''}{new}{m.group(2)}", text, count=1
    )


def _counted(report: Report, path: str, old: str, new: str) -> str:
    if old != new:
        report.add(path, *_diff(old, new))
    return new


def _diff(old: str, new: str) -> tuple[str, str]:
    """The differing middle of two strings, with a little context."""
    i = 0
    while i < min(len(old), len(new)) and old[i] == new[i]:
        i += 1
    j = 0
    while j < min(len(old), len(new)) - i and old[-1 - j] == new[-1 - j]:
        j += 1
    a, b = max(0, i - 20), 20
    return old[a : len(old) - max(0, j - b)], new[a : len(new) - max(0, j - b)]


# --------------------------------------------------------------------------- files


def rewrite_notebook(text: str, plan: Plan, path: str, report: Report, number: int | None) -> str:
    """A notebook's JSON with its markdown, code, text outputs and captions renumbered."""
    import nbformat

    nb = nbformat.reads(text, as_version=4)
    first_heading = True

    def fix(s: str, where: str) -> str:
        return _counted(report, path, s, rewrite_prose(s, plan, f"{path} ({where})", report))

    for i, cell in enumerate(nb.cells):
        source = cell.source
        if cell.cell_type == "markdown" and first_heading and source.lstrip().startswith("# "):
            first_heading = False
            if number is not None and number in plan.numbers:
                source = _counted(
                    report, path, source, rewrite_title(source, number, plan.numbers[number])
                )
        cell.source = fix(source, f"cell {i}")
        if cell.cell_type == "markdown":
            for a, b in zip(source.split("\n"), cell.source.split("\n")):
                if a != b and a.startswith("#") and not a.startswith("# "):
                    report.review.append(f"{path}: heading {a!r} -> {b!r}: its #anchor changes")
        for key, value in list(cell.metadata.get("mystnb", {}).items()):
            if isinstance(value, dict):
                for k, v in value.items():
                    if isinstance(v, str):
                        value[k] = fix(v, f"cell {i} {key}.{k}")
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = fix(out["text"], f"cell {i} output")
            for mime in ("text/plain", "text/html", "text/markdown"):
                if mime in out.get("data", {}):
                    value = out["data"][mime]
                    joined = "".join(value) if isinstance(value, list) else value
                    out["data"][mime] = fix(joined, f"cell {i} output")
    return nbformat.writes(nb) + "\n"


_PO_STRING = re.compile(r'^(msgid |msgstr |msgctxt |msgid_plural |msgstr\[\d+\] )?"(.*)"$')


def _po_unescape(s: str) -> str:
    return re.sub(
        r"\\(.)", lambda m: {"n": "\n", "t": "\t", "r": "\r"}.get(m.group(1), m.group(1)), s
    )


def _po_escape(s: str) -> str:
    return (
        s.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\t", "\\t")
        .replace("\r", "\\r")
    )


def rewrite_catalog(text: str, plan: Plan, path: str, report: Report, number: int | None) -> str:
    """A .po catalog renumbered line by line: every msgid and msgstr the same way (the
    header and comments are left alone). The chapter's title is its first message."""
    out, header, title_lines = [], True, 0
    for line in text.split("\n"):
        m = _PO_STRING.match(line)
        if line.startswith("msgid ") and m and m.group(2):
            header = False
        if not m or header:
            out.append(line)
            continue
        prefix, body = m.group(1) or "", _po_unescape(m.group(2))
        new = body
        if (
            prefix in ("msgid ", "msgstr ")
            and number is not None
            and title_lines < 2
            and number in plan.numbers
        ):
            title_lines += 1
            new = rewrite_title(new, number, plan.numbers[number])
        new = rewrite_prose(new, plan, path, report)
        if new != body:
            report.add(path, *_diff(body, new))
            line = f'{prefix}"{_po_escape(new)}"'
        out.append(line)
    return "\n".join(out)


def tracked_files(root: Path) -> list[str]:
    """The repository's text files to look at (git's list when there is one)."""
    try:
        # Tracked files and new ones not yet added (a chapter being written), not ignored ones.
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
        names = [n for n in listed if n and (root / n).is_file()]
    except (subprocess.CalledProcessError, FileNotFoundError):
        names = [
            str(p.relative_to(root))
            for p in root.rglob("*")
            if p.is_file()
            and not any(
                part.startswith((".", "_build")) or part.endswith(".egg-info")
                for part in p.relative_to(root).parts
            )
        ]
    return sorted(
        n
        for n in names
        if n not in SKIP and (Path(n).suffix in TEXT_SUFFIXES or Path(n).name in TEXT_NAMES)
    )


def rewrite_file(root: Path, name: str, plan: Plan, report: Report) -> str | None:
    """The new text of ``name``, or None if nothing changes."""
    text = (root / name).read_text(encoding="utf-8")
    stem = Path(name).stem
    number = (
        int(stem[:2])
        if _CHAPTER_FILE.match(stem) and name.startswith(("book/", str(CATALOGS)))
        else None
    )
    if name.endswith(".ipynb"):
        new = rewrite_notebook(text, plan, name, report, number)
        if new.rstrip("\n") == text.rstrip("\n"):
            return None
    elif name.endswith(".po"):
        new = rewrite_catalog(text, plan, name, report, number)
    else:
        numbers = not name.startswith(REVIEW_ONLY)
        # Text between "renumber: off" and "renumber: on" (in a comment) is kept as it is:
        # examples of the tool's own, history.
        parts = _OFF_REGION.split(text)
        new = "".join(
            part if i % 2 else rewrite_prose(part, plan, name, report, numbers=numbers)
            for i, part in enumerate(parts)
        )
        if new != text:
            for old_part, new_part in _line_diffs(text, new):
                report.add(name, old_part, new_part)
    return None if new == text else new


def _line_diffs(old: str, new: str) -> list[tuple[str, str]]:
    a, b = old.split("\n"), new.split("\n")
    return (
        [_diff(x, y) for x, y in zip(a, b) if x != y]
        if len(a) == len(b)
        else [(old[:60], new[:60])]
    )


# --------------------------------------------------------------------------- toc, redirects


def toc_with_slot(toc: str, plan: Plan, current: dict[int, str]) -> str:
    """``_toc.yml`` (already renamed) with the new chapter's entry: after the chapter before
    it, or before the chapter after it when that one opens ``plan.part`` (or no chapter
    precedes), in the part named ``plan.part`` if given."""
    entry = f"book/{plan.new_stem}"
    before = current.get(plan.inserted - 1)
    after = current.get(plan.inserted)
    lines = toc.split("\n")

    def index(stem: str) -> int:
        target = f"book/{plan.stems.get(stem, stem)}"
        return next(i for i, l in enumerate(lines) if l.strip() == f"- file: {target}")

    def part_of(i: int) -> str:
        for line in reversed(lines[:i]):
            m = re.match(r"\s*- caption:\s*(.*)$", line)
            if m:
                return m.group(1).strip().strip("\"'")
        return ""

    if before and (plan.part is None or plan.part.lower() in part_of(index(before)).lower()):
        i = index(before)
        at = i + 1
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    elif after and (plan.part is None or plan.part.lower() in part_of(index(after)).lower()):
        at = index(after)
        indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    else:
        raise SystemExit(
            f"--part {plan.part!r}: neither chapter {plan.inserted - 1} nor "
            f"{plan.inserted} is in that part of _toc.yml"
        )
    lines.insert(at, f"{indent}- file: {entry}")
    return "\n".join(lines)


def updated_redirects(old: dict[str, str], stems: dict[str, str]) -> dict[str, str]:
    """The redirect map after renaming ``stems``: each renamed page redirects to its new
    name, earlier redirects follow the renaming (no chains), and a name that is a page
    again stops redirecting."""
    new_docs = {f"book/{b}" for b in stems.values()}
    result = {}
    for src, dst in old.items():
        dst_stem = dst.split("/", 1)[1] if dst.startswith("book/") else dst
        result[src] = f"book/{stems[dst_stem]}" if dst_stem in stems else dst
    for a, b in stems.items():
        result[f"book/{a}"] = f"book/{b}"
    return {k: v for k, v in sorted(result.items()) if k not in new_docs and k != v}


# --------------------------------------------------------------------------- skeleton


def skeleton(number: int, title: str, slug: str) -> str:
    """A minimal chapter notebook that passes tests/book's structure checks (a slot for the
    author: every section says what it still needs)."""
    import nbformat

    first = nbformat.read(ROOT / "book" / "01_qkv.ipynb", as_version=4).cells[0]
    exercises = (
        "Try each exercise before you open its solution; every solution runs and checks "
        "itself with `assert`."
    )
    cells = [
        nbformat.v4.new_code_cell(first.source, metadata=dict(first.metadata)),
        nbformat.v4.new_markdown_cell(f"# {number}. {title}\n\nThis chapter is being written."),
        nbformat.v4.new_markdown_cell("## Summary\n\nTo be written."),
        nbformat.v4.new_markdown_cell(f"## Exercises\n\n{exercises}\n\n1. To be written."),
        nbformat.v4.new_code_cell(
            "# The solution of exercise 1, which checks itself.\nassert True",
            metadata={"tags": ["hide-input", "hide-output"]},
        ),
        nbformat.v4.new_markdown_cell("## See also\n\nTo be written."),
    ]
    nb = nbformat.v4.new_notebook(
        cells=cells, metadata=nbformat.read(ROOT / "book" / "01_qkv.ipynb", as_version=4).metadata
    )
    # Stored as run (the hygiene test): neither code cell prints anything.
    for count, cell in enumerate((c for c in nb.cells if c.cell_type == "code"), start=1):
        cell.execution_count = count
    return nbformat.writes(nb) + "\n"


def intro_with_row(intro: str, plan: Plan) -> str:
    """The intro's chapter table with a row for the new chapter, after the one before it."""
    row = f"| [{plan.inserted}. {plan.title}]({plan.new_stem}.ipynb) | to be written | to be written |"
    lines = intro.split("\n")
    prev = f"({plan.inserted - 1:02d}_"
    for i, line in enumerate(lines):
        if line.startswith("| [") and prev in line:
            lines.insert(i + 1, row)
            return "\n".join(lines)
    raise SystemExit("the intro has no table row for the chapter before the new one")


def what_to_write(plan: Plan) -> str:
    return (
        f"The new chapter: book/{plan.new_stem}.ipynb (not created; --skeleton writes a stub)\n"
        f"  - first cell: the Colab install cell (copy it from book/01_qkv.ipynb)\n"
        f"  - title: '# {plan.inserted}. {plan.title or '<Title>'}'\n"
        f"  - ends with '## Summary', '## Exercises' (opening with the common sentence, "
        f"hidden solutions that assert), '## See also'\n"
        f"  - _toc.yml: '- file: book/{plan.new_stem}' after chapter {plan.inserted - 1}"
        f"{' in ' + plan.part if plan.part else ''}\n"
        f"  - book/intro.md: a row in its part's table, "
        f"'| [{plan.inserted}. {plan.title or '<Title>'}]({plan.new_stem}.ipynb) | ... | ... |'\n"
        f"  - then: tools/i18n.py update, translate locale/zh_CN/LC_MESSAGES/book/"
        f"{plan.new_stem}.po and the new intro.po row, tools/i18n.py check\n"
        f"  - review the ranges listed above that now include chapter {plan.inserted}"
    )


# --------------------------------------------------------------------------- apply


def _move(root: Path, src: str, dst: str, use_git: bool) -> None:
    tracked = (
        use_git
        and subprocess.run(
            ["git", "ls-files", "--error-unmatch", src], cwd=root, capture_output=True, check=False
        ).returncode
        == 0
    )
    if (root / dst).exists():
        raise SystemExit(f"{dst} exists already")
    if tracked:
        subprocess.run(["git", "mv", src, dst], cwd=root, check=True)
    else:  # a file not yet added to git
        (root / src).rename(root / dst)


def apply(root: Path, plan: Plan, dry_run: bool, make_skeleton: bool = False) -> Report:
    report = Report()
    current = chapters(root)
    new_texts = {}
    for name in tracked_files(root):
        new = rewrite_file(root, name, plan, report)
        if new is not None:
            new_texts[name] = new
    toc_text = new_texts.get(str(TOC), (root / TOC).read_text(encoding="utf-8"))
    if plan.inserted is not None and make_skeleton:
        new_texts[str(TOC)] = toc_with_slot(toc_text, plan, current)
        intro = new_texts.get(str(INTRO), (root / INTRO).read_text(encoding="utf-8"))
        new_texts[str(INTRO)] = intro_with_row(intro, plan)
    for old, new in sorted(plan.stems.items()):
        report.moves.append((f"book/{old}.ipynb", f"book/{new}.ipynb"))
        if (root / CATALOGS / f"{old}.po").exists():
            report.moves.append((f"{CATALOGS}/{old}.po", f"{CATALOGS}/{new}.po"))
    redirects_path = root / REDIRECTS
    redirects = json.loads(redirects_path.read_text()) if redirects_path.exists() else {}
    redirects = updated_redirects(redirects, plan.stems)
    if dry_run:
        return report
    use_git = (root / ".git").exists()
    for name, text in new_texts.items():
        (root / name).write_text(text, encoding="utf-8")
    # Highest first, so that 09 -> 10 is done before 08 -> 09.
    for src, dst in sorted(report.moves, key=lambda m: m[0], reverse=True):
        _move(root, src, dst, use_git)
        if src.endswith(".po"):
            (root / src).with_suffix(".mo").unlink(missing_ok=True)  # stale, rebuilt by Sphinx
    redirects_path.write_text(json.dumps(redirects, indent=2, ensure_ascii=False) + "\n")
    if plan.inserted is not None and make_skeleton:
        (root / "book" / f"{plan.new_stem}.ipynb").write_text(
            skeleton(
                plan.inserted,
                plan.title or plan.new_stem[3:].replace("_", " ").capitalize(),
                plan.new_stem[3:],
            ),
            encoding="utf-8",
        )
    return report


def print_report(report: Report, plan: Plan, dry_run: bool, verbose: bool = True) -> None:
    say = "would" if dry_run else "did"
    for src, dst in report.moves:
        print(f"{say} move {src} -> {dst}")
    if verbose:
        for change in report.changes:
            print(change)
    mentions = sum(report.files.values())
    print(
        f"\n{len(report.moves)} files {say} move; {mentions} changes in {len(report.files)} files"
    )
    for name, count in sorted(report.files.items()):
        print(f"  {count:4d}  {name}")
    if report.review:
        print(f"\n{len(report.review)} mentions to review:")
        for item in report.review:
            print(f"  {item}")
    if plan.stems:
        print(
            "\nredirects (book/redirects.json): "
            + ", ".join(f"book/{a} -> book/{b}" for a, b in sorted(plan.stems.items()))
        )
    if plan.inserted is not None:
        print("\n" + what_to_write(plan))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ins = sub.add_parser("insert", help="insert a chapter slot at NUMBER, renumbering the rest")
    ins.add_argument("number", type=int)
    ins.add_argument("slug")
    ins.add_argument("--title")
    ins.add_argument("--part", help="the _toc.yml part caption (or part of it) of the new chapter")
    ins.add_argument(
        "--skeleton",
        action="store_true",
        help="also write a stub notebook, its _toc.yml entry and intro row",
    )
    ren = sub.add_parser("rename", help="rename a chapter's file (same number)")
    ren.add_argument("old")
    ren.add_argument("new")
    for p in (ins, ren):
        p.add_argument("--dry-run", action="store_true", help="print every change, change nothing")
        p.add_argument("--quiet", action="store_true", help="the summary only")
        p.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if args.command == "insert":
        plan = plan_insert(root, args.number, args.slug, args.title, args.part)
        report = apply(root, plan, args.dry_run, args.skeleton)
    else:
        plan = plan_rename(root, args.old, args.new)
        report = apply(root, plan, args.dry_run)
    print_report(report, plan, args.dry_run, verbose=not args.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
