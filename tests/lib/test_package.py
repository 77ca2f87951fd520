"""Tests of the package as a whole: its layout, its imports and its tests' hygiene.

Nothing here reads the book (tests/book/ does).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import attention_lib

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "attention_lib"
DISPLAY_PACKAGES = {"matplotlib", "ipywidgets", "IPython", "tqdm"}


def _imported_top_names(path: Path) -> set[str]:
    """Top-level package names of every import in ``path``, also inside functions."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_top_level_module_imports_the_display_kit():
    modules = sorted(PACKAGE.glob("*.py"))
    assert len(modules) >= 8  # the glob found the package
    offenders = {
        p.name: sorted(_imported_top_names(p) & DISPLAY_PACKAGES)
        for p in modules
        if _imported_top_names(p) & DISPLAY_PACKAGES
    }
    assert offenders == {}, f"move display code into attention_lib/show/: {offenders}"
    # ... and the display kit itself does import them (the check above can fail).
    shown = set().union(*(_imported_top_names(p) for p in (PACKAGE / "show").glob("*.py")))
    assert DISPLAY_PACKAGES <= shown


def test_importing_the_package_loads_no_display_library():
    # torch itself imports tqdm: count only what attention_lib adds to torch's imports.
    code = (
        "import sys, numpy, torch; before = set(sys.modules); import attention_lib; "
        "print(sorted({m.split('.')[0] for m in set(sys.modules) - before}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    added = set(ast.literal_eval(result.stdout.strip()))
    assert "attention_lib" in added  # the measurement sees what the import adds
    assert added & DISPLAY_PACKAGES == set()


def test_display_names_are_re_exported_at_the_top_level():
    from attention_lib.show import explorer, viz

    for module, name in [
        (viz, "attention_heatmap"),
        (viz, "attention_grid"),
        (explorer, "explore"),
        (explorer, "SliderExplorer"),
    ]:
        assert getattr(attention_lib, name) is getattr(module, name)
        assert name in attention_lib.__all__


def _builtin_hash_calls(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hash"
    ]


def test_nothing_depends_on_hash_randomisation():
    # Python randomises str hashes per process (PYTHONHASHSEED): a test or a
    # function that derives values from hash() passes or fails at random.
    files = sorted(PACKAGE.rglob("*.py")) + sorted((ROOT / "tests").rglob("*.py"))
    calls = {str(p.relative_to(ROOT)): _builtin_hash_calls(p) for p in files}
    assert {p: lines for p, lines in calls.items() if lines} == {}


def test_pyproject_does_not_let_pip_pick_a_torch_build():
    text = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"dependencies\s*=\s*\[(.*?)\]", text, re.S).group(1)
    assert "torch" not in deps


def test_pyproject_lists_every_sub_package():
    # A sub-package left out of [tool.setuptools] packages is missing from a wheel: a
    # non-editable install (the chapters' Colab cell) could not import attention_lib.
    import tomllib

    listed = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]["packages"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.rglob("__init__.py")}
    assert "attention_lib.show" in on_disk  # the scan sees the sub-packages
    assert on_disk <= set(listed), sorted(on_disk - set(listed))


def test_pyproject_lists_every_third_party_import():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    listed = {
        dep.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0].strip().lower()
        for dep in project["dependencies"]
    }
    imported = set().union(*(_imported_top_names(p) for p in PACKAGE.rglob("*.py")))
    dist = {"pil": "pillow"}  # import name -> distribution name, where they differ
    third_party = {
        dist.get(name.lower(), name.lower())
        for name in imported - set(sys.stdlib_module_names) - {"attention_lib", "__future__"}
    }
    # torch is pinned in requirements.txt on purpose (a range here would pull a CUDA build).
    assert third_party - {"torch"} <= listed, sorted(third_party - {"torch"} - listed)
    assert "tqdm" in third_party  # the scan sees the lazy imports inside functions


def test_library_and_tests_are_ruff_formatted():
    # Settings in pyproject.toml's [tool.ruff]; pre-commit runs the same formatter.
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "attention_lib", "tests"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, (
        "run `.venv/bin/ruff format attention_lib tests`:\n" + result.stdout + result.stderr
    )
    assert "already formatted" in result.stdout  # ruff looked at the files


def test_only_the_package_has_an_all_list():
    # One list of public names: attention_lib.__all__. Module-level lists drifted
    # away from it before.
    modules = [p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "__init__.py"]
    with_all = sorted(
        str(p.relative_to(ROOT))
        for p in modules
        if any(
            isinstance(node, (ast.Assign, ast.AnnAssign))
            and "__all__"
            in ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target)
            for node in ast.parse(p.read_text(encoding="utf-8")).body
        )
    )
    assert with_all == []
    exported = attention_lib.__all__
    assert len(exported) == len(set(exported))
    assert all(hasattr(attention_lib, name) for name in exported)


