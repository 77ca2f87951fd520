"""Issue 44, item 3 (the issue's item 6): no raw TeX in what a reader sees.

On every page, once MathJax has typeset it: the text outside code, outputs and maths has
no TeX command (``\\frac``, ``\\texttt``, an escaped ``\\_``), and no text inside a formula
(MathJax's ``mtext``: ``\\text{...}``, ``\\texttt{...}``) shows a backslash, which is what
MathJax prints for ``\\_`` in text mode without its ``textmacros`` package (chapter 13 read
``1/√(query\\_pre\\_attn\\_scalar)``).
"""

from __future__ import annotations

import re

import pytest
from bookpages import PAGES, built_html

# Raw TeX a reader would see: a command of letters, or an escaped special character.
RAW_TEX = re.compile(r"\\(?:[A-Za-z]{2,}|[_%$&#{}])")

RAW_TEX_JS = """async () => {
    document.querySelectorAll('article details').forEach(d => d.open = true);
    const out = {text: [], math: []};
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
        await MathJax.startup.promise;
        for (const item of MathJax.startup.document.math) {
            if (!item.root) continue;
            item.root.walkTree(n => {
                if (n.isKind && n.isKind('mtext') && /\\\\/.test(n.getText())) {
                    out.math.push(String(item.math).slice(0, 80));
                }
            });
        }
    }
    const article = document.querySelector('article').cloneNode(true);
    article.querySelectorAll('pre, code, script, style, mjx-container, .math, .cell_output, '
        + '.cell_input, .highlight, .headerlink, .MathJax').forEach(e => e.remove());
    out.text = article.textContent;
    return out;
}"""


@pytest.mark.parametrize("page", PAGES)
def test_no_raw_tex_is_shown(loaded, page: str) -> None:
    if not built_html(page):
        pytest.skip(f"{page} not built")
    found = loaded(page).page.evaluate(RAW_TEX_JS)
    text = sorted({m.group(0) for m in RAW_TEX.finditer(found["text"])})
    contexts = [
        found["text"][max(0, m.start() - 30) : m.end() + 30].replace("\n", " ")
        for m in RAW_TEX.finditer(found["text"])
    ][:3]
    assert not text, f"{page}: raw TeX in the text: {text} ({contexts})"
    assert not found["math"], f"{page}: backslashes in formulas' text: {found['math'][:3]}"


def test_the_pattern_finds_raw_tex() -> None:
    assert RAW_TEX.findall(r"1/\sqrt{query\_pre} and \texttt{x}") == [r"\sqrt", r"\_", r"\texttt"]
    assert not RAW_TEX.findall("C:/path, a\\b, 50%")
