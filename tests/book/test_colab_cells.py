"""Each chapter's Colab cell (its first, hidden cell) installs what the chapter imports.

On Colab the cell installs ``attention_lib`` from the book's repository with ``--no-deps``
(Colab already has torch, numpy, matplotlib, ipywidgets, IPython, tqdm and Pillow, and
reinstalling torch there would pull a multi-GB build). Anything else a chapter imports
from outside the standard library must be installed by the cell, pinned exactly as
``requirements.txt`` pins it: Colab may have another version, or none (issue 29, item 10).
The cell is parsed, not run: it does nothing outside Colab.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import shlex
import sys
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())

# Distributions a Colab runtime ships, which the book uses at whatever version Colab has.
COLAB_HAS = {"torch", "numpy", "matplotlib", "ipywidgets", "ipython", "tqdm", "pillow"}
LIBRARY = "attention_lib"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    """Distribution -> its ``name==version`` line of requirements.txt (exact pins only)."""
    found = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$", line.strip())
        if m:
            found[canonical(m.group(1))] = f"{m.group(1)}=={m.group(2)}"
    return found


def distribution(module: str) -> str:
    """The distribution an import name comes from (``PIL`` -> ``pillow``)."""
    names = importlib.metadata.packages_distributions().get(module)
    assert names, f"no installed distribution provides the module {module!r}"
    return canonical(names[0])


def imported_modules(source: str) -> set[str]:
    """Top-level names of the modules a piece of notebook code imports (anywhere in it)."""
    code = "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()
    )
    found = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def third_party(modules: set[str]) -> set[str]:
    """Distributions behind ``modules``, leaving out the standard library and the book's own."""
    return {distribution(m) for m in modules if m not in sys.stdlib_module_names and m != LIBRARY}


def pip_installs(cell_source: str) -> list[tuple[list[str], list[str]]]:
    """(options, requirements) of each ``%pip install`` line of a cell."""
    found = []
    for line in cell_source.splitlines():
        if not line.strip().startswith("%pip"):
            continue
        words = shlex.split(line.strip())
        if words[:2] == ["%pip", "install"]:
            rest = words[2:]
            found.append(([w for w in rest if w.startswith("-")], [w for w in rest if w[0] != "-"]))
    return found


def chapter(nb: Path) -> tuple[dict, str]:
    cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
    code = "\n".join("".join(c["source"]) for c in cells[1:] if c["cell_type"] == "code")
    return cells[0], code


def test_the_parsers_read_what_a_cell_says() -> None:
    cell = (
        'import sys\nif "google.colab" in sys.modules:\n'
        '    %pip install -q "transformers==5.24.0"\n'
        '    %pip install -q --no-deps "attention_lib @ git+https://x/y@main"\n'
    )
    assert pip_installs(cell) == [
        (["-q"], ["transformers==5.24.0"]),
        (["-q", "--no-deps"], ["attention_lib @ git+https://x/y@main"]),
    ]
    code = (
        "%matplotlib inline\nimport torch.nn as nn\ndef f():\n    from PIL import Image\nimport os"
    )
    assert imported_modules(code) == {"torch", "PIL", "os"}
    assert third_party({"torch", "PIL", "os", "attention_lib"}) == {"torch", "pillow"}


def test_attention_lib_needs_nothing_colab_lacks() -> None:
    """The cell installs it with --no-deps: its dependencies must already be on Colab."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needs = {canonical(re.split(r"[<>=!~\[ ;]", d)[0]) for d in project["dependencies"]}
    assert needs <= COLAB_HAS, f"attention_lib needs {sorted(needs - COLAB_HAS)}, not on Colab"
    imports = set()
    for path in (ROOT / LIBRARY).rglob("*.py"):
        imports |= imported_modules(path.read_text(encoding="utf-8"))
    assert third_party(imports) <= COLAB_HAS, sorted(third_party(imports) - COLAB_HAS)


@pytest.mark.parametrize("nb", CHAPTERS, ids=lambda p: p.name)
def test_the_colab_cell_installs_what_the_chapter_imports(nb: Path) -> None:
    first, code = chapter(nb)
    source = "".join(first["source"])
    assert first["cell_type"] == "code" and "remove-cell" in first["metadata"].get("tags", [])
    assert 'if "google.colab" in sys.modules:' in source, f"{nb.name}: runs outside Colab"
    installs = pip_installs(source)
    assert all(line.startswith(" ") for line in source.splitlines() if "%pip" in line), (
        f"{nb.name}: a %pip line outside the Colab-only block"
    )

    library = [(opts, reqs) for opts, reqs in installs if any(LIBRARY in r for r in reqs)]
    assert len(library) == 1, f"{nb.name}: attention_lib installed {len(library)} times"
    opts, reqs = library[0]
    repo, branch = CONFIG["repository"]["url"], CONFIG["repository"]["branch"]
    assert reqs == [f"{LIBRARY} @ git+{repo}@{branch}"], reqs
    assert "--no-deps" in opts, f"{nb.name}: attention_lib must be installed with --no-deps"

    pinned = pins()
    needed = third_party(imported_modules(code)) - COLAB_HAS
    want = set()
    for dist in needed:
        assert dist in pinned, f"{nb.name} imports {dist}: pin it in requirements.txt (==)"
        want.add(pinned[dist])
    others = {r for opts, reqs in installs for r in reqs if LIBRARY not in r}
    assert others == want, (
        f"{nb.name} imports {sorted(needed) or 'nothing Colab lacks'}: its Colab cell must "
        f"install {sorted(want) or 'attention_lib only'}, installs {sorted(others)}"
    )
    for opts, reqs in installs:
        if LIBRARY not in " ".join(reqs):  # a pinned package brings its own dependencies
            assert "--no-deps" not in opts, f"{nb.name}: {reqs} without its dependencies"


def test_a_chapter_that_imports_transformers_installs_the_pinned_version() -> None:
    """The case that motivated the test (chapter 9 checks against 🤗 transformers)."""
    users = [nb for nb in CHAPTERS if "transformers" in imported_modules(chapter(nb)[1])]
    assert users, "no chapter imports transformers any more: drop this test"
    for nb in users:
        source = "".join(chapter(nb)[0]["source"])
        assert [pins()["transformers"]] in [reqs for _, reqs in pip_installs(source)], nb.name
