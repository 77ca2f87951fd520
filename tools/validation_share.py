"""How much of a package's code is input validation: a line count with ``ast``.

Usage::

    python tools/validation_share.py [PACKAGE_DIR]   # default: this repository's attention_lib

prints, for every module of the package (sub-packages such as ``show/``
included), its code lines, its validation lines and their share, then the
total. From Python, :func:`validation_share` returns the same numbers, so a
test can hold a budget::

    validation, code, per_module = validation_share("attention_lib")
    assert validation / code < 0.15

**Code lines** are the lines of a module that carry a Python token: not blank,
not a comment, and not part of a docstring (the string that opens a module,
class or function body). A statement spread over several lines counts all of
them.

**Validation lines** are the code lines that exist only to check inputs and
report bad ones. A statement is a *check* if it is

* a ``raise`` with an exception (a bare ``raise`` that re-raises is not);
* a call to a check function, alone or as the value of an assignment or a
  ``return`` (``check_int("d_model", d_model, minimum=1)``,
  ``x = check_tensor("x", x)``, ``keep = self._check_inputs(...)``), where a
  check function is one named ``check_*``, ``_check_*`` or ``_check``, called
  by name or as an attribute;
* an ``assert``;
* an ``if`` whose body holds only checks (``if d % 2: raise ValueError(...)``),
  or assignments that prepare the message and then a ``raise``; with an
  ``else``/``elif`` that is not all checks, only the test and the body count;
* a ``for`` or ``with`` whose body holds only checks (a loop that checks
  every argument);
* a ``try`` of one statement whose ``except`` handlers only check (``try:
  torch.broadcast_shapes(...)`` / ``except RuntimeError: raise ValueError(...)``
  turns an error into a clear message).

A check call written *inside* a larger expression counts too, by the lines
the call spans (not the whole statement): ``self.window = None if window is
None else check_int("window", window, minimum=1)``, ``if check_bool("gate",
gate): ...``, ``nn.Dropout(check_dropout_p(dropout))``, two checks joined in
one tuple. (Before this rule, 39 such lines went uncounted.)

Every line of a *check function* counts too, from its decorators to its last
line (docstring excluded, as everywhere): a function named ``check_*``,
``_check_*`` or ``_check``, or one whose body, after the docstring, is only
checks, perhaps followed by a ``return`` of a name or a constant. Helpers
that check nothing (``trusted_inputs``, a function that formats an error
message) are code, not validation.

Calibration against issue 21 (package at commit 2b2cc86): the code lines are
2,979, the issue's count exactly (only with ``show/`` and ``__init__.py``
counted, and docstrings, comments and blank lines left out: without ``show/``
it is 2,137), and the validation lines are 850 against the issue's 853 (28.5%
vs 28.6%); ``rope.py`` 36/81 = 44%, ``mha.py`` 154/364 = 42% and
``generation.py`` 33/85 = 39%, against the issue's 44%, 41% and 38%.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "attention_lib"
"""The package measured by default: ``attention_lib`` next to ``tools/``."""

CHECK_NAME = re.compile(r"_?check(_|$)")
"""Function names that mark a check: ``check_*``, ``_check_*``, ``_check``."""

_NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _lines(node: ast.AST) -> set[int]:
    """The lines a node spans, decorators included."""
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return set(range(first, node.end_lineno + 1))


def _docstring(body: list[ast.stmt]) -> ast.stmt | None:
    """The docstring statement that opens ``body``, if any."""
    first = body[0] if body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return first
    return None


def code_lines(source: str, tree: ast.Module) -> set[int]:
    """Lines with a Python token, minus comments, blank lines and docstrings."""
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE:
            lines.update(range(token.start[0], token.end[0] + 1))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, *_FUNCTIONS)):
            doc = _docstring(node.body)
            if doc is not None:
                lines -= _lines(doc)
    return lines


def _calls_check(value: ast.expr | None) -> bool:
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    return bool(CHECK_NAME.match(name))


def _is_check(stmt: ast.stmt) -> bool:
    """Whether a whole statement is a check (see the module docstring)."""
    if isinstance(stmt, ast.Raise):
        return stmt.exc is not None
    if isinstance(stmt, ast.Assert):
        return True
    if isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign, ast.Return)):
        return _calls_check(stmt.value)
    if isinstance(stmt, ast.If):
        return _all_checks(stmt.body) and (not stmt.orelse or _all_checks(stmt.orelse))
    if isinstance(stmt, (ast.For, ast.With)):
        return _all_checks(stmt.body) and not getattr(stmt, "orelse", None)
    if isinstance(stmt, ast.Try):  # a probe whose error becomes a clear message
        return (
            len(stmt.body) == 1
            and all(_all_checks(handler.body) for handler in stmt.handlers)
            and not stmt.orelse
            and not stmt.finalbody
        )
    return False


def _all_checks(body: list[ast.stmt]) -> bool:
    """Whether a block only checks: all checks, or assignments ending in a ``raise``."""
    if not body:
        return False
    *before, last = body
    if isinstance(last, ast.Raise) and last.exc is not None:  # e.g. build the message, raise
        return all(isinstance(s, ast.Assign) or _is_check(s) for s in before)
    return all(_is_check(s) for s in body)


def _is_check_function(node: ast.AST) -> bool:
    if not isinstance(node, _FUNCTIONS):
        return False
    if CHECK_NAME.match(node.name):
        return True
    body = node.body[1:] if _docstring(node.body) else node.body
    last = body[-1] if body else None
    if isinstance(last, ast.Return) and isinstance(last.value, (ast.Name, ast.Constant)):
        body = body[:-1]  # a check may hand back its argument
    return _all_checks(body)


def _embedded_checks(tree: ast.AST) -> set[int]:
    """The lines of every call to a check function, wherever it is written."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if _calls_check(node):
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


