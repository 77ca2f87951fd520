"""Issue 44, item 1: the API reference's signatures as a reader sees them, against Python's.

Shared by test_browser_api.py and reading_report.py. Each signature (``dt.sig`` with an
``id`` naming the object) is read as the browser shows it (``innerText``) and compared with
what Sphinx writes for that object without the book's extension: ``inspect.signature`` as
``sphinx.util.inspect.stringify_signature`` spells it, without annotations (the book's
``autodoc_typehints: description`` puts them under the entry).
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

# Every signature of the page with parentheses: its id and its text as shown.
SIGNATURES_JS = """() => [...document.querySelectorAll('article dt.sig[id]')]
    .filter(dt => dt.querySelector('.sig-paren'))
    .map(dt => [dt.id, dt.innerText])"""


def resolve(dotted: str) -> Any:
    """The object a signature's id names (``attention_lib.masks.causal_mask``, a method)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        if 1 < i == len(parts):  # a package attribute shadows its submodule (paged_attention)
            shadow = getattr(importlib.import_module(".".join(parts[: i - 1])), parts[i - 1])
            obj = obj if inspect.ismodule(shadow) else shadow
        for name in parts[i:]:
            owner = obj
            obj = getattr(owner, name)
            if inspect.isclass(owner):
                static = inspect.getattr_static(owner, name)
                if inspect.isfunction(static):  # a method: shown without self
                    obj = _unbound(static)
        return obj
    raise ImportError(dotted)


def _unbound(func: Any) -> Any:
    """A method defined in a class, as autodoc shows it: without ``self``."""
    sig = inspect.signature(func)
    params = list(sig.parameters.values())[1:]

    def shown() -> None:  # pragma: no cover - only its signature is read
        pass

    shown.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    return shown


def expected(dotted: str) -> str:
    """The parameter list Sphinx writes for ``dotted``: ``q_len, k_len=None, *, offset=0``."""
    from sphinx.util.inspect import stringify_signature

    obj = resolve(dotted)
    sig = inspect.signature(obj)
    return stringify_signature(sig, show_annotation=False, show_return_annotation=False)[1:-1]


def shown(text: str) -> str:
    """The parameter list of a signature's text as shown (between its outer parentheses)."""
    text = " ".join(text.replace("\u00b6", "").split())
    start, end = text.find("("), text.rfind(")")
    inner = text[start + 1 : end]
    return re.sub(r"\s*,\s*", ", ", inner).strip()


def compare(signatures: list[list[str]]) -> tuple[int, list[str]]:
    """(number compared, the wrong ones as ``id: shown != expected``)."""
    wrong = []
    for ident, text in signatures:
        want = expected(ident)
        got = shown(text)
        if got != want:
            wrong.append(f"{ident}: {got!r} != {want!r}")
    return len(signatures), wrong
