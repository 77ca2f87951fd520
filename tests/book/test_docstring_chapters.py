"""The library's docstrings against the book: every "Explained in chapter N" claim of a
public name of attention_lib is true of chapter N's notebook."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import re
from pathlib import Path

import attention_lib

ROOT = Path(__file__).resolve().parents[2]


# --- "Explained in chapter N" claims ---------------------------------------------------

# A public name's docstring says which chapter explains it with a paragraph that
# starts "Explained in chapter N" (several chapters may be listed). The claim is
# true when the code of chapter N's notebook uses the name.
CLAIM = re.compile(r"Explained in (.*?)(?:\n\s*\n|$)", re.S)  # up to the paragraph's end


def _public_objects():
    """(qualified name, object) of every public function, class and method that a
    module of attention_lib defines."""
    for info in pkgutil.walk_packages(attention_lib.__path__, "attention_lib."):
        if info.name.rsplit(".", 1)[-1].startswith("_"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(obj) or inspect.isclass(obj):
                yield f"{info.name}.{name}", name, obj
            if inspect.isclass(obj):
                for member, attr in vars(obj).items():
                    if not member.startswith("_") and inspect.isfunction(attr):
                        yield f"{info.name}.{name}.{member}", name, attr


def _claimed_chapters(doc: str) -> set[int]:
    chapters = set()
    for paragraph in CLAIM.findall(doc):
        for match in re.finditer(r"\bchapters? ((?:\d+(?:, | and | or |-))*\d+)", paragraph):
            chapters |= {int(n) for n in re.findall(r"\d+", match.group(1))}
    return chapters


def _chapter_code() -> dict[int, str]:
    code = {}
    for path in sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        code[int(path.name[:2])] = "\n".join(
            "".join(c["source"]) for c in cells if c["cell_type"] == "code"
        )
    return code


def test_every_explained_in_chapter_claim_is_true():
    code = _chapter_code()
    claims, false = 0, []
    for qualname, name, obj in _public_objects():
        for chapter in sorted(_claimed_chapters(inspect.getdoc(obj) or "")):
            claims += 1
            if chapter not in code:
                false.append(f"{qualname} -> chapter {chapter}: no notebook book/{chapter:02d}_*")
            elif not re.search(rf"\b{re.escape(name)}\b", code[chapter]):
                false.append(f"{qualname} -> chapter {chapter}: its code never uses {name}")
    assert claims > 40  # the scan finds the claims
    assert false == []


def test_claim_parser_reads_lists_of_chapters():
    doc = "Intro.\n\nExplained in chapter 4, *The sum*; the masks in chapter 5\nand chapters 2 and 3.\n\nArgs: chapter 8"
    assert _claimed_chapters(doc) == {2, 3, 4, 5}