def test_no_module_uses_another_modules_private_names():
    """What several modules share has a public name: no relative import of a private
    name (or from a private module), and no call into another object's private
    method (``other._forward(...)``); ``self``/``cls`` may use their own."""
    import ast

    offences = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                parts = (node.module or "").split(".") + [a.name for a in node.names]
                offences += [f"{path.name}: import {p}" for p in parts if p.startswith("_")]
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                and not (isinstance(node.value, ast.Name) and node.value.id == "torch")
            ):
                offences.append(f"{path.name}:{node.lineno}: .{node.attr}")
    assert offences == []


def _package_imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``a.b`` names relative to the
    package), from every import statement, also inside functions."""
    modules = {
        ".".join(p.relative_to(package).with_suffix("").parts).removesuffix("__init__").strip(".")
        for p in package.rglob("*.py")
    }
    graph = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package).with_suffix("").parts)
        name = ".".join(parts).removesuffix("__init__").strip(".")
        here = parts[:-1]  # the package the module is in
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                base = here[: len(here) - (node.level - 1)] + (node.module or "").split(".")
                base = [p for p in base if p]
                edges |= {
                    ".".join(target)
                    for alias in node.names
                    for target in (base + [alias.name], base)  # a submodule, else the module
                    if ".".join(target) in modules
                }
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = (
                    [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                )
                edges |= {
                    n.split(".", 1)[1] if "." in n else ""
                    for n in names
                    if n and n.split(".")[0] == package.name
                }
        graph[name] = {e for e in edges if e != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles of ``graph`` among modules other than a package's ``__init__``
    re-exporting its children (the modules on each cycle, in order)."""
    found, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                found.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def test_no_module_imports_a_module_that_imports_it():
    """Issue 34: convert.py and mha.py imported each other (mha inside its
    classmethods). Every import counts, also inside a function; a package's
    ``__init__`` importing its own modules is the only expected direction."""
    graph = _package_imports()
    assert "convert" in graph["mha"] and "mha" not in graph["convert"]
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_cycle_inside_a_function(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from .a import f\n")
    (package / "a.py").write_text("from .b import g\n\ndef f():\n    return g()\n")
    (package / "b.py").write_text("def g():\n    from .a import f\n\n    return f\n")
    graph = _package_imports(package)
    assert graph == {"": {"a"}, "a": {"b"}, "b": {"a"}}
    assert _cycles(graph) == [["a", "b", "a"]]


def _validation_share_tool():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "validation_share", ROOT / "tools" / "validation_share.py"
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_the_validation_count_sees_checks_inside_larger_expressions(tmp_path):
    # Issue 34: a check written inside an expression was not counted (39 lines).
    module = tmp_path / "m.py"
    module.write_text(
        "def f(window, gate, x):\n"
        '    """Docstring."""\n'
        '    w = None if window is None else check_int("window", window)  # 1\n'
        '    if check_bool("gate", gate):  # 2\n'
        "        x = x + 1\n"
        '    y = g(check_tensor("a", x), check_tensor("b", x))  # 3\n'
        "    z = h(\n"
        "        x,\n"
        '        check_real("s", x),  # 4\n'
        "    )\n"
        '    check_int("n", x)  # 5: a check statement, as before\n'
        "    return w, x, y, z\n"
    )
    validation, code = _validation_share_tool().module_share(module)
    assert (validation, code) == (5, 11)


def test_validation_stays_under_fifteen_percent_of_the_code():
    """Issue 21's budget: checks are a means, not the bulk of the package. Counted by
    tools/validation_share.py (2b2cc86: 850 of 2,979 code lines, 28.5%)."""
    validation, code, _ = _validation_share_tool().validation_share(PACKAGE)
    assert validation / code < 0.15, f"{validation} of {code} code lines validate"


def test_validation_stays_under_fifteen_percent_of_the_core():
    """Issue 34: the budget holds for the algorithms alone too, without the display kit
    (show/, whose many small widgets would otherwise dilute the share): 15.8% at 298f421
    (854 of 5,414 lines), 14.7% at bcc7276 (830 of 5,648), checks written once and
    shorter, none dropped."""
    _, _, per_module = _validation_share_tool().validation_share(PACKAGE)
    core = [(v, c) for name, (v, c) in per_module.items() if not name.startswith("show/")]
    validation, code = sum(v for v, _ in core), sum(c for _, c in core)
    assert validation / code < 0.15, f"{validation} of {code} code lines validate"