def _validation(stmts: list[ast.stmt]) -> set[int]:
    """The validation lines among ``stmts`` and the statements nested in them."""
    lines: set[int] = set()
    for stmt in stmts:
        if _is_check_function(stmt) or _is_check(stmt):
            lines |= _lines(stmt)
        elif isinstance(stmt, ast.If) and _all_checks(stmt.body):
            lines |= set(range(stmt.lineno, stmt.body[-1].end_lineno + 1))
            lines |= _validation(stmt.orelse)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                lines |= _validation(getattr(stmt, field, []))
    return lines


def module_share(path: Path) -> tuple[int, int]:
    """``(validation lines, code lines)`` of one module."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    code = code_lines(source, tree)
    validation = _validation(tree.body) | _embedded_checks(tree)
    return len(validation & code), len(code)


def validation_share(
    package_dir: str | Path = PACKAGE_DIR,
) -> tuple[int, int, dict[str, tuple[int, int]]]:
    """Count the validation and code lines of every module under ``package_dir``.

    Returns ``(validation_lines, code_lines, per_module)``, where ``per_module``
    maps a module's path relative to ``package_dir`` (e.g. ``"show/viz.py"``) to
    its ``(validation_lines, code_lines)``, in sorted order.
    """
    root = Path(package_dir)
    if not root.is_dir():
        raise NotADirectoryError(f"no package directory {str(root)!r}")
    per_module = {
        path.relative_to(root).as_posix(): module_share(path) for path in sorted(root.rglob("*.py"))
    }
    validation = sum(v for v, _ in per_module.values())
    code = sum(c for _, c in per_module.values())
    return validation, code, per_module


def _share(validation: int, code: int) -> str:
    return f"{validation / code:.1%}" if code else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "package_dir", nargs="?", default=PACKAGE_DIR, help=f"default: {PACKAGE_DIR}"
    )
    args = parser.parse_args(argv)
    if not Path(args.package_dir).is_dir():
        parser.error(f"no package directory {str(args.package_dir)!r}")
    validation, code, per_module = validation_share(args.package_dir)
    print(f"Validation share of {Path(args.package_dir).resolve()}\n")
    print("| module | code lines | validation lines | share |")
    print("|---|---:|---:|---:|")
    for name, (v, c) in per_module.items():
        print(f"| {name} | {c} | {v} | {_share(v, c)} |")
    print(f"| **total** | **{code}** | **{validation}** | **{_share(validation, code)}** |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
