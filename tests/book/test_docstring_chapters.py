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


def _first_explained() -> dict[str, int]:
    """The first chapter that explains each public name (``Class.method`` too), from
    the "Explained in chapter N" claims of its docstring."""
    first = {}
    for qualname, name, obj in _public_objects():
        chapters = _claimed_chapters(inspect.getdoc(obj) or "")
        key = qualname.split(".", 2)[-1] if qualname.count(".") >= 3 else name
        if chapters:
            first[key] = min(chapters | ({first[key]} if key in first else set()))
    return first


def _library_names_used(code: str) -> set[str]:
    """attention_lib names that notebook code calls or reads: names imported from the
    package (and ``Name.attr`` on them) and ``attention_lib.name`` attributes."""
    import ast

    tree = ast.parse(code)
    imported = {
        alias.asname or alias.name: alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attention_lib")
        for alias in node.names
    }
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in imported:
            used.add(imported[node.id])
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            base = node.value.id
            if base == "attention_lib":
                used.add(node.attr)
            elif base in imported:
                used.add(f"{imported[base]}.{node.attr}")
    return used


def _cleaned(code: str) -> str:
    """Notebook code without IPython magics and shell lines, so that ast can read it."""
    lines = code.splitlines()
    return "\n".join(
        line[: len(line) - len(line.lstrip())] + "pass"
        if line.lstrip().startswith(("%", "!"))
        else line
        for line in lines
    )


def test_no_chapter_uses_a_library_name_before_the_chapter_that_explains_it():
    first, early = _first_explained(), []
    for chapter, code in _chapter_code().items():
        for name in sorted(_library_names_used(_cleaned(code))):
            if first.get(name, chapter) > chapter:
                early.append(f"chapter {chapter} uses {name}, explained in chapter {first[name]}")
    assert early == []


def test_the_order_check_sees_a_name_from_a_later_chapter():
    code = "from attention_lib import tiled_attention, causal_mask\nimport attention_lib\n"
    code += "tiled_attention(q, k, v)\nattention_lib.generate(m, p, 3)\ncausal_mask(3)"
    used = _library_names_used(code)
    assert {"tiled_attention", "generate", "causal_mask"} <= used
    first = _first_explained()
    assert first["tiled_attention"] == 11 and first["causal_mask"] == 5
